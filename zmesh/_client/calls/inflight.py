"""Requests in flight and their fates: what a reply, a failure or a timeout settles.

A call to one proc is a ``OneRequest`` whose reply settles its future
directly (the fast path); a message to several procs is a ``Request`` that
collects one answer per target through its ``deliver`` callback. Both sit in
their connections' ``pending`` (``zmesh._client.calls.connections``) until answered,
timed out, or failed by supervision or a dropped connection. ``outcome`` and
``failure_error`` turn a ``Reply`` or ``Failure`` message into that fate.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import pickle
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import msgspec

from zmesh._errors import (
    ActorError,
    ActorStoppedError,
    CallTimeoutError,
    EncodeError,
    EndpointError,
    ResponsePortError,
    SecurityError,
    SpawnError,
    SupervisionError,
    ZmeshError,
)
from zmesh._wire import messages as w
from zmesh._wire.deadlines import CLOCK, budget

if TYPE_CHECKING:
    from zmesh._client.calls.connections import ProcConn
    from zmesh._client.calls.runtime import ProcRef
    from zmesh._wire.codec import Codec


class CallSpec(msgspec.Struct, gc=False):
    """One call of one endpoint, as its endpoint reference builds it once:
    what every transport it may take (``zmesh._client.calls.transport``:
    the runtime, a thread's lane, the tree) sends, in place of the seven
    values they passed along one by one.

    ``actor`` is the name the proc knows the actor by (``for_member`` makes
    the spec of one actor of several in its proc); ``deadline`` is on this
    process's ``time.monotonic`` clock (0: none), ``timeout`` the seconds it
    came from; ``block``: wait behind the in-flight limits, or fail at once.
    """

    actor: str
    method: str
    payload: w.Payload
    buffers: list[Any]
    deadline: float = 0.0
    timeout: float | None = None
    block: bool = True

    def for_member(self, actor: str) -> CallSpec:
        """The same call, addressed to ``actor`` (``name#k``, one of a group)."""
        return CallSpec(actor, self.method, self.payload, self.buffers, self.deadline,
                        self.timeout, self.block)  # fmt: skip

    def message_for(self, oneway: bool = False) -> Callable[[int], w.Call]:
        """The ``Call`` message with request id ``i``, as a fan-out sends it
        (``oneway``: no answer is wanted); its deadline is a budget, read when sent."""
        actor, method, payload, deadline = self.actor, self.method, self.payload, self.deadline
        return lambda i: w.Call(
            i, actor, method, payload, budget(deadline) if deadline else 0.0, oneway,
            sent=time.monotonic(), clock=CLOCK,
        )  # fmt: skip


# Where the answer of a single-target call goes: an asyncio future on the
# runtime's loop, or a concurrent future for a caller blocked in ``.get()``.
# Both are only ever settled from the runtime's loop; a concurrent future is
# marked running before its call is sent, so its caller cannot cancel it.
Sink: TypeAlias = asyncio.Future[Any] | concurrent.futures.Future[Any]


class OneRequest:
    """A call to one proc whose answer settles ``fut`` directly (the fast path).

    While it waits to be sent, a done ``fut`` (timed out, cancelled) means it
    is not sent at all.
    """

    __slots__ = ("actor", "conn", "fut", "id", "size", "timer")

    def __init__(self, req_id: int, conn: ProcConn, fut: Sink, size: int, actor: str = "") -> None:
        self.id = req_id
        self.conn = conn
        self.fut = fut
        self.size = size  # bytes, for a large message; else 0
        self.timer: asyncio.TimerHandle | None = None
        self.actor = actor  # whom a ``CancelCall`` names (zmesh._client.calls.cancels)


class Request:
    """One message sent to one or more procs, collecting their answers.

    ``deliver(index, ok, value)`` is called once per target: ``ok`` with the
    value, or not ok with the exception.
    """

    __slots__ = ("conns", "deliver", "id", "open", "queued", "size", "standing", "timer")

    def __init__(
        self, req_id: int, conns: list[ProcConn], deliver: Callable[[int, bool, Any], None]
    ) -> None:
        self.id = req_id
        self.conns = conns
        self.deliver = deliver
        self.open = len(conns)
        self.size = 0  # bytes, for a large message; else 0
        # Indexes of the conns where it waits to be sent (None: nowhere yet).
        self.queued: set[int] | None = None
        self.timer: asyncio.TimerHandle | None = None
        # Answered only when its actor dies (zmesh._client.control.actorwatch): no
        # call waits behind it, so a timeout's hint does not count it.
        self.standing = False


def resolve(fut: Sink, ok: bool, value: Any) -> None:
    """Settle ``fut`` with a value (``ok``) or an exception, unless it is done."""
    if fut.done():  # an asyncio future its caller cancelled
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


def settle(req: Request, index: int, ok: bool, value: Any) -> None:
    """Deliver the answer of ``req``'s target ``index``; its timer stops with the last."""
    req.open -= 1
    if req.open <= 0 and req.timer is not None:
        req.timer.cancel()
    req.deliver(index, ok, value)


def fail(req: Request | OneRequest, index: int, error: ZmeshError) -> None:
    """Fail ``req`` (its target ``index``, for a fan-out) with ``error``."""
    if isinstance(req, OneRequest):
        if req.timer is not None:
            req.timer.cancel()
        resolve(req.fut, False, error)
    else:
        settle(req, index, False, error)


def timeout_error(ref: ProcRef, timeout: float, hint: str = "") -> CallTimeoutError:
    """The error of a call to ``ref`` with no reply within ``timeout``; ``hint``
    says why the actor may be busy (``zmesh._client.calls.cancels.hint``)."""
    return CallTimeoutError(
        f"no reply within {timeout}s" + (f": {hint}" if hint else ""), mesh=ref.mesh,
        rank=ref.rank, host=ref.host, log_path=ref.log_path or None,
    )  # fmt: skip


def outcome(codec: Codec, msg: Any, frames: list[Any], ref: ProcRef) -> tuple[bool, Any]:
    """``(ok, value)`` of a ``Reply`` (its value) or a ``Failure`` (its error) from ``ref``."""
    if type(msg) is w.Reply:
        try:
            payload = msg.payload
            if payload.blob is None:  # plain: the value is right there
                return True, payload.args[0]
            return True, codec.unpack_value(payload, frames)
        except Exception as exc:
            return False, EncodeError(f"cannot decode reply: {exc!r}")
    return False, failure_error(msg, ref)


def failure_error(msg: w.Failure, ref: ProcRef) -> ZmeshError:
    """The exception for a ``Failure`` message from ``ref``'s proc."""
    ctx: dict[str, Any] = {
        "mesh": ref.mesh, "rank": ref.rank, "host": ref.host, "log_path": ref.log_path or None,
    }  # fmt: skip
    if msg.kind == "actor":
        cause = None
        if msg.exc is not None:
            try:
                cause = pickle.loads(msg.exc)
            except Exception:
                cause = None
        return ActorError(
            msg.type, msg.message, msg.traceback, endpoint=msg.endpoint, cause=cause, **ctx
        )
    if msg.kind == "spawn":
        err = SpawnError(f"actor __init__ raised {msg.type}: {msg.message}", **ctx)
        err.remote_traceback = msg.traceback  # type: ignore[attr-defined]
        return err
    if msg.kind == "endpoint":
        return EndpointError(f"endpoint {msg.endpoint!r}: {msg.message}", **ctx)
    if msg.kind == "encode":
        return EncodeError(msg.message, **ctx)
    if msg.kind == "port":  # (its type is the mistake: zmesh._host.proc.responseport)
        return ResponsePortError(msg.message, endpoint=msg.endpoint, mistake=msg.type, **ctx)
    if msg.kind == "deadline":
        return CallTimeoutError(f"{msg.endpoint!r}: {msg.message}", **ctx)
    if msg.kind == "denied":  # a spawn or stop in a proc of a mesh we do not own
        return SecurityError(msg.message, **ctx)
    if msg.kind == "failed":  # the actor died (zmesh._host.proc.actordeath)
        return SupervisionError(msg.message, reason=msg.type, **ctx)
    return ActorStoppedError(msg.message, **ctx)


# Abandoned calls remembered per connection, at most (the oldest go first):
# enough to say "behind N calls", bounded whatever a caller gives up on.
MAX_ABANDONED = 64


def abandon(abandoned: dict[int, tuple[str, float]], req: int, why: str) -> None:
    """Remember call ``req`` as given up on (``why``: "cancelled", "timed out")."""
    if len(abandoned) >= MAX_ABANDONED:
        del abandoned[next(iter(abandoned))]
    abandoned[req] = (why, time.monotonic())


def hint(abandoned: dict[int, tuple[str, float]], ahead: int) -> str:
    """Why a call may have timed out behind a busy actor: ``""`` when nothing says so.

    Args:
        abandoned: this caller's calls to the proc it gave up on, not answered yet.
        ahead: this caller's calls to the proc sent before it and not answered yet.
    """
    parts = []
    if abandoned:
        why, since = next(iter(abandoned.values()))
        parts.append(
            f"{len(abandoned)} earlier call(s) of this caller to this proc were given up on "
            f"(the oldest {why} {time.monotonic() - since:.1f}s ago) and have not ended: the "
            "actor may still be running one (a sync endpoint runs to its end even when cancelled)"
        )
    if ahead:
        parts.append(
            f"it was queued behind {ahead} earlier call(s) of this caller still unanswered "
            "(an actor runs one call at a time unless the endpoint is concurrent=True)"
        )
    return "; ".join(parts)


def ahead_of(pending: dict[int, Any], req: int) -> int:
    """How many calls in ``pending`` (in send order) were sent before ``req``, up to 1,000
    (a standing watch of its actor's death aside)."""
    n = 0
    for i, sent in pending.items():
        if i >= req or n >= 1000:
            break
        n += not getattr(sent, "standing", False)
    return n
