"""The fast path of a ``GroupCall``: idle actors' parts run at once, one reply encoded.

``zmesh._host.proc.actors.dispatch`` puts a ``Call`` in each targeted actor's
mailbox and catches each answer, encoded, at the router. For a plain async
endpoint (not a generator, batched, ``concurrent`` or port endpoint) that is
more than the call costs: a ``handle`` per actor, a ``Reply`` encoded per
actor, then the ``Gathered`` around them.

Here, each targeted actor that is idle (nothing queued, nothing running, its
mailbox task waiting for mail) runs its part right away, inside the socket's
reader, as the mailbox would have run it (``Mailbox.step``: the actor's task
and context), and its answer is kept as a ``Reply`` or ``Failure`` value. A
part that suspends is handed to the actor's mailbox task to finish, and the
actor is busy until it has, so its later mail waits behind it. An actor that
is busy already gets its part through its mailbox as before (its answer then
comes back encoded, through a ``Slot``). Either way each actor runs its
messages in arrival order; only the work around the call is shared. When the
last part is in, the ``Gathered`` is encoded once.

A plain sync endpoint runs the idle actors' parts one after the other in one
worker thread, in actor order, instead of a thread hand-off per actor, while
each part is short (``SYNC_SHARE_NS``; a longer one sends the rest to a
thread each, and later fan-outs to the mailboxes). Each of those actors is
held busy (``Mailbox.hold``) until its part is done, so its later mail waits
behind it. Parts not started ``SPREAD_AFTER`` s after the fan-out get a
thread each too: an actor blocked in its part (a long load, a wait for its
siblings) holds neither their parts nor their mail.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import msgspec

from zmesh._actor import Endpoint, set_current
from zmesh._host.proc import actordeath as _actordeath
from zmesh._host.proc import actors as _actors
from zmesh._shared.invoke import (
    BAD_ARGUMENTS,
    EXITED,
    RAISED,
    RETURNED,
    STOPPED,
    Outcome,
    Raised,
    count,
    invoke,
    invoke_sync,
    raised,
    returned,
)
from zmesh._shared.stats import _now_ns
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

if TYPE_CHECKING:
    from zmesh._host.proc.mailbox import Mailbox
    from zmesh._host.proc.procserver import ProcServer


# A sync endpoint's parts run one after the other in one worker thread while
# each takes less than this; once one takes longer, the rest get a thread each
# (so sleeps, I/O and GIL-free work overlap as they do through the mailboxes),
# and the endpoint's later fan-outs go through the mailboxes.
SYNC_SHARE_NS = 200_000
_slow: set[tuple[type, str]] = set()  # (class, sync endpoint) that took longer
# Parts of a sync fan-out that the shared thread has not started by then get
# a thread each (the part before them is long, or blocked).
SPREAD_AFTER = 0.005
# What ``actordeath.kills`` reads of a fast-path part's call: it has a caller.
_WITH_A_CALLER: Any = w.Call(0, "", "", w.Payload(()), oneway=False)


def endpoint_of(boxes: list[Mailbox | None], method: str) -> Endpoint[Any, Any] | None:
    """The group's endpoint ``method`` if the fast path can run it, else ``None``."""
    for box in boxes:
        if box is not None:
            ep = box.endpoints.get(method)
            if ep is None:
                return None
            info = ep.info
            if info.stream or info.batch or info.concurrent or info.port:
                return None
            if not info.is_async and (type(box.instance), method) in _slow:
                return None
            return ep
    return None


class FastGather:
    """The parts of one ``GroupCall``, as values (or encoded, from a mailbox); sent once."""

    __slots__ = ("bufs", "id", "ident", "left", "parts", "server")

    def __init__(self, server: ProcServer, ident: bytes, req_id: int, n: int) -> None:
        self.server = server
        self.ident = ident
        self.id = req_id
        self.parts: list[Any] = [None] * n  # Reply / Failure, or Raw from a mailbox
        self.bufs: list[list[Any]] | None = None  # buffer frames per part, if any has some
        self.left = n

    def _done(self, index: int, part: Any, bufs: list[Any] | None) -> None:
        if self.parts[index] is not None:
            return  # (answered once only)
        self.parts[index] = part
        if bufs:
            if self.bufs is None:
                self.bufs = [[] for _ in self.parts]
            self.bufs[index] = bufs
        self.left -= 1
        if self.left == 0:
            self._send()

    def put(self, index: int, frames: list[Any]) -> None:
        """Part ``index`` answered through its mailbox: ``[slot, envelope, *buffers]``."""
        self._done(index, msgspec.Raw(frames[1]), frames[2:])

    def reply(self, index: int, value: Any, method: str) -> None:
        """Part ``index`` returned ``value``."""
        try:
            payload, buffers = Codec.pack_value(value)
        except Exception as exc:
            why = f"return value of {method!r} cannot be sent: {exc}"
            self.fail(index, "encode", type(exc).__name__, why, method)
            return
        self._done(index, w.Reply(0, payload), buffers)

    def fail(self, index: int, kind: str, type_name: str, message: str, method: str) -> None:
        self._done(index, w.Failure(0, kind, type_name, message, endpoint=method), None)

    def raised(self, index: int, exc: BaseException, method: str) -> None:
        """Part ``index`` raised ``exc``: its own ``Failure``, as ``ProcServer`` builds it."""
        self._done(index, self.server.failure(0, "actor", exc, method), None)

    def _send(self) -> None:
        server = self.server
        codec = server.codec
        try:
            if self.bufs is None:
                # One encoding for every part (a mailbox's part is spliced in as it came).
                frames = codec.encode(w.Gathered(self.id, self.parts))
            else:
                raws = [p if type(p) is msgspec.Raw else msgspec.Raw(codec.encode(p)[0])
                        for p in self.parts]  # fmt: skip
                flat = [b for part in self.bufs for b in part]
                msg = w.GatheredFrames(self.id, raws, [len(b) for b in self.bufs])
                frames = codec.encode(msg, flat)
        except Exception as exc:  # too big for one message: the caller hears why
            f = w.Failure(self.id, "encode", type(exc).__name__,
                          f"the gathered answers cannot be sent: {exc}")  # fmt: skip
            frames = codec.encode(f)
        server.router.send([self.ident, *frames])


async def _part(
    gather: FastGather, index: int, box: Mailbox, ep: Endpoint[Any, Any], msg: w.GroupCall,
    args: tuple[Any, ...], kwargs: dict[str, Any],
) -> None:  # fmt: skip
    """One actor's part: ``ProcServer.handle`` for a plain async endpoint, answer kept."""
    method = msg.method
    set_current(request=msg.request)  # zmesh.current_request()
    counters = box.counters[method]
    t0 = counters.begin()
    try:  # (awaited here, in this frame: see zmesh._shared.invoke)
        result = await invoke(ep.fn, box.instance, args, kwargs)
    except BaseException as exc:
        out = raised(exc, counters, t0)
    else:
        out = returned(result, counters, t0)
    kind = out.kind
    if box.dead and (kind is RETURNED or kind is BAD_ARGUMENTS):  # it failed while this ran
        _dead(gather, index, box, method)
    elif kind is RETURNED:
        gather.reply(index, out.value, method)
    elif kind is BAD_ARGUMENTS:
        gather.fail(index, "endpoint", "TypeError", out.why, method)
    elif kind is STOPPED:  # the actor stops: no longer in flight, and not an error
        if box.stopped:  # its caller learns so now, not never
            gather.fail(index, "stopped", "ActorStopped", f"actor {box.name} stopped", method)
        raise out.value
    elif kind is EXITED:
        gather.raised(index, out.value, method)
        box.server._exit_for(out.value, f"endpoint {type(box.instance).__name__}.{method}")
    else:
        _raised(gather, index, box, out.value, method)


def _raised(gather: FastGather, index: int, box: Mailbox, exc: BaseException, method: str) -> None:
    """Part ``index``'s endpoint raised ``exc``: its caller's ``ActorError``, or, as
    on the mailbox path (``ProcServer._ended``), a ``BaseException`` that is no
    ``Exception`` kills the actor (``zmesh._host.proc.actordeath``), and its part
    fails with the death."""
    if not _actordeath.kills(box, exc, _WITH_A_CALLER, False):
        gather.raised(index, exc, method)
        return
    _actordeath.log.error("%s.%s raised", type(box.instance).__name__, method, exc_info=exc)
    _actordeath.kill(box.server, box, f"{type(exc).__name__}: {exc}")
    _dead(gather, index, box, method)


def _dead(gather: FastGather, index: int, box: Mailbox, method: str) -> None:
    """Part ``index`` is for a dead actor: it fails as the actor did
    (``actordeath.dead_reply``'s words), never runs, never returns a value."""
    why = f"Endpoint call {box.label}.{method}() failed, {box.dead}"
    gather.fail(index, _actordeath.KIND, "ActorFailed", why, method)


def dispatch(
    server: ProcServer, ident: bytes, msg: w.GroupCall, frames: list[Any],
    boxes: list[Mailbox | None], ep: Endpoint[Any, Any],
) -> None:  # fmt: skip
    """Run ``msg`` (a call, not oneway) on its actors: idle ones now, busy ones by mailbox."""
    if msg.deadline and time.monotonic() > msg.deadline:
        _actors.dispatch_mailboxes(server, ident, msg, frames, boxes)  # it answers "too late"
        return
    picks = msg.actors
    gather = FastGather(server, ident, msg.id, len(picks))
    try:
        args, kwargs = server.codec.unpack(msg.payload, frames)
    except Exception as exc:
        why = f"undecodable arguments: {exc}"
        for j, k in enumerate(picks):
            box = boxes[k] if k < len(boxes) else None
            if box is not None:  # counted as the mailbox path counts it
                c = box.counters[msg.method]
                c.end(c.begin(), 1)
            gather.fail(j, "endpoint", type(exc).__name__, why, msg.method)
        return
    call: w.Call | None = None  # for a busy actor's mailbox, made once if needed
    is_async = ep.info.is_async
    held: list[tuple[int, Mailbox]] = []  # a sync endpoint's idle actors, for one thread
    n = len(boxes)
    for j, k in enumerate(picks):
        box = boxes[k] if k < n else None
        if box is None:
            why = f"no actor {_actors.member(msg.actor, k)!r} here"
            gather.fail(j, "stopped", "ActorStopped", why, msg.method)
        elif box.dead:  # it failed: its part fails so, as its mailbox would answer
            _dead(gather, j, box, msg.method)
        elif box.waiter is not None and not box.busy and not box.queue:
            if is_async:
                box.step(_part(gather, j, box, ep, msg, args, kwargs), msg.method)
            else:
                # Busy until its part has run: later mail waits behind it.
                box.hold((gather, j, msg.method))
                held.append((j, box))
        else:
            # Busy: its part waits its turn behind what the actor has (per-actor order).
            if call is None:
                call = w.Call(0, msg.actor, msg.method, msg.payload, msg.deadline, False,
                              msg.request)  # fmt: skip
            to: Any = _actors.Slot(gather, j)  # (its answer goes to the gather)
            box.put(to, call, frames)
    if held:
        _run_sync(server, gather, held, ep, msg, args, kwargs)


def _run_sync(
    server: ProcServer, gather: FastGather, held: list[tuple[int, Mailbox]],
    ep: Endpoint[Any, Any], msg: w.GroupCall, args: tuple[Any, ...], kwargs: dict[str, Any],
    first: bool = True,
) -> None:  # fmt: skip
    """Run a sync endpoint for the ``held`` actors in one worker thread, in actor order."""
    method = msg.method
    if first:
        for _, box in held:
            box.counters[method].begin()
    todo = _Todo(held)
    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(server.pool, _invoke_all, ep.fn, todo, args, kwargs, msg.request)

    def spread() -> None:
        """The parts not started yet (still) get a thread each (still held)."""
        rest, long = todo.take_rest()
        if long and rest:  # one took long: later fan-outs of this endpoint go to the mailboxes
            _slow.add((type(held[0][1].instance), method))
        for part in rest:
            _run_sync(server, gather, [part], ep, msg, args, kwargs, first=False)

    timer = loop.call_later(SPREAD_AFTER, spread) if len(held) > 1 else None

    def done(fut: asyncio.Future[list[tuple[tuple[int, Mailbox], Outcome, int]]]) -> None:
        if timer is not None:
            timer.cancel()
        try:
            outcomes = fut.result()
        except BaseException as exc:  # the pool is gone (the proc ends): each part says so
            why = f"the endpoint could not run: {exc!r}"
            outcomes = [(part, Outcome(RAISED, RuntimeError(why)), 0)
                        for part in todo.take_rest()[0]]  # fmt: skip
        now = _now_ns()
        for (j, box), out, dt in outcomes:
            kind, value = out.kind, out.value
            count(box.counters[method], kind, now - dt)
            box.release()
            if box.dead and (kind is RETURNED or kind is BAD_ARGUMENTS):  # (as in _part)
                _dead(gather, j, box, method)
            elif kind is RETURNED:
                gather.reply(j, value, method)
            elif kind is BAD_ARGUMENTS:
                gather.fail(j, "endpoint", "TypeError", out.why, method)
            elif kind is EXITED:
                gather.raised(j, value, method)
                server._exit_for(value, f"endpoint {type(box.instance).__name__}.{method}")
            else:
                _raised(gather, j, box, value, method)
        spread()  # what the thread left after a long part, if the timer did not take it

    fut.add_done_callback(done)


class _Todo:
    """The parts of one sync fan-out not started yet, shared by its thread and the loop."""

    __slots__ = ("lock", "parts", "started")

    def __init__(self, parts: list[tuple[int, Mailbox]]) -> None:
        self.parts = deque(parts)
        self.lock = threading.Lock()
        self.started = 0  # when the part running in the thread started (ns; 0: none)

    def next(self) -> tuple[int, Mailbox] | None:
        """In the thread: the next part to run (``None``: none left, or taken away)."""
        with self.lock:
            if not self.parts:
                self.started = 0
                return None
            self.started = _now_ns()
            return self.parts.popleft()

    def take_rest(self) -> tuple[list[tuple[int, Mailbox]], bool]:
        """On the loop: the parts not started, and whether the running one took long."""
        with self.lock:
            rest, self.parts = list(self.parts), deque()
            long = bool(self.started) and _now_ns() - self.started > SYNC_SHARE_NS
        return rest, long


def _invoke_all(
    fn: Any, todo: _Todo, args: tuple[Any, ...], kwargs: dict[str, Any], request: str
) -> list[tuple[tuple[int, Mailbox], Outcome, int]]:
    """In a worker thread: ``fn`` on each part's actor in turn, in a copy of its
    context; ``(part, how it ended, nanoseconds)`` each (``handle`` does the
    same, per actor, with ``zmesh._shared.invoke``'s rules). It stops after a part that
    took longer than ``SYNC_SHARE_NS``, or when the loop took the parts left
    (``SPREAD_AFTER``)."""
    out: list[tuple[tuple[int, Mailbox], Outcome, int]] = []
    while (part := todo.next()) is not None:
        box = part[1]
        t0 = _now_ns()
        try:
            ctx = box.context.copy()  # type: ignore[union-attr]  # (idle: its task set it)
            ctx.run(set_current, None, None, request)  # zmesh.current_request()
            value = ctx.run(invoke_sync, fn, box.instance, args, kwargs)
            # (In this thread no task is cancelled: a CancelledError is the endpoint's.)
            if type(value) is Raised:
                end = raised(value.exc, in_task=False)
            else:
                end = returned(value)
        except Exception as exc:
            end = raised(exc, in_task=False)
        dt = _now_ns() - t0
        out.append((part, end, dt))
        if dt > SYNC_SHARE_NS:  # (``started`` stays set: take_rest sees it took long)
            break
    return out
