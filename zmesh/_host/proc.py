"""The actor process: one OS process hosting one or more actors.

Started by an agent as ``python -m zmesh._host.proc`` with its spec in the
``ZMESH_PROC`` variable. It binds a ROUTER for calls, says hello to its agent,
heartbeats from its event loop (so a hung loop is noticed), and runs each
actor's messages one at a time in arrival order. Sync endpoints run in worker
threads so the loop, and with it every other actor, keeps going.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import ctypes
import functools
import gc
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from asyncio.tasks import _enter_task, _leave_task
from collections import deque
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import zmq

from zmesh import _context
from zmesh._actor import Endpoint, Point, set_current
from zmesh._errors import SpawnError
from zmesh._host import lifecycle as _lifecycle
from zmesh._host import loopwatch as _loopwatch
from zmesh._host.batching import Batcher
from zmesh._host.generators import Producers
from zmesh._shared import stats as _stats
from zmesh._wire import excpickle as _excpickle
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.boundary import PROC_ENV_VAR, ProcEnv, decode_proc_env
from zmesh._wire.codec import NONE, Codec, explain, request_of
from zmesh._wire.zsock import AsyncSocket, configure

log = logging.getLogger("zmesh.proc")

PROC_HEARTBEAT_INTERVAL = 0.2
STATS_EVERY = 5  # heartbeats: statistics go to the agent about once a second
# Calls received and not started (queued in mailboxes, plus running
# ``concurrent`` ones), at most: past this the proc stops reading its socket
# until half have gone, so callers meet TCP backpressure instead of this
# process's memory growing without bound. Each caller also keeps at most
# zmesh._client.runtime.MAX_IN_FLIGHT calls in flight to one proc.
MAX_BACKLOG = int(os.environ.get("ZMESH_PROC_MAX_BACKLOG", "100000"))


class _BadArguments(Exception):
    pass


class _Mailbox:
    """One actor: its instance, its queue, and the task that drains it.

    An actor runs one message at a time, in arrival order. A message to a
    ``concurrent`` endpoint starts as soon as nothing queued is ahead of it,
    without waiting for the message in progress (it never overtakes one that
    is still queued).

    When the actor is idle and nothing is queued, a message starts at once,
    inside the socket's reader, as the mailbox task would run it (same
    current task, the actor's context). Most async endpoints finish without
    suspending and reply right there, which saves a task wake-up per
    message. One that suspends (and every sync endpoint, which goes to a
    worker thread) is handed to the mailbox task to finish, and the actor
    stays busy until it has.
    """

    def __init__(self, server: ProcServer, name: str, instance: Any, point: Point) -> None:
        self.server = server
        self.name = name
        self.instance = instance
        self.point = point
        self.queue: deque[tuple[bytes, w.Call, list[Any]]] = deque()
        # Set while the mailbox task waits for mail; put() resolves it.
        self.waiter: asyncio.Future[None] | None = None
        # An eagerly started message that suspended, for the task to finish:
        # (coroutine, what it yielded, an exception to throw into it first).
        self.handoff: tuple[Any, Any, BaseException | None] | None = None
        self.context: contextvars.Context | None = None  # the actor's, set by _run
        self.endpoints: dict[str, Endpoint[Any, Any]] = {}
        for klass in type(instance).__mro__:
            for attr, value in vars(klass).items():
                if isinstance(value, Endpoint) and attr not in self.endpoints:
                    self.endpoints[attr] = value
        self.counters = {n: _stats.EndpointCounters(n) for n in self.endpoints}
        # Batched endpoints' calls go to their batcher, not the mailbox.
        self.batchers = {
            n: Batcher(server, instance, ep, self.counters[n], None)
            for n, ep in self.endpoints.items()
            if ep.info.batch
        }
        self.queue_peak = 0
        self.busy = False
        self.running: set[asyncio.Task[None]] = set()
        self.task = asyncio.ensure_future(self._run())

    def put(self, ident: bytes, call: w.Call, frames: list[Any]) -> None:
        if self.batchers and call.method in self.batchers:
            self.batchers[call.method].add(ident, call, frames)
            return
        if not self.queue and self.context is not None:
            ep = self.endpoints.get(call.method)
            if ep is not None and ep.info.concurrent:
                # Nothing is ahead of it in arrival order, so it starts now,
                # even while a non-concurrent call is in progress.
                self._start_concurrent(ident, call, frames)
                return
            if self.waiter is not None and not self.busy and ep is not None:
                # A sync endpoint starts the same way: handle() hands it to a
                # worker thread and suspends, and the actor is busy from now.
                self._start(ident, call, frames)
                return
        self.queue.append((ident, call, frames))
        self.server.took()
        if len(self.queue) > self.queue_peak:
            self.queue_peak = len(self.queue)
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _start(self, ident: bytes, call: w.Call, frames: list[Any]) -> None:
        """Run a message up to its first suspension, now, as the mailbox task."""
        assert self.context is not None  # the task is waiting, so _run set it
        loop = self.task.get_loop()
        coro = self.server.handle(self, ident, call, frames)
        _enter_task(loop, self.task)  # asyncio.current_task() is the actor's task, as in _run
        try:
            yielded = self.context.run(coro.send, None)
        except StopIteration:
            return  # done, reply sent
        except Exception:
            log.exception("handling %s.%s failed", self.name, call.method)
            return
        finally:
            _leave_task(loop, self.task)
        # It awaits something: the mailbox task finishes it; later mail queues.
        self.busy = True
        self.handoff = (coro, yielded, None)
        self._wake()

    def _start_concurrent(self, ident: bytes, call: w.Call, frames: list[Any]) -> None:
        """Start a ``concurrent`` endpoint's message as a task of its own."""
        assert self.context is not None
        # The task copies the context current when it is made: the actor's.
        coro = self.server.handle(self, ident, call, frames)
        task = self.context.run(asyncio.ensure_future, coro)
        self.running.add(task)  # keep a reference until it ends
        self.server.took()
        task.add_done_callback(self._concurrent_done)

    def _concurrent_done(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        self.server.started()

    def statistics(self) -> _stats.ActorStatistics:
        """This actor's mailbox and endpoint counters, as a frozen record."""
        return _stats.actor_statistics(
            self.name, type(self.instance).__qualname__, self.counters.values(),
            (c.method for _, c, _ in self.queue), self.queue_peak,
        )  # fmt: skip

    async def _run(self) -> None:
        set_current(self.point, self.instance)
        _context.set_actor_name(self.name)  # current_actor_name(), context()
        self.context = contextvars.copy_context()
        for batcher in self.batchers.values():
            batcher.context = self.context
        loop = asyncio.get_running_loop()
        while True:
            if self.handoff is not None:
                coro, yielded, exc = self.handoff
                self.handoff = None
                try:
                    await _Resume(coro, self.context, yielded, exc)
                except GeneratorExit:
                    if not self._stepping():
                        raise  # this task is being closed
                    # A future the endpoint awaited failed with GeneratorExit:
                    # the task threw it here, and Python closed the endpoint
                    # on the way (which answered its call). The actor goes on.
                finally:
                    self.busy = False
                continue
            if not self.queue:
                self.waiter = loop.create_future()
                try:
                    await self.waiter
                except asyncio.CancelledError as cancel:
                    if self.handoff is None:
                        raise
                    # Cancelled (the actor stops, or the endpoint cancelled
                    # this task) before the handed-off message resumed: the
                    # message gets the cancellation, as it would have here.
                    self.handoff = (self.handoff[0], None, cancel)
                finally:
                    self.waiter = None
                continue
            ident, call, frames = self.queue.popleft()
            self.server.started()
            ep = self.endpoints.get(call.method)
            if ep is not None and ep.info.concurrent:
                self._start_concurrent(ident, call, frames)
            else:
                self.busy = True
                try:
                    await self.server.handle(self, ident, call, frames)
                except GeneratorExit:
                    if not self._stepping():
                        raise
                finally:
                    self.busy = False

    def _stepping(self) -> bool:
        """Whether this task is running now: a ``GeneratorExit`` that reaches
        ``_run`` then came from a failed future, not from closing the task."""
        loop = asyncio._get_running_loop()
        return loop is not None and asyncio.current_task(loop) is self.task

    def close(self) -> None:
        self.task.cancel()
        for batcher in self.batchers.values():
            batcher.close()
        pending = _lifecycle.cleanup(self.instance, None)  # __cleanup__, once
        if pending is not None:
            self.server.spawning.add(task := asyncio.ensure_future(pending))
            task.add_done_callback(self.server.spawning.discard)
        for ident, call, _ in self.queue:
            self.server.fail(ident, call, "stopped", "ActorStopped", f"actor {self.name} stopped")
            self.server.started()
        self.queue.clear()


class ProcServer:
    """Serves the actors of one proc."""

    def __init__(self, spec: ProcEnv) -> None:
        self.spec = spec
        self.mesh = spec.mesh
        self.rank = spec.rank
        self.generation = spec.generation
        self.host = spec.host
        self.actors: dict[str, _Mailbox] = {}
        self.codec = Codec(w.PROC_INBOX)
        self.dropped = 0
        self.late = 0
        self.backlog = 0  # see MAX_BACKLOG
        self.spawning: set[asyncio.Task[None]] = set()
        self.pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="zmesh-endpoint")
        self.sampler = _stats.ProcSampler()
        self.producers = Producers(self)  # generator endpoints' streams

    def statistics(self) -> _stats.ProcStatistics:
        """This proc (pid, CPU %, RSS, uptime) and its actors, as a frozen record."""
        cpu, rss, uptime = self.sampler.sample()
        return _stats.ProcStatistics(
            self.mesh, self.rank, self.generation, os.getpid(), time.time(), cpu, rss, uptime,
            self.dropped, self.late, [box.statistics() for box in list(self.actors.values())],
        )  # fmt: skip

    def _report_statistics(self) -> None:
        try:
            self.agent.send(self.codec.encode(w.ProcStats(self.statistics())))
        except Exception:  # statistics must never stop the heartbeats
            log.exception("cannot report statistics")

    async def serve(self) -> None:
        from zmesh._client import runtime as _runtime

        loop = asyncio.get_running_loop()
        # Handles passed to our actors call out through this loop.
        _runtime.set_home_loop(loop)
        _loopwatch.start(loop)  # warns when an async endpoint blocks the loop
        ctx: zmq.Context[Any] = zmq.Context.instance()
        # Where our agent tells us: an ipc:// path in its private directory,
        # or tcp://ADDR:* (CURVE and an allow-list when it has keys).
        bind = self.spec.bind
        keys = _security.active()
        gate = None
        if keys is not None and bind.startswith("tcp://"):
            gate = _security.Gate(ctx, keys)
        router = _security.secure_server(configure(ctx.socket(zmq.ROUTER), data=True), keys, bind)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.bind(bind)
        if bind.startswith("ipc://"):
            os.chmod(bind[len("ipc://") :], 0o600)
        self.addr = router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = AsyncSocket(router, loop, self._on_message, router=True, batch=True)
        _context.set_own_proc(
            _runtime.ProcRef(
                self.mesh, self.rank, self.generation, self.addr, self.spec.agent, self.host,
                self.spec.log_path,
            )
        )  # fmt: skip
        agent = _security.secure_client(configure(ctx.socket(zmq.DEALER)), keys, self.spec.agent)
        agent.connect(self.spec.agent)
        self.agent = AsyncSocket(agent, loop, None)
        self.agent.send(
            self.codec.encode(
                w.ProcHello(self.mesh, self.rank, self.generation, self.addr, os.getpid())
            )
        )
        beat = self.codec.encode(w.ProcHeartbeat(self.mesh, self.rank, self.generation))
        agent_pid = self.spec.agent_pid
        beats = 0
        while True:
            await asyncio.sleep(PROC_HEARTBEAT_INTERVAL)
            beats += 1
            if beats % STATS_EVERY == 1:
                self._report_statistics()
                if gate is not None:
                    gate.refresh()  # keys added to or removed from authorized/
            if agent_pid and os.getppid() != agent_pid:
                log.error("agent %s is gone; exiting", agent_pid)
                os._exit(70)
            self.agent.send(beat)

    # ------------------------------------------------------------ inbound

    def took(self) -> None:
        """A call joins the backlog; past ``MAX_BACKLOG`` reading stops."""
        self.backlog += 1
        if self.backlog >= MAX_BACKLOG and not self.router.paused:
            log.warning("%d calls waiting: reading stops until half have started", self.backlog)
            self.router.pause()

    def started(self) -> None:
        """A call leaves the backlog; reading resumes at half ``MAX_BACKLOG``."""
        self.backlog -= 1
        if self.router.paused and self.backlog <= MAX_BACKLOG // 2:
            self.router.resume()

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
        if isinstance(msg, w.Call | w.SpawnActor | w.StopActor) and not getattr(
            msg, "oneway", False
        ):
            what = f"{type(msg).__name__} failed in the proc: {exc!r}"
            f = w.Failure(msg.id, "endpoint", "ProcError", what)
            self.router.send([ident, *self.codec.encode(f)])

    def _dispatch(self, ident: bytes, msg: Any, frames: list[Any]) -> None:
        if isinstance(msg, w.Call):
            box = self.actors.get(msg.actor)
            if box is None:
                self.fail(ident, msg, "stopped", "ActorStopped", f"no actor {msg.actor!r} here")
            else:
                box.put(ident, msg, frames)
        elif isinstance(msg, w.SpawnActor):
            task = asyncio.ensure_future(self._spawn(ident, msg, frames))
            self.spawning.add(task)  # keep a reference until it ends
            task.add_done_callback(self.spawning.discard)
        elif isinstance(msg, w.StopActor):
            box = self.actors.pop(msg.actor, None)
            if box is not None:
                box.close()
            self.router.send([ident, *self.codec.encode(w.Reply(msg.id, NONE))])
        elif isinstance(msg, w.Credit | w.Cancel):
            self.producers.control(ident, msg)

    def _drop(self, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 1000 == 0:
            log.warning("dropped %d malformed message(s); latest: %s", self.dropped, why)

    async def _spawn(self, ident: bytes, msg: w.SpawnActor, frames: list[Any]) -> None:
        point = Point(msg.rank, dict(msg.dims))

        def build() -> Any:
            # Unpickling may import the user's modules, and __init__ may block
            # (loading a model): both run off the loop, so heartbeats go on.
            try:
                cls = pickle.loads(msg.cls)
                args, kwargs = self.codec.unpack(msg.payload, frames)
            except Exception as exc:
                raise SpawnError(
                    f"the proc cannot load the actor class or its arguments: {exc!r}"
                ) from exc
            instance = cls.__new__(cls)
            # Meshes spawned inside __init__ are owned (supervised) by this actor.
            set_current(actor=instance)
            instance.__init__(*args, **kwargs)
            return instance

        try:
            ctx = contextvars.copy_context()
            ctx.run(set_current, point)
            ctx.run(_context.set_actor_name, msg.actor)
            instance = await asyncio.get_running_loop().run_in_executor(
                self.pool, functools.partial(ctx.run, build)
            )
        except BaseException as exc:
            if _cancelled(exc):
                raise
            # SystemExit or any BaseException from __init__ fails the spawn
            # (the actor never started); the proc serves on.
            self._send_failure(ident, msg.id, "spawn", exc, "__init__")
            return
        old = self.actors.pop(msg.actor, None)
        if old is not None:
            old.close()
        self.actors[msg.actor] = _Mailbox(self, msg.actor, instance, point)
        if hasattr(instance, "__cleanup__"):
            _lifecycle.on_sigterm(self)  # its __cleanup__ runs when the agent stops us
        self.router.send([ident, *self.codec.encode(w.Reply(msg.id, NONE))])

    # ------------------------------------------------------------ handling

    async def handle(self, box: _Mailbox, ident: bytes, call: w.Call, frames: list[Any]) -> None:
        if call.deadline and time.time() > call.deadline:
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
            self.fail(ident, call, "endpoint", type(exc).__name__, f"undecodable arguments: {exc}")
            return
        fn = ep.fn
        set_current(request=call.request)  # zmesh.current_request(), for dedup by actors
        if ep.info.stream:  # a generator: its items stream back (zmesh._host.generators)
            await self.producers.run(box.instance, ident, call, ep, args, kwargs, counters)
            return
        t0 = counters.begin()
        try:
            if ep.info.is_async:
                result = await _invoke(fn, box.instance, args, kwargs)
            else:
                ctx = contextvars.copy_context()
                result = await asyncio.get_running_loop().run_in_executor(
                    self.pool, ctx.run, _invoke_sync, fn, box.instance, args, kwargs
                )
                if type(result) is _Raised:
                    raise result.exc
        except _BadArguments as exc:
            counters.end(t0, 1)
            cause = exc.__cause__
            self.fail(ident, call, "endpoint", "TypeError", f"bad arguments: {cause}")
            return
        except BaseException as exc:
            if _cancelled(exc):  # the actor stops: no longer in flight, and not an error
                counters.in_flight -= 1
                raise
            # Whatever the endpoint raised, an Exception or not (KeyboardInterrupt,
            # GeneratorExit, a user's BaseException), fails this call alone.
            counters.end(t0, 1)
            if not call.oneway:
                self._send_failure(ident, call.id, "actor", exc, call.method)
            else:
                log.error("oneway call %s raised", call.method, exc_info=exc)
            if isinstance(exc, SystemExit):
                self._exit_for(exc, f"endpoint {type(box.instance).__name__}.{call.method}")
            return
        counters.end(t0, 0)
        if call.oneway:
            return
        try:
            payload, buffers = Codec.pack_value(result)
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

    def fail(self, ident: bytes, call: w.Call, kind: str, type_name: str, message: str) -> None:
        if call.oneway:
            return
        f = w.Failure(call.id, kind, type_name, message, endpoint=call.method)
        self.router.send([ident, *self.codec.encode(f)])

    def _exit_for(self, exc: SystemExit, where: str) -> None:
        """``where`` raised ``SystemExit``: the proc exits as ``sys.exit`` asked.

        Its caller has its answer (``ActorError``); the agent then sees the
        proc exit unasked, so the owner sees the rank fail (``SupervisionError``,
        "exited with code N"), and every later call to it fails the same way.
        """
        code = _exit_code(exc)
        log.error("%s raised SystemExit(%r): this proc exits with code %d", where, exc.code, code)
        actors = [box.instance for box in self.actors.values()]
        task = asyncio.ensure_future(_lifecycle.cleanup_all(actors, exc))
        task.add_done_callback(lambda _: self._exit_now(code))
        self.spawning.add(task)

    def _exit_now(self, code: int) -> None:
        self.router.close()
        self.agent.close()
        # The answer is queued in libzmq: term() returns once the lingering
        # sockets are flushed, or never while sockets of others are open, so
        # it gets a bounded wait in a thread of its own.
        term = threading.Thread(target=zmq.Context.instance().term, daemon=True)
        term.start()
        term.join(0.5)
        exit_process(code)

    def _send_failure(self, ident: bytes, req: int, kind: str, exc: BaseException, ep: str) -> None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        blob = _excpickle.dumps(exc)  # None: it cannot come back, and is sent as text only
        qual = type(exc).__qualname__
        mod = type(exc).__module__
        name = qual if mod == "builtins" else f"{mod}.{qual}"
        f = w.Failure(req, kind, name, str(exc), tb, blob, endpoint=ep)
        self.router.send([ident, *self.codec.encode(f)])


class _Resume:
    """Finish ``coro``, which ``_Mailbox._start`` ran until it yielded ``yielded``.

    This is ``yield from`` (PEP 380) written out, so that every step of
    ``coro`` runs in the actor's ``context`` as its first step did; the
    awaiting task's sends and throws (a cancellation) pass through to it.
    ``throw``, when given, is thrown in first instead of waiting on ``yielded``.
    """

    __slots__ = ("context", "coro", "throw", "yielded")

    def __init__(
        self, coro: Any, context: contextvars.Context, yielded: Any, throw: BaseException | None
    ) -> None:
        self.coro = coro
        self.context = context
        self.yielded = yielded
        self.throw = throw

    def __await__(self) -> Generator[Any, Any, None]:
        coro, context, yielded, exc = self.coro, self.context, self.yielded, self.throw
        sent = None
        while True:
            if exc is None:
                try:
                    sent = yield yielded
                except GeneratorExit:
                    coro.close()
                    raise
                except BaseException as thrown:  # a cancellation: pass it on
                    exc = thrown
            try:
                if exc is None:
                    yielded = context.run(coro.send, sent)
                else:
                    yielded = context.run(coro.throw, exc)
            except StopIteration:
                return
            exc = None


def _cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is a real cancellation of the running task (the actor stops).

    A ``CancelledError`` an endpoint raises while its own task is not being
    cancelled (a task of the user's was) is the endpoint's error, not ours.
    """
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return cancelling is None or cancelling() > 0


def _exit_code(exc: SystemExit) -> int:
    """The exit status ``sys.exit(arg)`` means, as the interpreter reads it."""
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def exit_process(code: int) -> NoReturn:
    """Exit now as the interpreter would (atexit handlers, flushed output),
    without waiting for endpoint threads that may never return."""
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


class _Raised:
    """A ``BaseException`` a sync endpoint raised, carried back as a value."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _invoke_sync(fn: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``_invoke`` in a worker thread. A ``BaseException`` that is no
    ``Exception`` comes back as a value, raised again in ``handle``: through
    the future, the task would throw a ``GeneratorExit`` in as a close, and
    the asyncio machinery treats ``SystemExit`` and ``KeyboardInterrupt`` as
    its own."""
    try:
        return _invoke(fn, instance, args, kwargs)
    except Exception:
        raise
    except BaseException as exc:
        return _Raised(exc)


def _invoke(fn: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    try:
        return fn(instance, *args, **kwargs)
    except TypeError as exc:
        # No frame below this one: the call never entered the endpoint, so
        # the arguments did not fit its signature (not a user TypeError).
        tb = exc.__traceback__
        if tb is not None and tb.tb_next is None:
            raise _BadArguments() from exc
        raise


def _in_band(buf: Any) -> bool:
    return True


def _use_client_path(main: w.MainSpec) -> None:
    """Import the user's modules as the client does: its ``sys.path``.

    (The agent starts the proc in the client's working directory.) The
    client's script itself is not re-run: its classes come by value.
    """
    if main.sys_path:
        sys.path[:] = main.sys_path


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL us when the agent dies, so a proc is never orphaned."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main() -> None:
    spec = decode_proc_env(os.environ[PROC_ENV_VAR])
    _die_with_parent()
    if spec.agent_pid and os.getppid() != spec.agent_pid:
        os._exit(70)  # the agent died before prctl took effect
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {spec.mesh}[{spec.rank}] %(levelname)s %(message)s",
    )
    from zmesh._client import controller as _controller
    from zmesh._host import stacks as _stacks

    try:  # first, so that even a hang while importing the user's code can be shown
        _stacks.install(spec.log_path)  # SIGUSR1 dumps every thread's stack (zmesh stack)
    except OSError as exc:
        logging.warning("no stack dumps for this proc: %s", exc)

    _controller.ESCALATE_UNHANDLED = True  # an unhandled child failure fails this proc
    # The agent's keys are this host's keys. The procs of an ipc agent bind
    # no TCP, so they keep the keys their owner passed on, for its TCP peers.
    inherited = os.environ.get("ZMESH_KEYS") if spec.bind.startswith("ipc://") else None
    _security.use(spec.keys or inherited or None)
    if not os.environ.get("ZMESH_AGENTS"):
        # Meshes spawned by an actor go to this proc's own agent by default,
        # never to a private embedded agent of the proc.
        from zmesh._client import local as _local

        _local.configure([spec.agent])
    _use_client_path(spec.main)
    # What is loaded now lives as long as the proc: keep the collector off it.
    gc.freeze()
    server = ProcServer(spec)
    try:
        asyncio.run(server.serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
