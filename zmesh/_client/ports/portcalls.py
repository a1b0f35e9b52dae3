"""Calls answered through ports: explicit-response-port endpoints, and ``send``.

``explicit_call`` is ``call_one``/``call`` of an endpoint declared with
``explicit_response_port=True``: the endpoint gets a port, and what it sends
there is the answer. ``send`` is Monarch's fire-and-forget call, whose
answers (if a port is given) go to that port.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zmesh._actor import Answers
from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.connections import ProcConn
from zmesh._client.calls.future import Future
from zmesh._client.calls.inflight import Sink, resolve
from zmesh._client.calls.launch import least_loaded, on_runtime
from zmesh._client.calls.runtime import ProcRef, Runtime
from zmesh._client.calls.values import ValueMesh
from zmesh._client.ports.channels import Port, _open, _PortError
from zmesh._client.ports.portsockets import _server
from zmesh._errors import CallTimeoutError, ZmeshError
from zmesh._wire.codec import Codec

if TYPE_CHECKING:
    from zmesh._client.handles.adverbs import EndpointRef

log = logging.getLogger("zmesh.ports")

# Seconds an explicit-response-port call without a timeout waits, after its
# endpoint returned, before the log says no answer came yet (it waits on).
PATIENCE = 30.0


def explicit_call(ep: EndpointRef[Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                  whole: bool) -> Future[Any]:  # fmt: skip
    """``call_one`` (or ``call``, with ``whole``) of an explicit-response-port endpoint.

    The endpoint gets a port first; its first value (per actor, for ``call``:
    a ``ValueMesh``) is the answer. The call itself is answered too (with
    no value), so an endpoint that raises, or a proc that dies before it
    answered, fails the future as for any call, and one that misuses its
    port fails it with ``ResponsePortError`` (``zmesh._host.proc.responseport``).
    The proc keeps the port after its endpoint returned: if it dies before
    it answers (its connection fails), so does the call, with the same error
    as a call in flight. So it does if the port was handed on to another
    actor whose proc dies before the answer: that proc said it holds the
    port (``channels._PortHeld``). A timeout (``options(timeout=...)``)
    covers the wait on the port too; without one, the log says so once the
    endpoint has returned and no answer came for ``PATIENCE`` seconds.
    """

    mesh = ep._mesh
    refs, points, dims = mesh._refs, mesh.points(), mesh.sizes
    port, receiver = _open(once=not whole, ranked=True)
    payload, buffers = ep._pack((port, *args), kwargs)
    msg = ep._call_msg(payload)

    def start(rt: Runtime, fut: Sink) -> None:
        server = _server(rt)
        server.pinned[receiver._number] = receiver
        results: dict[int, Any] = {}
        ranks = [p.rank for p in points]
        returned: list[int] = []  # the actors whose endpoint returned (the call answered)
        timers: list[asyncio.TimerHandle] = []
        watched: list[tuple[ProcConn, Callable[[ZmeshError], None]]] = []
        where = f"{mesh.cls_name}.{ep._name}"
        mesh_name = refs[0].mesh if refs else None

        def settle(ok: bool, value: Any) -> None:
            for t in timers:
                t.cancel()
            for conn, watcher in watched:
                if watcher in conn.watchers:
                    conn.watchers.remove(watcher)
            server.forget(receiver._number)
            resolve(fut, ok, value)

        def expire() -> None:
            if not fut.done():
                why = f"no answer on the response port of {where} within {ep._timeout}s"
                settle(False, CallTimeoutError(why, mesh=mesh_name))

        def impatient() -> None:
            if not fut.done():
                log.warning(
                    "%s returned %.0f s ago without sending on its response port, which it "
                    "still holds: the call waits on (call it with .options(timeout=...) to "
                    "bound the wait)", where, PATIENCE,
                )  # fmt: skip

        def on_value(rank: int, value: Any) -> None:
            if fut.done():
                return
            if isinstance(value, _PortError):
                settle(False, value.exc)
            elif not whole:
                settle(True, value)
            else:
                if rank not in ranks or rank in results:  # sent from outside the actor
                    rank = next(r for r in ranks if r not in results)
                results[rank] = value
                if len(results) == len(ranks):
                    settle(True, ValueMesh(dims, points, [results[r] for r in ranks]))

        def answered(i: int, ok: bool, value: Any) -> None:
            if fut.done():
                return
            if not ok:
                settle(False, value)
                return
            returned.append(i)
            watch(i)
            if len(returned) == len(refs) and ep._timeout is None:
                timers.append(rt.loop.call_later(PATIENCE, impatient))

        def watch(i: int) -> None:
            # The endpoint returned and its proc holds the port: the proc's death
            # (its connection failing) fails the call, as it would a call in flight.
            def lost(error: ZmeshError) -> None:
                if not fut.done() and (not whole or ranks[i] not in results):
                    settle(False, error)

            on_death(refs[i], lost)

        def held(ref: ProcRef) -> None:
            # The port was handed on to the proc at ``ref``: its death before
            # the answer fails the call too (a holder may answer for several
            # actors of a ``call``, so it fails the whole call).
            if fut.done() or ref.addr in holders:
                return
            holders.add(ref.addr)

            def lost(error: ZmeshError) -> None:
                if not fut.done():
                    settle(False, error)

            on_death(ref, lost)

        def on_death(ref: ProcRef, lost: Callable[[ZmeshError], None]) -> None:
            conn = rt.conn(ref)
            if conn.broken is not None:
                lost(conn.broken)
            else:
                conn.watchers.append(lost)
                watched.append((conn, lost))

        holders: set[str] = set()
        receiver._listener = on_value
        receiver._on_held = held
        if not refs:
            settle(True, ValueMesh(dims, [], []))
            return
        if ep._timeout is not None:
            timers.append(rt.loop.call_later(ep._timeout, expire))
        rt.send(refs, msg, buffers, answered, ep._timeout, ep._block)

    return on_runtime(start, (mesh.proc_mesh, ep._name))


def send(
    endpoint: EndpointRef[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    port: Port[Any] | None = None,
    selection: str = "all",
) -> None:
    """Monarch's ``send``: call ``endpoint`` and do not wait.

    Args:
        port: where the answers go: each actor's return value is sent to it
            (an explicit-response-port endpoint gets it as its first argument
            instead). ``None``: the answers are dropped.
        selection: ``"all"`` the actors of the endpoint's mesh, or
            ``"choose"`` one of them, the least loaded.
    """

    if selection not in ("all", "choose"):
        raise ValueError(f"selection must be 'all' or 'choose', not {selection!r}")
    kwargs = kwargs or {}
    explicit = endpoint._answers is Answers.PORT
    payload, buffers = endpoint._pack((port, *args) if explicit else args, kwargs)
    oneway = port is None or explicit
    msg = endpoint._call_msg(payload, oneway=oneway)
    refs = endpoint._mesh._refs

    def start(rt: Runtime) -> None:
        targets = [least_loaded(rt, refs)] if selection == "choose" and refs else refs
        deliver = None if oneway or port is None else _reply_to(port, targets)
        rt.send(targets, msg, buffers, deliver, endpoint._timeout, endpoint._block)

    rt, home = _runtime.current()
    rt.dispatch(start, rt, here=home, targets=[r.addr for r in refs])


def _reply_to(port: Port[Any], targets: list[Any]) -> Callable[[int, bool, Any], None]:
    """A ``deliver`` for ``Runtime.send`` that sends each answer on to ``port``,
    as from the rank that answered."""

    def deliver(i: int, ok: bool, value: Any) -> None:
        try:
            payload, buffers = Codec.pack_value(value if ok else _PortError(value))
        except Exception as exc:
            log.error("an answer for a port cannot be sent: %r", exc)
            return
        port._send(payload, buffers, targets[i].rank)

    return deliver
