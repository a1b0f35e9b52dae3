"""The actor process: one OS process hosting one or more actors.

Started by an agent as ``python -m zmesh._host.proc.procserver`` with its spec in the
``ZMESH_PROC`` variable. It binds a ROUTER for calls, says hello to its agent,
heartbeats from its event loop (so a hung loop is noticed), and runs each
actor's messages one at a time in arrival order. Sync endpoints run in worker
threads so the loop, and with it every other actor, keeps going.

This module is the entry point (``main()``) and ``ProcServer``, the socket and
dispatch shell: a call is decoded, put in its actor's mailbox, run by
``handle`` and answered. Its parts: ``proclink.py`` serves (the sockets,
the backlog's bound, hello, heartbeats, statistics), ``procreplies.py``
builds failures and exits on ``SystemExit``. Around it: ``procboot.py`` sets the process up before
it serves, ``mailbox.py`` runs each actor's queue, ``spawnactor.py`` builds
actors, ``lifecycle.py`` ends them and the proc, and ``zmesh._shared.invoke``
calls an endpoint.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any

from zmesh._actor import set_call, set_current
from zmesh._client.calls.pending import NotReady
from zmesh._client.control import local as _local
from zmesh._host.proc import actordeath as _actordeath
from zmesh._host.proc import actors as _actors
from zmesh._host.proc import actorthread as _actorthread
from zmesh._host.proc import cancelling as _cancelling
from zmesh._host.proc import lifecycle as _lifecycle
from zmesh._host.proc import procboot as _procboot
from zmesh._host.proc import procsetup as _procsetup
from zmesh._host.proc import responseport as _responseport
from zmesh._host.proc import spawnactor as _spawnactor
from zmesh._host.proc.generators import Producers
from zmesh._host.proc.mailbox import Mailbox
from zmesh._host.proc.proclink import ProcLink
from zmesh._host.proc.procreplies import ProcReplies
from zmesh._host.proc.relay import RelayServer
from zmesh._shared import stats as _stats
from zmesh._shared.invoke import (
    ANSWERED,
    BAD_ARGUMENTS,
    CANCELLED,
    EXITED,
    RAISED,
    RETURNED,
    STOPPED,
    Outcome,
    Raised,
    Sent,
    invoke,
    invoke_sync,
    raised,
    returned,
)
from zmesh._shared.ownership import grant_of, same_secret
from zmesh._shared.workers import Workers
from zmesh._wire import deadlines as _deadlines
from zmesh._wire import messages as w
from zmesh._wire.boundary import ProcEnv
from zmesh._wire.codec import NONE, Codec, explain, request_of

log = logging.getLogger("zmesh.proc")


class ProcServer(ProcLink, ProcReplies):
    """Serves the actors of one proc."""

    def __init__(self, spec: ProcEnv, key: str = "") -> None:
        self.spec = spec
        # The mesh's key: what a SpawnActor or StopActor must carry (ownership.py).
        # Without one (a proc no agent started), our own derived key: only we have it.
        self.key = key or _local.mesh_proof(spec.mesh)
        self.grant = grant_of(self.key)  # what an actor its owner handed us to holds
        self.denied = 0  # requests refused for want of the key
        self.mesh = spec.mesh
        self.rank = spec.rank
        self.generation = spec.generation
        self.host = spec.host
        self.actors: dict[str, Mailbox] = {}
        # Groups of several actors of one spawn (zmesh._host.proc.actors): their
        # mailboxes by local index (None: its __init__ failed); each is in
        # ``actors`` too, as ``name#k``.
        self.groups: dict[str, list[Mailbox | None]] = {}
        self.codec = Codec(w.PROC_INBOX)
        self.dropped = 0
        self.late = 0
        self.cancels = 0  # calls their callers cancelled (zmesh._host.proc.cancelling)
        self.backlog = 0  # see MAX_BACKLOG (proclink.py)
        self.backlog_bytes = 0  # and MAX_BACKLOG_BYTES
        self.spawning: set[asyncio.Task[None]] = set()
        self.initializing = 0  # SpawnActors whose __init__ runs (statistics: Initializing)
        self.pool = Workers()  # grows as threads block (see zmesh._shared.workers)
        self.sampler = _stats.ProcSampler()
        self.producers = Producers(self)  # generator endpoints' streams
        self.relay: RelayServer | None = None  # made on the first tree fan-out message

    # ------------------------------------------------------------ inbound

    def _on_message(self, frames: list[Any]) -> int | None:
        if len(frames) < 2:
            self._drop("short message")
            return None
        ident = frames[0]
        body = frames[1:]
        try:
            msgs = self.codec.decode_frames(body)
        except Exception as exc:  # never fatal: count, log once, drop
            self._drop(repr(exc))
            req = request_of(body[0], w.PROC_REQUESTS)  # (never a batch's)
            if req is not None:  # its sender gets an answer, not a wait
                why = explain(req[0], exc)
                f = w.Failure(req[1], "endpoint", type(exc).__name__, why)
                self.router.send([ident, *self.codec.encode(f)])
            return None
        for msg in msgs:
            try:  # (a try costs nothing until it catches)
                self._dispatch(ident, msg, body)
            except Exception as exc:
                self._dispatch_failed(ident, msg, exc)
        return len(msgs)

    def _dispatch_failed(self, ident: bytes, msg: Any, exc: Exception) -> None:
        """A handler raised: log it and answer, so the socket's reader goes on."""
        log.error("handling %s failed", type(msg).__name__, exc_info=exc)
        if isinstance(msg, w.Call | w.SpawnActor | w.StopActor | w.GroupCall) and not getattr(
            msg, "oneway", False
        ):
            what = f"{type(msg).__name__} failed in the proc: {exc!r}"
            f = w.Failure(msg.id, "endpoint", "ProcError", what)
            self.router.send([ident, *self.codec.encode(f)])

    def _dispatch(self, ident: bytes, msg: Any, frames: list[Any]) -> None:
        if isinstance(msg, w.Call):
            if msg.deadline:  # a budget: a deadline on this proc's clock from now
                _deadlines.arrive(msg)
            elif msg.sent:
                _deadlines.transit(msg.clock, msg.sent)  # (it keeps the sender's clock offset)
            box = self.actors.get(msg.actor)
            if msg.method == _actordeath.WATCH:  # its spawner asks to hear of its death
                _actordeath.watch(self, ident, msg, box)
            elif box is None:
                self.fail(ident, msg, "stopped", "ActorStopped", f"no actor {msg.actor!r} here")
            else:
                box.put(ident, msg, frames)
        elif isinstance(msg, w.GroupCall):  # several actors of this proc at once
            if msg.deadline:
                _deadlines.arrive(msg)
            elif msg.sent:
                _deadlines.transit(msg.clock, msg.sent)
            _actors.dispatch(self, ident, msg, frames)
        elif isinstance(msg, w.SpawnActor):
            if not self._owned(ident, msg, "spawn actors into it"):
                return
            build = _actors.spawn if msg.count else _spawnactor.spawn
            task = asyncio.ensure_future(build(self, ident, msg, frames))
            self.spawning.add(task)  # keep a reference until it ends
            task.add_done_callback(self.spawning.discard)
            # Initializing from now until __init__ ends: said at once, both ways,
            # not at the next statistics (a second away).
            self.initializing += 1
            self._report_statistics()
            task.add_done_callback(self._initialized)
        elif isinstance(msg, w.StopActor):
            if not self._owned(ident, msg, "stop its actors"):
                return
            ending = _actors.stop(self, msg.actor)  # one actor, or every actor of a group
            reply = [ident, *self.codec.encode(w.Reply(msg.id, NONE))]
            _lifecycle.then(self, ending, lambda: self.router.send(reply))  # after __cleanup__
        elif isinstance(msg, w.Credit | w.Cancel):
            self.producers.control(ident, msg)
        elif isinstance(msg, w.CancelCall):
            _cancelling.cancel(self, ident, msg)
        elif isinstance(msg, w.Relay):  # this proc relays a tree fan-out (zmesh._host.proc.relay)
            if self.relay is None:
                self.relay = RelayServer(self)
            self.relay.handle(ident, msg, frames)

    def _initialized(self, _: asyncio.Task[None]) -> None:
        self.initializing -= 1
        self._report_statistics()

    def _owned(self, ident: bytes, msg: w.SpawnActor | w.StopActor, action: str) -> bool:
        """Whether ``msg`` carries our mesh's key; if not, its sender is told why."""
        if same_secret(self.key, msg.proof) or same_secret(self.grant, msg.proof):
            return True
        self.denied += 1
        if self.denied == 1 or self.denied % 1000 == 0:
            log.warning("refused %d request(s) from a client that does not own mesh %s; "
                        "latest: %s of actor %r", self.denied, self.mesh,
                        type(msg).__name__, msg.actor)  # fmt: skip
        why = (
            f"actor {msg.actor!r} in {self.mesh}[{self.rank}] on {self.host}: not the owner: "
            f"only the owner of mesh {self.mesh!r}, which created it, may {action}"
        )
        f = w.Failure(msg.id, "denied", "SecurityError", why)
        self.router.send([ident, *self.codec.encode(f)])
        return False

    def _drop(self, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 1000 == 0:
            log.warning("dropped %d malformed message(s); latest: %s", self.dropped, why)

    async def handle(self, box: Mailbox, ident: bytes, call: w.Call, frames: list[Any]) -> None:
        if call.deadline and time.monotonic() > call.deadline:
            # The caller gave up already (a request delivered late, e.g.
            # after a partition healed): running it now helps nobody.
            self.late += 1
            if not call.oneway:
                self.fail(ident, call, "deadline", "DeadlineExceeded", "request arrived too late")
            return
        ep = box.endpoints.get(call.method)
        if ep is None:
            names = ", ".join(sorted(box.endpoints)) or "none"
            self.fail(
                ident, call, "endpoint", "EndpointError",
                f"{type(box.instance).__name__} has no endpoint {call.method!r} "
                f"(endpoints: {names})",
            )  # fmt: skip
            return
        counters = box.counters[call.method]
        try:
            args, kwargs = self.codec.unpack(call.payload, frames)
        except Exception as exc:
            counters.end(counters.begin(), 1)
            # The receiving side's code raised (a __setstate__, an import): the
            # caller's ActorError, with its traceback, as in Monarch.
            self._send_failure(ident, call.id, "actor", exc, call.method)
            return
        set_current(request=call.request)  # zmesh.current_request(), for dedup by actors
        if ep.info.stream:  # a generator: its items stream back (zmesh._host.proc.generators)
            try:
                await self.producers.run(box.instance, ident, call, ep, args, kwargs, counters)
            except asyncio.CancelledError:
                self._stopped(box, ident, call)  # the stream ends: its reader is told why
                raise
            return
        guard = None
        if ep.info.port and not call.oneway and args:  # (a oneway's port is the sender's own)
            guard = _responseport.arm(args[0], ep, type(box.instance).__name__, self._where())
        # Its caller may cancel it while it runs (zmesh._host.proc.cancelling).
        key = (ident, call.id)
        is_async = ep.info.is_async
        run = box.active[key] = _cancelling.Running(asyncio.current_task(), is_async)
        t0 = counters.begin()
        try:  # (awaited here, in this frame: see zmesh._shared.invoke)
            if is_async:
                result = await invoke(ep.fn, box.instance, args, kwargs)
            else:
                result = await self._run_sync(box, ident, call, ep.fn, args, kwargs, run, guard)
                if type(result) is Raised:
                    raise result.exc
        except BaseException as exc:
            out = raised(exc, counters, t0, run, box)
        else:
            out = returned(result, counters, t0, run)
        box.active.pop(key, None)
        kind = out.kind
        if kind is not RETURNED:
            self._ended(box, ident, call, ep, out, run, guard)
            return
        result = out.value
        if type(result) is Sent:  # answered from the actor's thread
            self.router.recheck()  # (its send may have taken the edge of input)
            return
        if call.oneway:
            return
        if box.dead:  # the actor failed while this ran (unsupervised): so does its call
            return _actordeath.dead_reply(self, ident, call, box)
        if guard is not None:
            args = kwargs = ()  # type: ignore[assignment]  # (the port may be theirs alone)
            wrong = guard.returned(result)
            if wrong is not None:  # (a "port" failure's type says the mistake)
                counters.errors += 1
                self.fail(ident, call, "port", *wrong)
                return
        try:
            try:
                payload, buffers = Codec.pack_value(result)
            except NotReady as wait:  # it returns a mesh still spawning: it goes once up
                payload, buffers = await _once_spawned(result, wait)
            frames_out = self.codec.encode(w.Reply(call.id, payload), buffers)
        except Exception as exc:
            counters.errors += 1
            self.fail(
                ident, call, "encode", type(exc).__name__,
                f"return value of {call.method!r} cannot be sent: {exc}",
            )  # fmt: skip
            return
        try:
            self.router.send([ident, *frames_out])
        except Exception as exc:  # a buffer ZeroMQ cannot take: say so, never go silent
            self.fail(
                ident, call, "encode", type(exc).__name__,
                f"return value of {call.method!r} cannot be sent: {exc}",
            )  # fmt: skip

    def _run_sync(
        self, box: Mailbox, ident: bytes, call: w.Call, fn: Any, args: Any, kwargs: Any,
        run: _cancelling.Running, guard: Any,
    ) -> asyncio.Future[Any]:  # fmt: skip
        """Run a sync endpoint's call in its actor's own thread, else in the pool."""
        ctx = contextvars.copy_context()
        ctx.run(set_call, run)  # what zmesh.call_cancelled() reads
        if box.thread.free():  # the actor's own thread (zmesh._host.proc.actorthread)
            answer = _actorthread.answer(self.router, box, ident, call, run, guard)
            return box.thread.run(ctx.run, invoke_sync, fn, box.instance, args, kwargs,
                                  answer=answer)  # fmt: skip
        # Never behind it (a concurrent call, a health check), or too many.
        return asyncio.get_running_loop().run_in_executor(
            self.pool, ctx.run, invoke_sync, fn, box.instance, args, kwargs
        )

    def _ended(
        self, box: Mailbox, ident: bytes, call: w.Call, ep: Any, out: Outcome,
        run: _cancelling.Running, guard: Any,
    ) -> None:  # fmt: skip
        """``call`` did not return a result (``out`` says how it ended): answer it so."""
        kind, exc = out.kind, out.value
        if kind is ANSWERED:  # its actor's thread answered it; then the actor stopped
            raise exc
        if guard is not None:  # the error answers the call; a cancel or a stop does not
            guard.disarm(exc if kind is RAISED or kind is EXITED or kind is BAD_ARGUMENTS else None)
        if kind is BAD_ARGUMENTS:
            self.fail(ident, call, "endpoint", "TypeError", out.why)
        elif kind is CANCELLED:  # its caller cancelled it (or it ran to its end all the same)
            _cancelling.answer(self, ident, call, run)
        elif kind is STOPPED:  # the actor stops: its caller is told so, and the task ends
            self._stopped(box, ident, call)
            raise exc
        elif kind is EXITED:
            if not call.oneway:
                self._send_failure(ident, call.id, "actor", exc, call.method)
            self._exit_for(exc, f"endpoint {type(box.instance).__name__}.{call.method}")
        elif _actordeath.kills(box, exc, call, ep.info.port):
            # Nowhere for it to go (a broadcast, an explicit port), or not an
            # Exception: the actor dies, as in Monarch (zmesh._host.proc.actordeath).
            log.error("%s.%s raised", type(box.instance).__name__, call.method, exc_info=exc)
            _actordeath.kill(self, box, f"{type(exc).__name__}: {exc}")
            _actordeath.dead_reply(self, ident, call, box)  # (a oneway: nothing)
        elif box.dead and not call.oneway:  # the actor failed meanwhile (as above)
            _actordeath.dead_reply(self, ident, call, box)
        elif not call.oneway:  # an Exception with a caller: its ActorError
            self._send_failure(ident, call.id, "actor", exc, call.method)
        else:  # (survive_errors)
            log.error("oneway call %s raised", call.method, exc_info=exc)


async def _once_spawned(result: Any, wait: NotReady) -> tuple[w.Payload, list[Any]]:
    """Pack ``result`` once every mesh in it is up (Monarch returns such meshes);
    a spawn that failed makes the pack raise its error."""
    while True:
        await asyncio.wait([asyncio.wrap_future(wait.ready)])
        try:
            return Codec.pack_value(result)
        except NotReady as again:
            wait = again


def main() -> None:
    """Run this process as the proc ``ZMESH_PROC`` describes, until it is stopped."""
    spec = _procboot.boot()
    _procsetup.apply(spec)  # its CPUs and bootstrap, before any actor (zmesh._host.proc.procsetup)
    server = ProcServer(spec, _local.mesh_proof(spec.mesh))
    try:
        asyncio.run(server.serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
