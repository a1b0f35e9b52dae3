"""Adverbs: the ways to call an endpoint of a mesh.

``call`` (every actor, a ``ValueMesh``), ``call_one`` (exactly one actor),
``broadcast`` (every actor, no reply), ``choose`` (one actor, least loaded),
``stream`` (every actor, replies as they arrive).

Arguments are encoded once in the caller's thread (so a value that cannot be
sent raises ``EncodeError`` right there), and the message is encoded once
whatever the fan-out. A call on a mesh that is still spawning (or with such a
mesh in its arguments) waits in order in the mesh's gate (``zmesh._client.calls.pending``).
``call_one``, ``choose``, ``call`` and ``broadcast`` pick their exit in one
place, ``EndpointRef._send`` (its docstring has the table), and a built call
leaves by a transport (``zmesh._client.calls.transport``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from zmesh._actor import Answers
from zmesh._client.calls import grouping as _grouping
from zmesh._client.calls import lanes as _lanes
from zmesh._client.calls import pending as _pending
from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls import tree as _tree
from zmesh._client.calls.callfailure import for_call
from zmesh._client.calls.future import Future
from zmesh._client.calls.inflight import CallSpec, Sink
from zmesh._client.calls.launch import least_loaded, on_runtime
from zmesh._client.calls.pending import NotReady
from zmesh._client.calls.replies import Stream
from zmesh._client.calls.runtime import ProcRef, Runtime
from zmesh._client.calls.transport import Deliver, FansOut, Submits
from zmesh._client.calls.values import ValueMesh
from zmesh._client.control import grants as _grants
from zmesh._client.ports.portcalls import explicit_call
from zmesh._client.ports.streams import ItemStream, open_stream
from zmesh._errors import EncodeError, encode_error
from zmesh._shared.aio import running_loop
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec, check_size

if TYPE_CHECKING:
    from zmesh._client.calls.values import ValueMesh
    from zmesh._client.handles.mesh import ActorMesh

R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])
VALUE, STREAM, PORT = Answers
# Which adverb a call is, for the one dispatch (``EndpointRef._send``).
ONE, CHOOSE, ALL, BROADCAST = "call_one", "choose", "call", "broadcast"


def pack_call(
    name: str, proc_mesh: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[w.Payload, list[Any]]:
    """The arguments of a call to endpoint ``name`` of ``proc_mesh``, packed, or a clear
    ``EncodeError`` raised in the caller's thread before anything goes out."""
    before = _grants.sending_to(proc_mesh)
    try:
        payload, buffers = Codec.pack(args, kwargs)
    except NotReady:
        raise
    except Exception as exc:
        raise encode_error(
            f"arguments of {name!r} cannot be sent: {type(exc).__name__}: {exc}",
            exc,
            mesh=proc_mesh,
        ) from exc
    finally:
        _grants.sent(before)
    if buffers or payload.blob is not None:
        # Refused here, in the caller's thread, before anything goes out
        # (the runtime checks the encoded message again).
        try:
            check_size(payload, buffers)
        except EncodeError as exc:
            raise EncodeError(
                f"arguments of {name!r} cannot be sent: {exc.message}",
                mesh=proc_mesh,
            ) from exc
    return payload, buffers


def _fan_out(
    rt: Runtime, wide: bool, refs: list[ProcRef], spec: CallSpec, deliver: Deliver | None
) -> None:
    """Every actor's transport, on ``rt``'s loop: the tree for a wide mesh, else the runtime."""
    transport: FansOut[ProcRef] = _tree.of(rt) if wide else rt
    transport.fan_out(refs, spec, deliver)


def _deferrable(kind: str) -> Callable[[F], F]:
    """An adverb that waits in the mesh's gate while the mesh (or an argument) is not ready.

    The ready case costs one attribute test; everything else is in
    ``zmesh._client.calls.pending``.
    """

    def wrap(adverb: F) -> F:
        @functools.wraps(adverb)
        def gated(self: EndpointRef[Any], *args: Any, **kwargs: Any) -> Any:
            if self._mesh._gate is not None and not _pending.draining():
                return self._defer(adverb, kind, args, kwargs)
            try:
                return adverb(self, *args, **kwargs)
            except NotReady:  # a mesh in the arguments is still spawning
                if _pending.draining():
                    raise
                return self._defer(adverb, kind, args, kwargs)

        return gated  # type: ignore[return-value]

    return wrap


class EndpointRef(Generic[R]):
    """``mesh.endpoint``: the adverbs for one endpoint of one mesh (or slice)."""

    __slots__ = ("_answers", "_block", "_mesh", "_name", "_timeout", "_window")

    def __init__(
        self,
        mesh: ActorMesh[Any],
        name: str,
        timeout: float | None = None,
        block: bool = True,
        window: int | None = None,
    ) -> None:
        self._mesh = mesh
        self._name = name
        self._timeout = timeout
        self._block = block
        # How it answers (the mesh's ``modes``: a generator's window, or 0 for
        # an explicit response port), and a generator's window (else 0; see
        # zmesh._client.ports.streams).
        mode = (getattr(mesh, "modes", None) or {}).get(name)
        self._answers = VALUE if mode is None else STREAM if mode else PORT
        self._window = (window or mode) if mode else 0

    def options(
        self, *, timeout: float | None = None, block: bool = True, window: int | None = None
    ) -> EndpointRef[R]:
        """The same endpoint with per-call options.

        Args:
            timeout: seconds until the call fails with ``CallTimeoutError``.
                The request carries this deadline, and a proc that receives
                it too late does not run it. For a generator endpoint: how
                long the reader waits for each item.
            block: what a call does when this caller already has the limit of
                calls in flight to the proc (``ZMESH_MAX_IN_FLIGHT``, 10,000):
                wait its turn, in order (the default), or fail at once with
                ``OverloadedError`` (``block=False``).
            window: for a generator endpoint, how many items its producer
                may run ahead of this caller (default: the endpoint's own,
                64 unless ``@endpoint(window=...)`` says).
        """
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be a positive int, not {window!r}")
        return EndpointRef(self._mesh, self._name, timeout, block, window)

    def _defer(
        self, adverb: Callable[..., Any], kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        mesh = self._mesh
        n = len(mesh._shape.ranks)
        if adverb.__name__ == "call_one" and n != 1:
            raise ValueError(
                f"call_one() needs exactly one actor, but {mesh!r} has {n}; "
                "use call(), choose() or slice the mesh"
            )
        try:  # what cannot be sent fails here, at the call, as on the fast path
            self._pack(args, kwargs)
        except NotReady:
            pass
        return _pending.defer(
            mesh, lambda: adverb(self, *args, **kwargs), kind, (mesh.proc_mesh, self._name), mesh,
            self._timeout,
        )  # fmt: skip

    def _pack(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[w.Payload, list[Any]]:
        return pack_call(self._name, self._mesh.proc_mesh, args, kwargs)

    def _spec(self, payload: w.Payload, buffers: list[Any], actor: str = "") -> CallSpec:
        """This call, built once for whichever transport takes it (to ``actor``, if named)."""
        timeout = self._timeout
        deadline = time.monotonic() + timeout if timeout is not None else 0.0
        return CallSpec(actor or self._mesh.actor, self._name, payload, buffers, deadline,
                        timeout, self._block)  # fmt: skip

    def _call_msg(self, payload: w.Payload, oneway: bool = False) -> Callable[[int], w.Call]:
        """The ``Call`` of a fan-out with its own answers (a stream, a port, a reduction)."""
        return self._spec(payload, []).message_for(oneway)

    # ------------------------------------------------------------ adverbs

    def __call__(self, *args: Any, **kwargs: Any) -> Future[R]:
        """A direct call, ``await one.incr(1)``: ``call_one`` on a mesh of one actor.

        Raises:
            ValueError: at once, when the mesh is not exactly one actor
                (the error names ``call``, ``call_one`` and ``choose``).
        """
        n = len(self._mesh._shape.ranks)
        if n != 1:
            raise ValueError(
                f"{self._mesh!r} has {n} actors: a direct call needs exactly one. "
                f"Say which: mesh.{self._name}.call(...) (every actor), "
                f"mesh.{self._name}.choose(...) (the least loaded one), or "
                f"mesh.slice(...).{self._name}.call_one(...) (one you pick)"
            )
        return self.call_one(*args, **kwargs)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the one actor of this mesh; a future of its value.

        On a generator endpoint: an ``ItemStream`` of its items, read with
        ``async for`` or ``for`` (see docs/streams.md).

        Raises:
            ValueError: at once, before sending, when the mesh is not exactly
                one actor (slice it first).
            EncodeError: at once, when an argument cannot be sent.
        """
        # The gate of ``_deferrable("future")``, written out: the hottest
        # adverb saves a call frame (measured on the sync path).
        mesh = self._mesh
        if mesh._gate is not None and not _pending.draining():
            return self._defer(EndpointRef.call_one, "future", args, kwargs)
        refs = mesh._refs
        if len(refs) != 1:
            raise ValueError(
                f"call_one() needs exactly one actor, but {mesh!r} has {len(refs)}; "
                "use call(), choose() or slice the mesh"
            )
        try:
            if not self._answers and not kwargs and self._block and running_loop() is None:
                # A thread with no loop, the common call: on the thread's own
                # lane, in one step (zmesh._client.calls.lanes).
                sync = _lanes.call_one(self, refs[0], args)
                if sync is not None:
                    return sync
            return self._send(ONE, refs, args, kwargs)
        except NotReady:  # a mesh in the arguments is still spawning
            if _pending.draining():
                raise
            return self._defer(EndpointRef.call_one, "future", args, kwargs)

    def _stream(
        self, refs: list[ProcRef], args: tuple[Any, ...], kwargs: dict[str, Any], points: Any
    ) -> ItemStream[Any]:
        """A generator endpoint's items from ``refs`` (``(point, item)`` pairs with ``points``)."""
        payload, buffers = self._pack(args, kwargs)
        return open_stream(
            refs, self._mesh.actor, self._name, payload, buffers, window=self._window,
            timeout=self._timeout, block=self._block, points=points,
        )  # fmt: skip

    @_deferrable("future")
    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one actor of this mesh, the least loaded from this caller."""
        refs = self._mesh._refs
        if not refs:
            raise ValueError(f"{self._mesh!r} is empty")
        return self._send(CHOOSE, refs, args, kwargs)

    @_deferrable("future")
    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Call every actor; a future of their values as a ``ValueMesh``.

        The first failure (an ``ActorError``, ``SupervisionError``, ...) fails
        the whole future.

        On a generator endpoint: an ``ItemStream`` of ``(point, item)`` pairs
        from every actor, as they arrive (see ``zmesh._client.ports.streams``).
        """
        return self._send(ALL, self._mesh._refs, args, kwargs)

    @_deferrable("broadcast")
    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor and do not wait; errors are logged by the actors."""
        self._send(BROADCAST, self._mesh._refs, args, kwargs)

    def _send(
        self, how: str, refs: list[ProcRef], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """The one dispatch of ``call_one``, ``choose``, ``call`` and ``broadcast``
        (``how``): the exit this call leaves by.

        ======================================  =============================================
        the call                                its exit
        ======================================  =============================================
        the mesh, or a mesh in the arguments,   the mesh's gate, sent in order when ready
        is still spawning                       (``_defer``, before this: ``pending.defer``)
        the endpoint answers through a port     ``portcalls.explicit_call``
        a generator endpoint                    ``streams.open_stream``: its items
        one actor, on a loop                    the runtime: ``Runtime.submit``
        one actor, from a thread with no loop   its lane: ``Lane.submit`` (else the I/O thread)
        the least loaded actor                  picked on the runtime's loop: ``Runtime.call``
        every actor of a wide mesh              the tree: ``Tree.fan_out``, one per host
        every actor                             the runtime: ``Runtime.fan_out``
        ======================================  =============================================

        The transports are ``zmesh._client.calls.transport``'s. (``call_one``
        from a thread with no loop first tries the lane's one-step path,
        ``lanes.call_one``; ``broadcast`` sends to any endpoint, one-way.)
        """
        mesh = self._mesh
        answers = self._answers
        if answers and how is not BROADCAST:
            if answers is PORT:
                if how is CHOOSE:
                    raise TypeError(
                        f"{self._name!r} answers through a response port: use call_one() on "
                        "a slice, call(), or zmesh.send(..., selection='choose')"
                    )
                return explicit_call(self, args, kwargs, whole=how is ALL)
            if how is CHOOSE:  # a generator endpoint: the items of one rank's
                refs = [least_loaded(_runtime.current()[0], refs)]
            return self._stream(refs, args, kwargs, mesh.points() if how is ALL else None)
        payload, buffers = self._pack(args, kwargs)
        if how is ONE:  # the hot path: no closure and no task; the reply settles the future
            ref = refs[0]
            actor = mesh.actor if ref.index < 0 else _grouping.member(mesh.actor, ref)
            spec = self._spec(payload, buffers, actor)
            rt, here = _runtime.current()
            one: Submits[ProcRef] = rt if here else _lanes.lane(rt)
            fut = one.submit(ref, spec)
            fut._mesh = mesh
            return fut
        spec = self._spec(payload, buffers)
        about = (mesh.proc_mesh, self._name)
        if how is CHOOSE:

            def choose(rt: Runtime, fut: Sink) -> None:
                best = least_loaded(rt, refs)
                if best.index >= 0:  # one of several actors of its proc
                    _grouping.call(rt, best, spec, fut)
                    return
                rt.call(best, spec, fut)

            return on_runtime(choose, about, (r.addr for r in refs), mesh)
        wide = bool(refs) and _tree.wide(mesh)  # one message per host, through relays
        if how is BROADCAST:
            rt, here = _runtime.current()
            targets = (r.addr for r in refs)
            rt.dispatch(_fan_out, rt, wide, refs, spec, None, here=here, targets=targets)
            return None
        points = mesh.points()
        dims = mesh.sizes

        def call(rt: Runtime, fut: Sink) -> None:
            results: list[Any] = [None] * len(refs)
            remaining = len(refs)

            def deliver(i: int, ok: bool, value: Any) -> None:
                nonlocal remaining
                if fut.done():
                    return
                if not ok:
                    fut.set_exception(for_call(value, mesh, self._name))
                    return
                results[i] = value
                remaining -= 1
                if remaining == 0:
                    fut.set_result(ValueMesh(dims, points, results))

            if not refs:
                fut.set_result(ValueMesh(dims, [], []))
            else:
                _fan_out(rt, wide, refs, spec, deliver)

        return on_runtime(call, about, (r.addr for r in refs))

    @_deferrable("stream")
    def stream(self, *args: Any, **kwargs: Any) -> Stream[R]:
        """Call every actor; iterate over the values as they arrive.

        ``async for v in mesh.ep.stream(...)`` in asyncio, plain ``for`` in
        synchronous code. A failure is raised when it arrives.
        """
        payload, buffers = self._pack(args, kwargs)
        return Stream(self, self._call_msg(payload), buffers)

    def __repr__(self) -> str:
        return f"<endpoint {self._name} of {self._mesh!r}>"
