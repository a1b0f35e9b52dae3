"""Services: R replicas of an actor mesh behind one handle, self-healing.

``Cls.options(replicas=3, procs=2).as_service()`` spawns three actor meshes
and routes each request to one healthy replica. The orchestrator is this
class, living on the loop that made the service; it is driven by the
supervision stream, not by failed requests:

* a replica whose proc fails leaves the routing set the moment its event
  arrives (Forge finds dead replicas only when a request to them fails);
* requests queued on it, and those in flight on it, are re-sent to a healthy
  replica (at-least-once; ``@endpoint(retry=False)`` opts out), each keeping
  its request id so actors can deduplicate;
* the replica is respawned with exponential backoff, and after more than
  ``max_restarts`` restarts in ``restart_window`` seconds it stays down and
  the service reports DEGRADED (OTP's restart intensity);
* work is bounded: ``max_concurrent_requests`` in flight and ``max_queue``
  queued per replica; beyond that, ``ServiceOverloadedError`` at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from zmesh._actor import Actor, EndpointInfo, Options, endpoints_of
from zmesh._client import local as _local
from zmesh._client.adverbs import run_on, submit
from zmesh._client.controller import SupervisionEvent
from zmesh._client.future import Future
from zmesh._client.mesh import ActorMesh, spawn_owned_mesh, stop_procs
from zmesh._client.runtime import Runtime
from zmesh._errors import (
    ActorStoppedError,
    CallTimeoutError,
    EncodeError,
    EndpointError,
    ServiceError,
    ServiceOverloadedError,
    SpawnError,
    SupervisionError,
    ZmeshError,
)
from zmesh._service.endpoint import ServiceEndpoint
from zmesh._service.routing import (
    HEALTHY,
    LATENCY_WINDOW,
    RECOVERING,
    STOPPED,
    UNHEALTHY,
    ReplicaStatistics,
    ServiceConfig,
    ServiceStatistics,
    Session,
    make_router,
)
from zmesh._shared.stats import ServiceSummary
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

log = logging.getLogger("zmesh.service")
R = TypeVar("R")

# ------------------------------------------------------------ internals


class _Replica:
    def __init__(self, index: int) -> None:
        self.index = index
        self.state = RECOVERING
        self.mesh: ActorMesh[Any] | None = None
        self.generation = 0
        self.in_flight = 0
        self.queue: deque[_Request] = deque()
        self.completed = 0
        self.failed = 0
        self.retried = 0
        self.restarts = 0
        self.sent = 0
        self.sent_after_failure = 0
        self.last_failure = ""
        self.restart_times: deque[float] = deque()
        self.backoff_step = 0
        self.latencies: deque[tuple[float, float]] = deque(maxlen=20_000)
        self.listener: Callable[[SupervisionEvent], None] | None = None

    def has_room(self, cfg: ServiceConfig) -> bool:
        return self.in_flight < cfg.max_concurrent_requests or len(self.queue) < cfg.max_queue

    def statistics(self, with_latency: bool = False) -> ReplicaStatistics:
        p50 = p99 = None
        if with_latency:
            horizon = time.monotonic() - LATENCY_WINDOW
            # A snapshot first: statistics() may run on another thread (sync
            # code) while the loop appends, and iterating a deque that changes
            # raises RuntimeError.
            window = sorted(dt for t, dt in tuple(self.latencies) if t >= horizon)
            if window:
                p50 = window[len(window) // 2]
                p99 = window[min(len(window) - 1, int(len(window) * 0.99))]
        return ReplicaStatistics(
            self.index, self.state, self.generation, self.in_flight, len(self.queue),
            self.completed, self.failed, self.retried, self.restarts, self.sent,
            self.sent_after_failure, p50, p99, self.last_failure,
        )  # fmt: skip


class _Request:
    __slots__ = (
        "attempt",
        "buffers",
        "deadline",
        "done",
        "endpoint",
        "fut",
        "id",
        "on",
        "payload",
        "pinned",
        "retry",
        "sent_once",
        "session",
        "start",
        "timer",
    )

    def __init__(
        self,
        req_id: str,
        endpoint: str,
        payload: w.Payload,
        buffers: list[Any],
        deadline: float,
        fut: asyncio.Future[Any],
        retry: bool,
        session: Session | None,
        pinned: _Replica | None = None,
    ) -> None:
        self.id = req_id
        self.on: _Replica | None = None  # the replica of the attempt in flight
        self.endpoint = endpoint
        self.payload = payload
        self.buffers = buffers
        self.deadline = deadline  # loop time
        self.fut = fut
        self.retry = retry
        self.session = session
        self.pinned = pinned
        self.attempt: object | None = None  # the live send, if in flight
        self.done = False
        self.sent_once = False
        self.start = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None


# ------------------------------------------------------------ the service


class Service:
    """R replicas of an actor mesh behind one handle. Made by ``.as_service()``.

    Every endpoint of the class is an endpoint of the service, with
    ``call_one``/``route``, ``call``/``fanout`` and ``broadcast``.
    """

    def __init__(
        self,
        rt: Runtime,
        opts: Options[Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.rt = rt
        self.name = opts.name
        self.cls = opts.cls
        self.opts = opts
        self.config = ServiceConfig(**opts.service_config)
        self.router = make_router(self.config.router)
        self.endpoints: dict[str, EndpointInfo] = endpoints_of(opts.cls)
        self._args = args
        self._kwargs = kwargs
        self._replicas = [_Replica(i) for i in range(opts.replicas)]
        self._waiting: deque[_Request] = deque()  # no healthy replica yet
        # Anonymous sessions are weak: one nobody holds is forgotten.
        self._sessions: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
        self._named: dict[str, Session] = {}
        self._ids = itertools.count(1)
        self._tag = f"{self.name}-{id(self):x}"
        self._tasks: set[asyncio.Task[Any]] = set()
        self._spawning: set[asyncio.Task[None]] = set()  # respawns in progress
        self.completed = 0
        self.failed = 0
        self.retried = 0
        self.stopped = False

    # ------------------------------------------------------------ public face

    def __getattr__(self, name: str) -> ServiceEndpoint[Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self.endpoints:
            known = ", ".join(sorted(self.endpoints)) or "none"
            raise EndpointError(
                f"{self.cls.__qualname__} has no endpoint {name!r} (endpoints: {known})",
                mesh=self.name,
            )
        ep: ServiceEndpoint[Any] = ServiceEndpoint(self, name)
        self.__dict__[name] = ep
        return ep

    def __len__(self) -> int:
        return len(self._replicas)

    def replica(self, index: int) -> ActorMesh[Any] | None:
        """The actor mesh of replica ``index``'s current generation (``None`` while down)."""
        return self._replicas[index].mesh

    def session(self, session_id: str | None = None) -> Session:
        """A session: calls made inside ``with``/``async with`` it stay on one replica.

        A session with an id you chose is kept (``svc.session("user-42")``
        later is the same session); an anonymous one lives as long as you
        hold it.
        """
        if session_id is None:
            s = Session(self, f"s{next(self._ids)}")
            self._sessions[s.id] = s
            return s
        named = self._named.get(session_id) or self._sessions.get(session_id)
        if named is None:
            named = self._named[session_id] = Session(self, session_id)
        return named

    def statistics(self) -> ServiceStatistics:
        """Per-replica state and counters, and the service's state (OK/DEGRADED/DOWN)."""
        reps = [r.statistics(with_latency=True) for r in self._replicas]
        healthy = sum(r.state == HEALTHY for r in reps)
        if self.stopped:
            state = "STOPPED"
        elif healthy == len(reps):
            state = "OK"
        else:
            state = "DEGRADED" if healthy else "DOWN"
        return ServiceStatistics(
            self.name, state, reps, self.completed, self.failed, self.retried, len(self._waiting)
        )

    def stop(self) -> Future[None]:
        """Stop every replica; calls after it raise ``ActorStoppedError``."""
        return run_on(self.rt, lambda: self.rt.loop.create_task(self._stop()))

    def __repr__(self) -> str:
        return f"<Service {self.name} replicas={len(self._replicas)}>"

    # ------------------------------------------------------------ lifecycle

    async def _start(self) -> None:
        results = await asyncio.gather(
            *(self._spawn(r) for r in self._replicas), return_exceptions=True
        )
        errors = [e for e in results if isinstance(e, BaseException)]
        if errors:
            await self._stop()
            err = errors[0]
            if isinstance(err, ZmeshError):
                raise SpawnError(f"service {self.name}: a replica failed to start: {err}") from err
            raise err
        self._spawn_task(self._health_loop())
        self._spawn_task(self._report_loop())

    def _spawn_task(self, coro: Any) -> None:
        task = self.rt.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _spawn(self, rep: _Replica) -> None:
        mesh = await spawn_owned_mesh(
            self.rt, self.cls, self.opts.hosts, self.opts.procs,
            f"{self.name}-r{rep.index}", self._args, self._kwargs, self._placement(rep),
        )  # fmt: skip
        if self.stopped:
            await stop_procs(self.rt, mesh._refs)
            return
        rep.generation += 1
        rep.mesh = mesh
        rep.state = HEALTHY
        rep.sent = 0
        gen = rep.generation

        def on_failure(ev: SupervisionEvent) -> None:
            self._replica_failed(rep, gen, f"{ev.status.value}: {ev.reason} (rank {ev.rank})")

        rep.listener = on_failure
        self.rt.controller.listeners.setdefault(mesh.proc_mesh, []).append(on_failure)
        # A failure that happened between spawn and subscription is in the view.
        if mesh.state().status.failure:
            self._replica_failed(rep, gen, "failed while starting")
            return
        self._pump_waiting()

    def _placement(self, rep: _Replica) -> list[str] | None:
        """Agents for a replica: spread replicas over the configured agents,
        and keep a respawn off agents this client has lost (a partition)."""
        pool = _local.configured_agents()
        hosts = self.opts.hosts
        if pool is None or len(pool) <= hosts:
            return None  # the default placement (and its clear error if too few)
        start = (rep.index * hosts) % len(pool)
        rotated = pool[start:] + pool[:start]
        lost = {a.addr for a in self.rt.controller.agents.values() if a.lost}
        ordered = [a for a in rotated if a not in lost] + [a for a in rotated if a in lost]
        return ordered[:hosts]

    def _replica_failed(self, rep: _Replica, generation: int, reason: str) -> None:
        """Take a replica out of routing and start replacing it (once per generation)."""
        if rep.generation != generation or rep.state != HEALTHY or self.stopped:
            return
        log.warning("service %s replica %d failed: %s", self.name, rep.index, reason)
        rep.state = RECOVERING
        rep.last_failure = reason
        queued = list(rep.queue)
        rep.queue.clear()
        for req in queued:  # never sent: always safe to send elsewhere
            self._dispatch(req)
        self._spawn_task(self._recover(rep))

    async def _recover(self, rep: _Replica) -> None:
        old = rep.mesh
        if old is not None:
            if rep.listener is not None:
                listeners = self.rt.controller.listeners.get(old.proc_mesh, [])
                if rep.listener in listeners:
                    listeners.remove(rep.listener)
            # Stopping the whole replica fails what is still in flight on its
            # surviving ranks (at once, client-side), and those are re-sent.
            # The agent may be unreachable (a partition): do not wait for it.
            self._spawn_task(stop_procs(self.rt, old._refs))
        loop = self.rt.loop
        while not self.stopped:
            now = loop.time()
            while rep.restart_times and now - rep.restart_times[0] > self.config.restart_window:
                rep.restart_times.popleft()
            if len(rep.restart_times) >= self.config.max_restarts:
                rep.state = UNHEALTHY
                rep.mesh = None
                self._pump_waiting()  # if nothing can recover, waiting calls fail now
                log.error(
                    "service %s replica %d stays down: %d restarts within %.0fs",
                    self.name, rep.index, len(rep.restart_times), self.config.restart_window,
                )  # fmt: skip
                return
            delay = min(self.config.backoff_initial * 2**rep.backoff_step, self.config.backoff_max)
            await asyncio.sleep(delay)
            rep.restart_times.append(loop.time())
            rep.restarts += 1
            # Shielded: stop() cancels this task, and a spawn cancelled midway
            # would leave its procs running. stop() waits for it instead, and
            # _spawn stops what it made once it sees the service stopped.
            spawning = loop.create_task(self._spawn(rep))
            self._spawning.add(spawning)
            spawning.add_done_callback(self._spawning.discard)
            try:
                await asyncio.shield(spawning)
            except Exception as exc:
                rep.backoff_step += 1
                rep.last_failure = f"respawn failed: {exc}"
                log.warning("service %s replica %d: %s", self.name, rep.index, rep.last_failure)
                continue
            rep.backoff_step = 0 if rep.state == HEALTHY else rep.backoff_step + 1
            return

    async def _stop(self) -> None:
        self.stopped = True
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        # Respawns under way finish, then stop what they made (see _recover).
        await asyncio.gather(*self._spawning, return_exceptions=True)
        stopped = ActorStoppedError(f"service {self.name} was stopped", mesh=self.name)
        for req in list(self._waiting):
            self._finish(req, None, stopped)
        self._waiting.clear()
        for rep in self._replicas:
            for req in list(rep.queue):
                self._finish(req, None, stopped)
            rep.queue.clear()
            rep.state = STOPPED
            if rep.mesh is not None:
                await stop_procs(self.rt, rep.mesh._refs)

    async def _health_loop(self) -> None:
        if "__health__" not in self.endpoints:
            return
        while not self.stopped:
            await asyncio.sleep(self.config.health_interval)
            for rep in self._replicas:
                if rep.state == HEALTHY and rep.mesh is not None:
                    self._check_health(rep)

    async def _report_loop(self) -> None:
        """Tell the agents this service uses about its replica table (for ``zmesh top``)."""
        while not self.stopped:
            await asyncio.sleep(1.0)
            st = self.statistics()
            summary = ServiceSummary(
                name=self.name,
                healthy=sum(r.state == HEALTHY for r in st.replicas),
                desired=len(st.replicas),
                restarts=sum(r.restarts for r in st.replicas),
                last_failure=next((r.last_failure for r in st.replicas if r.last_failure), ""),
                state=st.state,
            )
            agents = {ref.agent for r in self._replicas if r.mesh for ref in r.mesh._refs}
            for addr in agents:
                self.rt.controller.agent(addr).client.send(w.ServiceReport(summary))

    def _check_health(self, rep: _Replica) -> None:
        mesh, gen = rep.mesh, rep.generation
        assert mesh is not None
        remaining = len(mesh._refs)

        def deliver(i: int, ok: bool, value: Any) -> None:
            nonlocal remaining
            remaining -= 1
            if not ok or value is False:
                why = f"health check failed: {value}" if not ok else "health check returned False"
                self._replica_failed(rep, gen, why)

        self.rt.send(
            mesh._refs,
            lambda i: w.Call(i, mesh.actor, "__health__", Codec.pack((), {})[0]),
            [],
            deliver,
            self.config.health_timeout,
        )

    # ------------------------------------------------------------ requests

    def _submit(
        self,
        endpoint: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
        session: Session | None,
        pinned: _Replica | None = None,
    ) -> asyncio.Future[Any]:
        """Make a request and dispatch it; runs on the service's loop."""
        try:
            payload, buffers = Codec.pack(args, kwargs)
        except Exception as exc:
            raise EncodeError(
                f"arguments of {endpoint!r} cannot be sent: {type(exc).__name__}: {exc}",
                mesh=self.name,
            ) from exc
        loop = self.rt.loop
        fut: asyncio.Future[Any] = loop.create_future()
        if self.stopped:
            fut.set_exception(ActorStoppedError(f"service {self.name} was stopped"))
            return fut
        limit = timeout if timeout is not None else self.config.request_timeout
        req = _Request(
            f"{self._tag}-{next(self._ids)}", endpoint, payload, buffers, loop.time() + limit,
            fut, self.endpoints[endpoint].retry, session, pinned,
        )  # fmt: skip
        req.timer = loop.call_at(req.deadline, self._expire, req, limit)
        self._dispatch(req)
        return fut

    def _dispatch(self, req: _Request) -> None:
        if req.done:
            return
        cfg = self.config
        rep = req.pinned
        if rep is not None:
            if rep.state != HEALTHY:
                self._finish(req, rep, SupervisionError(
                    f"replica {rep.index} of {self.name} is {rep.state}", mesh=self.name,
                ))  # fmt: skip
            else:
                self._send(rep, req)
            return
        healthy = [r for r in self._replicas if r.state == HEALTHY]
        if not healthy:
            if not any(r.state == RECOVERING for r in self._replicas):
                # Every replica stays down (restart limit): no recovery to wait for.
                self._finish(req, None, ServiceError(
                    f"service {self.name} is DOWN: every replica reached its restart limit",
                    mesh=self.name,
                ))  # fmt: skip
                return
            if len(self._waiting) >= cfg.max_queue * len(self._replicas):
                self._finish(req, None, self._overloaded())
            else:
                self._waiting.append(req)  # until a replica recovers or the deadline
            return
        target = None
        session = req.session
        if session is not None and session.replica is not None:
            bound = self._replicas[session.replica]
            if bound.state == HEALTHY:
                target = bound
            else:
                session.replica = None
                session.rebinds += 1
        if target is None:
            ready = [r for r in healthy if r.has_room(cfg)]
            if not ready:
                self._finish(req, None, self._overloaded())
                return
            pick = self.router.choose(
                [r.statistics() for r in ready], session.id if session is not None else None
            )
            target = next((r for r in ready if r.index == pick), ready[0])
            if session is not None:
                session.replica = target.index
        if target.in_flight < cfg.max_concurrent_requests:
            self._send(target, req)
        elif len(target.queue) < cfg.max_queue:
            target.queue.append(req)
        else:
            self._finish(req, None, self._overloaded())

    def _overloaded(self) -> ServiceOverloadedError:
        cfg = self.config
        return ServiceOverloadedError(
            f"service {self.name} is full: every healthy replica has "
            f"{cfg.max_concurrent_requests} requests in flight and {cfg.max_queue} queued",
            mesh=self.name,
        )

    def _send(self, rep: _Replica, req: _Request) -> None:
        mesh = rep.mesh
        assert mesh is not None
        loop = self.rt.loop
        remaining_time = req.deadline - loop.time()
        if remaining_time <= 0:
            self._finish(req, None, self._timeout_error(req))
            return
        attempt = object()
        req.attempt = attempt
        req.on = rep
        req.sent_once = True
        # The attempt holds one of the replica's in-flight slots until the
        # replica answers (or breaks), even if the caller stops waiting first:
        # the proc is still running it, so max_concurrent_requests must count it.
        holding = True
        rep.in_flight += 1
        rep.sent += 1
        if rep.state != HEALTHY:
            rep.sent_after_failure += 1
        gen = rep.generation
        refs = mesh._refs
        results: list[Any] = [None] * len(refs)
        remaining = len(refs)
        want = min(self.config.return_rank, len(refs) - 1)

        def free_slot() -> None:
            nonlocal holding
            if holding:
                holding = False
                rep.in_flight -= 1

        def deliver(i: int, ok: bool, value: Any) -> None:
            nonlocal remaining
            if req.attempt is not attempt:
                # The caller stopped waiting (its deadline passed): this is
                # the late answer, and the replica's slot is free only now.
                remaining -= 1
                if not ok or remaining <= 0:
                    free_slot()
                    self._pump(rep)
                return
            if ok:
                results[i] = value
                remaining -= 1
                if remaining:
                    return
                req.attempt = None
                free_slot()
                rep.completed += 1
                rep.latencies.append((time.monotonic(), time.monotonic() - req.start))
                self._finish(req, rep, None, results[want])
                self._pump(rep)
                return
            req.attempt = None
            free_slot()
            if isinstance(value, SupervisionError | ActorStoppedError):
                # The replica broke (or is being replaced): not the request's fault.
                self._replica_failed(rep, gen, str(value))
                # A fan-out request is pinned to its replica: re-sending it
                # elsewhere would give that replica's answer twice.
                if req.retry and req.pinned is None and not self.stopped:
                    rep.retried += 1
                    self.retried += 1
                    self._dispatch(req)
                else:
                    rep.failed += 1
                    self._finish(req, rep, value)
                return
            rep.failed += 1
            self._finish(req, rep, value)
            self._pump(rep)

        req_id = req.id
        actor, method, payload = mesh.actor, req.endpoint, req.payload
        deadline = time.time() + remaining_time
        # No client-side timeout on the send: _expire ends the request for
        # the caller at its deadline, and the proc skips it if it arrives late.
        self.rt.send(
            refs,
            lambda i: w.Call(i, actor, method, payload, deadline, False, req_id),
            req.buffers,
            deliver,
        )

    def _pump(self, rep: _Replica) -> None:
        while rep.queue and rep.in_flight < self.config.max_concurrent_requests:
            if rep.state != HEALTHY:
                return
            self._send(rep, rep.queue.popleft())

    def _pump_waiting(self) -> None:
        waiting, self._waiting = self._waiting, deque()
        for req in waiting:
            self._dispatch(req)

    def _timeout_error(self, req: _Request) -> ZmeshError:
        if not req.sent_once:
            return ServiceError(
                f"no healthy replica of {self.name} took {req.endpoint!r} before its timeout",
                mesh=self.name,
            )
        return CallTimeoutError(f"{req.endpoint!r} on {self.name} timed out", mesh=self.name)

    def _expire(self, req: _Request, limit: float) -> None:
        if req.done:
            return
        if req.attempt is not None:
            # In flight: the caller gets its timeout now; the replica keeps
            # the slot until it answers (see _send).
            req.attempt = None
            if req.on is not None:
                req.on.failed += 1
            self._finish(req, req.on, self._timeout_error(req))
            return
        for q in [self._waiting, *(r.queue for r in self._replicas)]:
            if req in q:
                q.remove(req)
        self._finish(req, None, self._timeout_error(req))

    def _finish(
        self, req: _Request, rep: _Replica | None, error: BaseException | None, value: Any = None
    ) -> None:
        if req.done:
            return
        req.done = True
        if req.timer is not None:
            req.timer.cancel()
        if error is None:
            self.completed += 1
            if not req.fut.done():
                req.fut.set_result(value)
        else:
            self.failed += 1
            if not req.fut.done():
                req.fut.set_exception(error)


def spawn_service(opts: Options[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``Cls.options(replicas=...).as_service(...)``: a future of the running ``Service``."""
    if not (isinstance(opts.cls, type) and issubclass(opts.cls, Actor)):
        raise TypeError(f"{opts.cls!r} is not a zmesh.Actor subclass")

    async def go(rt: Runtime) -> Service:
        svc = Service(rt, opts, args, kwargs)
        await svc._start()
        return svc

    return submit(go)
