"""Adverbs: the ways to call an endpoint of a mesh.

``call`` (every actor, a ``ValueMesh``), ``call_one`` (exactly one actor),
``broadcast`` (every actor, no reply), ``choose`` (one actor, least loaded),
``stream`` (every actor, replies as they arrive).

Arguments are encoded once in the caller's thread (so a value that cannot be
sent raises ``EncodeError`` right there), and the message is encoded once
whatever the fan-out. A call on a mesh that is still spawning (or with such a
mesh in its arguments) waits in order in the mesh's gate (``zmesh._client.pending``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from zmesh._client import pending as _pending
from zmesh._client import runtime as _runtime
from zmesh._client.future import Future
from zmesh._client.pending import NotReady
from zmesh._client.runtime import ProcRef, Runtime, Sink, resolve
from zmesh._errors import EncodeError
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec, check_size

if TYPE_CHECKING:
    from zmesh._client.mesh import ActorMesh
    from zmesh._client.values import ValueMesh

R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])
_rotation = itertools.count()


def _deferrable(kind: str) -> Callable[[F], F]:
    """An adverb that waits in the mesh's gate while the mesh (or an argument) is not ready.

    The ready case costs one attribute test; everything else is in
    ``zmesh._client.pending``.
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


def submit(work: Callable[[Runtime], Coroutine[Any, Any, R]]) -> Future[R]:
    """Run ``work(runtime)`` on the caller's runtime; a ``Future`` of its result."""
    rt, home = _runtime.current()
    if home:
        return Future(afut=rt.loop.create_task(work(rt)))
    return Future(cfut=asyncio.run_coroutine_threadsafe(work(rt), rt.loop))


def _on_runtime(
    start: Callable[[Runtime, Sink], None], about: tuple[ProcRef | str, str] | None = None
) -> Future[R]:
    """Run ``start(runtime, fut)`` on the caller's runtime; it settles ``fut``.

    On the runtime's own loop ``fut`` is an asyncio future. From another
    thread it is the ``concurrent.futures.Future`` that ``.get()`` waits on,
    settled straight from the loop: no asyncio future or callback between.
    """
    rt, home = _runtime.current()
    if home:
        afut: asyncio.Future[R] = rt.loop.create_future()
        start(rt, afut)
        return Future(afut=afut, about=about)

    # Send from a plain callback, not a task: callbacks run in the order they
    # were scheduled, so calls, broadcasts and streams from one thread go out
    # in the order the thread made them (a task would start one turn later
    # and be overtaken by a later broadcast).
    cfut: concurrent.futures.Future[R] = concurrent.futures.Future()

    def run() -> None:
        if not cfut.set_running_or_notify_cancel():
            return
        try:
            start(rt, cfut)
        except BaseException as exc:
            resolve(cfut, False, exc)

    rt.loop.call_soon_threadsafe(run)
    return Future(cfut=cfut, about=about)


class EndpointRef(Generic[R]):
    """``mesh.endpoint``: the adverbs for one endpoint of one mesh (or slice)."""

    __slots__ = ("_block", "_mesh", "_name", "_timeout")

    def __init__(
        self, mesh: ActorMesh[Any], name: str, timeout: float | None = None, block: bool = True
    ) -> None:
        self._mesh = mesh
        self._name = name
        self._timeout = timeout
        self._block = block

    def options(self, *, timeout: float | None = None, block: bool = True) -> EndpointRef[R]:
        """The same endpoint with per-call options.

        Args:
            timeout: seconds until the call fails with ``CallTimeoutError``.
                The request carries this deadline, and a proc that receives
                it too late does not run it.
            block: what a call does when this caller already has the limit of
                calls in flight to the proc (``ZMESH_MAX_IN_FLIGHT``, 10,000):
                wait its turn, in order (the default), or fail at once with
                ``OverloadedError`` (``block=False``).
        """
        return EndpointRef(self._mesh, self._name, timeout, block)

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
            mesh, lambda: adverb(self, *args, **kwargs), kind, (mesh.proc_mesh, self._name)
        )

    def _pack(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[w.Payload, list[Any]]:
        try:
            payload, buffers = Codec.pack(args, kwargs)
        except NotReady:
            raise
        except Exception as exc:
            raise EncodeError(
                f"arguments of {self._name!r} cannot be sent: {type(exc).__name__}: {exc}",
                mesh=self._mesh.proc_mesh,
            ) from exc
        if buffers or payload.blob is not None:
            # Refused here, in the caller's thread, before anything goes out
            # (the runtime checks the encoded message again).
            try:
                check_size(payload, buffers)
            except EncodeError as exc:
                raise EncodeError(
                    f"arguments of {self._name!r} cannot be sent: {exc.message}",
                    mesh=self._mesh.proc_mesh,
                ) from exc
        return payload, buffers

    def _call_msg(self, payload: w.Payload, oneway: bool = False) -> Callable[[int], w.Call]:
        deadline = time.time() + self._timeout if self._timeout is not None else 0.0
        actor, name = self._mesh.actor, self._name
        return lambda i: w.Call(i, actor, name, payload, deadline, oneway)

    # ------------------------------------------------------------ adverbs

    @_deferrable("future")
    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the one actor of this mesh; a future of its value.

        Raises:
            ValueError: at once, before sending, when the mesh is not exactly
                one actor (slice it first).
            EncodeError: at once, when an argument cannot be sent.
        """
        refs = self._mesh._refs
        if len(refs) != 1:
            raise ValueError(
                f"call_one() needs exactly one actor, but {self._mesh!r} has {len(refs)}; "
                "use call(), choose() or slice the mesh"
            )
        return self._one(refs[0], args, kwargs)

    @_deferrable("future")
    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one actor of this mesh, the least loaded from this caller."""
        refs = self._mesh._refs
        if not refs:
            raise ValueError(f"{self._mesh!r} is empty")
        payload, buffers = self._pack(args, kwargs)
        actor, name, timeout, block = self._mesh.actor, self._name, self._timeout, self._block
        deadline = time.time() + timeout if timeout is not None else 0.0

        def start(rt: Runtime, fut: Sink) -> None:
            best = _least_loaded(rt, refs)
            rt.call(best, actor, name, payload, buffers, deadline, fut, timeout, block)

        return _on_runtime(start, (self._mesh.proc_mesh, name))

    def _one(self, ref: ProcRef, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[R]:
        # The hot path: no closure and no task; the reply settles the future.
        payload, buffers = self._pack(args, kwargs)
        timeout = self._timeout
        deadline = time.time() + timeout if timeout is not None else 0.0
        rt, home = _runtime.current()
        if home:
            fut: asyncio.Future[R] = rt.loop.create_future()
            rt.call(
                ref, self._mesh.actor, self._name, payload, buffers, deadline, fut, timeout,
                self._block,
            )  # fmt: skip
            return Future(afut=fut, about=(ref, self._name))
        # From another thread: one callback on the runtime's loop, scheduled
        # in call order like every other adverb (see _on_runtime).
        cfut: concurrent.futures.Future[R] = concurrent.futures.Future()
        rt.loop.call_soon_threadsafe(
            rt.call_threadsafe, ref, self._mesh.actor, self._name, payload, buffers, deadline,
            cfut, timeout, self._block,
        )  # fmt: skip
        return Future(cfut=cfut, about=(ref, self._name))

    @_deferrable("future")
    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Call every actor; a future of their values as a ``ValueMesh``.

        The first failure (an ``ActorError``, ``SupervisionError``, ...) fails
        the whole future.
        """
        from zmesh._client.values import ValueMesh

        mesh = self._mesh
        refs = mesh._refs
        payload, buffers = self._pack(args, kwargs)
        msg = self._call_msg(payload)
        points = mesh.points()
        dims = mesh.sizes

        def start(rt: Runtime, fut: Sink) -> None:
            results: list[Any] = [None] * len(refs)
            remaining = len(refs)

            def deliver(i: int, ok: bool, value: Any) -> None:
                nonlocal remaining
                if fut.done():
                    return
                if not ok:
                    fut.set_exception(value)
                    return
                results[i] = value
                remaining -= 1
                if remaining == 0:
                    fut.set_result(ValueMesh(dims, points, results))

            if not refs:
                fut.set_result(ValueMesh(dims, [], []))
            else:
                rt.send(refs, msg, buffers, deliver, self._timeout, self._block)

        return _on_runtime(start, (self._mesh.proc_mesh, self._name))

    @_deferrable("broadcast")
    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor and do not wait; errors are logged by the actors."""
        payload, buffers = self._pack(args, kwargs)
        msg = self._call_msg(payload, oneway=True)
        refs = self._mesh._refs
        rt, home = _runtime.current()
        if home:
            rt.send(refs, msg, buffers, None)
        else:
            rt.loop.call_soon_threadsafe(rt.send, refs, msg, buffers, None)

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


def _least_loaded(rt: Runtime, refs: list[Any]) -> Any:
    start = next(_rotation) % len(refs)  # rotate among equals
    best, load = None, None
    for k in range(len(refs)):
        ref = refs[(start + k) % len(refs)]
        c = rt.conns.get(ref.addr)
        if c is not None and c.broken is not None:
            continue
        n = c.inflight if c is not None else 0
        if load is None or n < load:
            best, load = ref, n
    return best if best is not None else refs[start]


class Stream(Generic[R]):
    """Replies of a fan-out, as they arrive. Iterate it sync or async.

    The request goes out when the stream is made (like every adverb, so it
    keeps its place in send order), not when iteration begins.

    A stream can be iterated more than once, as a list can: a later pass
    replays the replies that arrived so far, in arrival order, then waits
    for the rest. A failure ends every pass at the same place, raising the
    same error again. (Python's one-shot iterators would hand a second pass
    nothing, which reads as "no replies"; a hang would be worse.)
    """

    def __init__(self, ref: EndpointRef[R], msg: Callable[[int], w.Call], buffers: list[Any]):
        self._n = len(ref._mesh._refs)
        # (ok, value) per reply, in arrival order: what every pass replays.
        self._seen: list[tuple[bool, Any]] = []
        refs, timeout = ref._mesh._refs, ref._timeout
        rt, home = _runtime.current()
        # A stream plain code made while its mesh spawned is sent later, from the loop.
        plain = not home or _pending.for_plain_code()
        self._loop = rt.loop if not plain else None
        self._aq: asyncio.Queue[tuple[int, bool, Any]] | None = None
        self._sq: queue.SimpleQueue[tuple[int, bool, Any]] | None = None
        self._lock = threading.Lock()  # plain code: passes in several threads
        if not plain:
            aq = self._aq = asyncio.Queue()
            rt.send(refs, msg, buffers, lambda i, ok, v: aq.put_nowait((i, ok, v)), timeout)
        else:
            sq = self._sq = queue.SimpleQueue()
            put: Callable[[int, bool, Any], None] = lambda i, ok, v: sq.put((i, ok, v))  # noqa: E731
            if home:
                rt.send(refs, msg, buffers, put, timeout)
            else:
                rt.loop.call_soon_threadsafe(rt.send, refs, msg, buffers, put, timeout)

    async def __aiter__(self) -> AsyncIterator[R]:
        loop = asyncio.get_running_loop()
        if self._aq is not None and loop is not self._loop:
            raise RuntimeError("iterate a stream in the event loop that made it")
        i = 0
        while i < self._n:
            if self._aq is None:  # made in plain code, iterated in a loop
                ok, value = await loop.run_in_executor(None, self._pull, i)
            else:
                while i >= len(self._seen):
                    _, ok, value = await self._aq.get()
                    self._seen.append((ok, value))
                ok, value = self._seen[i]
            if not ok:
                raise value
            i += 1
            yield value

    def __iter__(self) -> Iterator[R]:
        if self._sq is None:
            raise RuntimeError("a stream made inside an event loop is iterated with 'async for'")
        i = 0
        while i < self._n:
            ok, value = self._pull(i)
            if not ok:
                raise value
            i += 1
            yield value

    def _pull(self, i: int) -> tuple[bool, Any]:
        """Reply ``i`` of a stream made in plain code, waiting for it if need be."""
        assert self._sq is not None
        with self._lock:  # passes in several threads take replies one at a time
            while i >= len(self._seen):
                _, ok, value = self._sq.get()
                self._seen.append((ok, value))
            return self._seen[i]
