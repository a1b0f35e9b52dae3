"""The replica supervisor: spawn, replace, give up, check health, report.

It runs on the runtime's I/O loop of the process that made the service, so
the service lives as long as that process (not as long as the event loop
that created it). It owns the replicas' procs; the ``ServiceClient`` beside
it routes the calls. When the dispatcher decides a replica generation failed
(from its agent's supervision event, a failed request or a health check),
the supervisor stops what is left of it and respawns it with exponential
backoff; after more than ``max_restarts`` restarts within ``restart_window``
seconds the replica stays down (OTP's restart intensity).

Its replicas' health checks are ``health.py``'s. On every change of the
replica table it pushes the table to the clients of the service in this
process (one per event loop that calls it); once a second, and at once on
every change, it reports the table to the agents the service uses
(``ServiceReport``): ``zmesh top`` shows it, and handles of the service in
other processes follow it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from zmesh._actor import endpoints_of, own_proc
from zmesh._client.calls.runtime import Runtime
from zmesh._client.control import local as _local
from zmesh._client.control.spawning import spawn_owned_mesh
from zmesh._client.control.stopping import stop_procs
from zmesh._client.handles.mesh import ActorMesh
from zmesh._errors import (
    SpawnError,
    ZmeshError,
)
from zmesh._service.client import ServiceClient, encode_table
from zmesh._service.health import ReplicaHealth
from zmesh._service.routing import HEALTHY
from zmesh._shared.aio import running_loop
from zmesh._shared.state import service_state
from zmesh._shared.stats import ServiceSummary
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._options import Options

log = logging.getLogger("zmesh.service")
REPORT_INTERVAL = 1.0


class Supervisor:
    """Keeps ``opts.replicas`` replicas of ``opts.cls`` running for ``client``."""

    def __init__(
        self,
        rt: Runtime,
        client: ServiceClient,
        opts: Options[Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        service_id: str,
    ) -> None:
        self.rt = rt
        self.client = client
        self.opts = opts
        self.name = opts.name
        self.service_id = service_id
        self.config = client.dispatcher.config
        # Endpoints that run one request at a time whatever the service allows.
        self._serial = sorted(
            n
            for n, e in endpoints_of(opts.cls).items()
            if not (e.concurrent or e.batch or n.startswith("_"))
        )
        self._args = args
        self._kwargs = kwargs
        n = opts.replicas
        self._generations = [0] * n  # the last generation spawned, per replica
        self._restart_times: list[deque[float]] = [deque() for _ in range(n)]
        self._backoff = [0] * n
        self._tasks: set[asyncio.Task[Any]] = set()
        self._spawning: set[asyncio.Task[None]] = set()  # respawns in progress
        self._agents: set[str] = set()  # every agent the service used: they get reports
        # Clients of the service on other loops of this process, fed on each change.
        self._attached: weakref.WeakSet[ServiceClient] = weakref.WeakSet()
        self.stopped = False
        self.health = ReplicaHealth(self)
        client.on_failure = self._failed

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Spawn every replica; on any failure stop them all and raise ``SpawnError``."""
        results = await asyncio.gather(
            *(self._spawn(i) for i in range(self.opts.replicas)), return_exceptions=True
        )
        errors = [e for e in results if isinstance(e, BaseException)]
        if errors:
            await self.stop()
            err = errors[0]
            if isinstance(err, ZmeshError):
                raise SpawnError(f"service {self.name}: a replica failed to start: {err}") from err
            raise err
        self._spawn_task(self.health.run())
        self._spawn_task(self._report_loop())

    async def stop(self) -> None:
        """Stop every replica; a respawn under way finishes and is stopped too."""
        self.stopped = True
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        # Respawns under way finish, then stop what they made (see _recover).
        await asyncio.gather(*self._spawning, return_exceptions=True)
        meshes = [m for m in self.client.meshes if m is not None]
        self.client.stop()
        self.report()  # clients elsewhere stop first: nothing is re-sent to what stops next
        for mesh in meshes:
            await stop_procs(self.rt, mesh._refs)
        self.report()  # a last table, STOPPED: handles elsewhere stop too

    def attach(self, other: ServiceClient) -> None:
        """Feed ``other`` (a client on another loop) the table now and on each change.

        Safe from any thread. What ``other`` finds failed first (a request
        that broke, its own supervision stream) comes back here.
        """
        loop = self.rt.loop

        def tell(index: int, generation: int, reason: str) -> None:
            loop.call_soon_threadsafe(self.client.replica_failed, index, generation, reason)

        other.on_failure = tell

        def add() -> None:
            self._attached.add(other)
            self._push_to(other, self.client.table())

        if running_loop() is loop:
            add()
        else:
            loop.call_soon_threadsafe(add)

    def _push_to(self, other: ServiceClient, rows: list[Any]) -> None:
        if other.rt.closed or other.rt.loop.is_closed():
            self._attached.discard(other)
            return
        try:
            other.rt.loop.call_soon_threadsafe(other.apply_table, rows)
        except RuntimeError:  # its loop closed meanwhile
            self._attached.discard(other)

    def _spawn_task(self, coro: Any) -> None:
        task = self.rt.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _spawn(self, index: int) -> None:
        mesh = await spawn_owned_mesh(
            self.rt, self.opts.cls, self.opts.hosts, self.opts.procs,
            f"{self.name}-r{index}", self._args, self._kwargs, self._placement(index),
            setup=self.opts.setup,
        )  # fmt: skip
        if self.stopped:
            await stop_procs(self.rt, mesh._refs)
            return
        self._agents.update(r.agent for r in mesh._refs)
        self._generations[index] += 1
        self.client.set_replica(index, self._generations[index], mesh)
        self.report()

    def _placement(self, index: int) -> list[str] | None:
        """Agents for a replica: spread replicas over the configured agents,
        and keep a respawn off agents this client has lost (a partition)."""
        pool = _local.configured_agents()
        hosts = self.opts.hosts
        if pool is None or len(pool) <= hosts:
            return None  # the default placement (and its clear error if too few)
        start = (index * hosts) % len(pool)
        rotated = pool[start:] + pool[:start]
        lost = {a.addr for a in self.rt.controller.agents.values() if a.lost}
        ordered = [a for a in rotated if a not in lost] + [a for a in rotated if a in lost]
        return ordered[:hosts]

    # ------------------------------------------------------------ failures

    def _failed(self, index: int, generation: int, reason: str) -> None:
        """The dispatcher took a failed replica out of routing: replace it."""
        if self.stopped:
            return
        mesh = self.client.meshes[index]
        where = ""
        if mesh is not None and mesh._refs and "mesh=" not in reason:
            ref = mesh._refs[0]
            where = f" (mesh={ref.mesh}, host={ref.host}, log={ref.log_path or 'n/a'})"
        log.warning("service %s replica %d failed: %s%s", self.name, index, reason, where)
        self._spawn_task(self._recover(index, self.client.meshes[index]))
        self.report()

    async def _recover(self, index: int, old: ActorMesh[Any] | None) -> None:
        if old is not None:
            # Stopping the whole replica fails what is still in flight on its
            # surviving ranks (at once, client-side), and those are re-sent.
            # The agent may be unreachable (a partition): do not wait for it.
            self._spawn_task(stop_procs(self.rt, old._refs))
        loop, cfg, slot = self.rt.loop, self.config, self.client.dispatcher.slots[index]
        times = self._restart_times[index]
        while not self.stopped:
            now = loop.time()
            while times and now - times[0] > cfg.restart_window:
                times.popleft()
            if len(times) >= cfg.max_restarts:
                self.client.replica_gone(index)
                log.error(
                    "service %s replica %d stays down: %d restarts within %.0fs",
                    self.name, index, len(times), cfg.restart_window,
                )  # fmt: skip
                self.report()
                return
            delay = min(cfg.backoff_initial * 2 ** self._backoff[index], cfg.backoff_max)
            await asyncio.sleep(delay)
            times.append(loop.time())
            slot.restarts += 1
            # Shielded: stop() cancels this task, and a spawn cancelled midway
            # would leave its procs running. stop() waits for it instead, and
            # _spawn stops what it made once it sees the service stopped.
            spawning = loop.create_task(self._spawn(index))
            self._spawning.add(spawning)
            spawning.add_done_callback(self._spawning.discard)
            try:
                await asyncio.shield(spawning)
            except Exception as exc:
                self._backoff[index] += 1
                slot.last_failure = f"respawn failed: {exc}"
                log.warning("service %s replica %d: %s", self.name, index, slot.last_failure)
                continue
            self._backoff[index] = 0 if slot.state == HEALTHY else self._backoff[index] + 1
            return

    # ------------------------------------------------------------ reports

    async def _report_loop(self) -> None:
        while not self.stopped:
            await asyncio.sleep(REPORT_INTERVAL)
            self.report()

    def report(self) -> None:
        """Tell the service's agents its replica table (``zmesh top``, handles elsewhere)."""
        d = self.client.dispatcher
        slots = d.slots
        healthy = sum(s.state == HEALTHY for s in slots)
        state = service_state(healthy, len(slots), self.stopped)
        table = self.client.table()
        for other in list(self._attached):
            self._push_to(other, table)
        summary = ServiceSummary(
            name=self.name,
            healthy=healthy,
            desired=len(slots),
            restarts=sum(s.restarts for s in slots),
            last_failure=next((s.last_failure for s in slots if s.last_failure), ""),
            state=state,
            id=self.service_id,
            table=encode_table(table),
            max_concurrent=self.config.max_concurrent_requests,
            serial=self._serial,
        )
        own = own_proc()  # the orchestrator's proc: its mesh's key proves it too
        report = w.ServiceReport(
            summary, _local.owner_secret(), _local.mesh_proof(own.mesh) if own else ""
        )
        for addr in self._agents:
            self.rt.controller.agent(addr).client.send(report)
