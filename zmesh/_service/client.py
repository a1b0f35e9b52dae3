"""The calling side of a service: the dispatcher's decisions carried out on one runtime.

``ServiceClient`` carries out what the socket-free ``Dispatcher`` decides
(``decisions.py``): it sends attempts to the replicas' procs, gives callers
their answers, tells the supervisor of failed replicas and wakes fan-outs
waiting for one. It reports to the dispatcher what happens next (replies
as outcomes, timeouts from each request's timer, replica changes), and
follows the supervision stream of every replica generation it knows, so a
dead replica leaves routing when its agent says so, not when a request
fails. Control flows one way: the dispatcher never calls back.

There is one per runtime (event loop) that calls the service, so a call
from ``async`` code is routed on the caller's own loop, with no thread hop.
In the process that made the service, the supervisor pushes each change of
the replica table to its clients. Anywhere else (a ``Service`` passed to an
actor, or returned from one) a client learns new generations from the
replica tables the orchestrator reports to its agents (``Follower``), with
no round trip through the owner per request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec

from zmesh._client.calls.runtime import ProcRef, Runtime
from zmesh._client.control.controller import SupervisionEvent
from zmesh._client.handles.mesh import ActorMesh
from zmesh._errors import (
    ActorStoppedError,
    ServiceError,
    SupervisionError,
    ZmeshError,
    encode_error,
)
from zmesh._service.decisions import Decision, Failed, Send, Settle
from zmesh._service.dispatch import Attempt, Dispatcher, Outcome, Request
from zmesh._service.routing import HEALTHY, STOPPED, UNREADY, Router, ServiceConfig, Session
from zmesh._shared.points import Shape
from zmesh._shared.state import owner_gone
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec
from zmesh._wire.deadlines import CLOCK, SPENT

# How often a handle away from its owner re-reads the replica table, and how
# often while one of its replicas is known to be down (a respawn is coming).
FOLLOW_INTERVAL = 1.0
FOLLOW_INTERVAL_DOWN = 0.2
# A handle whose service no agent has reported for this long stops following.
FOLLOW_GIVE_UP = 30.0

log = logging.getLogger("zmesh.service")


class TableRow(msgspec.Struct, frozen=True):
    """One replica in the table an orchestrator publishes (``ServiceSummary.table``)."""

    index: int
    generation: int
    state: str
    actor: str = ""
    refs: list[ProcRef] = []
    restarts: int = 0
    last_failure: str = ""
    dims: dict[str, int] = {}


_TABLE = msgspec.msgpack.Encoder()
_TABLE_DECODE = msgspec.msgpack.Decoder(list[TableRow])


def encode_table(rows: list[TableRow]) -> bytes:
    return _TABLE.encode(rows)


def decode_table(blob: bytes) -> list[TableRow]:
    return _TABLE_DECODE.decode(blob)


class ServiceClient:
    """One process's calls to one service, on ``rt``'s loop."""

    def __init__(
        self,
        rt: Runtime,
        name: str,
        replicas: int,
        config: ServiceConfig,
        router: Router,
        cls_name: str,
        endpoints: frozenset[str],
    ) -> None:
        self.rt = rt
        self.name = name
        self.cls_name = cls_name
        self.endpoints = endpoints
        self.meshes: list[ActorMesh[Any] | None] = [None] * replicas
        self._listeners: dict[int, tuple[str, Callable[[SupervisionEvent], None]]] = {}
        self.dispatcher = Dispatcher(name, replicas, config, router, rt.loop.time)
        self.follower: Follower | None = None
        # Told of each replica generation that fails (``Failed``): the
        # supervisor replaces it; a client away from it re-reads the table.
        self.on_failure: Callable[[int, int, str], None] | None = None
        # Fan-outs waiting for a replica (``serving``), woken on ``Changed``.
        self._watchers: list[asyncio.Future[None]] = []

    # ------------------------------------------------------------ decisions

    def carry(self, decisions: list[Decision]) -> None:
        """Carry out the dispatcher's decisions, in order.

        One that raises (a socket that cannot be made, a failure handler's
        bug) does not drop the rest, whose requests would wait for ever: a
        send that raised ends its request with a ``ServiceError`` saying
        why; anything else is logged.
        """
        for dec in decisions:
            try:
                _carry(self, dec)
            except Exception as exc:
                if isinstance(dec, Send) and dec.attempt.held:
                    err = ServiceError(
                        f"{dec.attempt.request.endpoint!r} on {self.name} could not be sent: "
                        f"{type(exc).__name__}: {exc}", mesh=self.name,
                    )  # fmt: skip
                    err.__cause__ = exc
                    self.carry(self.dispatcher.settled(dec.attempt, Outcome.ERROR, err))
                else:
                    log.exception("service %s: a %s could not be carried out", self.name,
                                  type(dec).__name__)  # fmt: skip

    def settled(self, attempt: Attempt, outcome: Outcome, value: Any = None) -> None:
        """``attempt`` ended (a reply, an error, its replica broke): tell the dispatcher."""
        self.carry(self.dispatcher.settled(attempt, outcome, value))

    def cancel(self, req: Request) -> None:
        """The reader of ``req``'s stream stopped reading."""
        self.carry(self.dispatcher.cancel(req))

    def _expire(self, req: Request) -> None:
        self.carry(self.dispatcher.expire(req))

    def replica_failed(self, index: int, generation: int, reason: str, notify: bool = True) -> None:
        """Generation ``generation`` of replica ``index`` failed: out of routing."""
        self.carry(self.dispatcher.replica_failed(index, generation, reason, notify))

    def replica_unready(self, index: int, generation: int, reason: str) -> bool:
        """A replica failed its health check: out of routing; True if it was HEALTHY."""
        slot = self.dispatcher.slots[index]
        was = slot.state
        decisions = self.dispatcher.replica_unready(index, generation, reason)
        unready = was == HEALTHY and slot.state == UNREADY
        self.carry(decisions)
        return unready

    def replica_ready(self, index: int, generation: int) -> None:
        """An ``UNREADY`` replica passes its check again: back in routing."""
        self.carry(self.dispatcher.replica_ready(index, generation))

    # ------------------------------------------------------------ replicas

    def set_replica(self, index: int, generation: int, mesh: ActorMesh[Any]) -> None:
        """Generation ``generation`` of replica ``index`` is ``mesh``: route to it."""
        d = self.dispatcher
        if generation <= d.slots[index].generation or d.stopped:
            return
        self._unlisten(index)
        self.meshes[index] = mesh
        ctl = self.rt.controller

        def on_failure(ev: SupervisionEvent) -> None:
            why = f"{ev.status.value}: {ev.reason} (rank {ev.rank})"
            self.replica_failed(index, generation, why)
            if self.follower is not None and owner_gone(ev.reason):
                # Away from the service's supervisor, which lived in the
                # process that is gone: no new generation will come.
                self.carry(d.owner_gone(index, generation, why))

        self._listeners[index] = (mesh.proc_mesh, on_failure)
        ctl.listeners.setdefault(mesh.proc_mesh, []).append(on_failure)
        for ref in mesh._refs:
            ctl.watch(ref)
        self.carry(d.replica_up(index, generation))
        # A failure that happened before we listened is in the view already.
        view = ctl.views.get(mesh.proc_mesh) or ctl.tombstones.get(mesh.proc_mesh)
        if view is not None and any(
            r.status.failure for rank, r in view.ranks.items() if rank < len(mesh._refs)
        ):
            self.replica_failed(index, generation, "failed while starting")

    def replica_gone(self, index: int) -> None:
        """Replica ``index`` stays down for good (restart intensity)."""
        self._unlisten(index)
        self.meshes[index] = None
        self.carry(self.dispatcher.replica_gone(index))

    def _unlisten(self, index: int) -> None:
        old = self._listeners.pop(index, None)
        if old is not None:
            listeners = self.rt.controller.listeners.get(old[0], [])
            if old[1] in listeners:
                listeners.remove(old[1])

    def stop(self) -> None:
        for index in list(self._listeners):
            self._unlisten(index)
        self.carry(self.dispatcher.stop())
        if self.follower is not None:
            self.follower.cancel()

    def table(self) -> list[TableRow]:
        """The replica table as this client routes by (what orchestrators publish)."""
        rows = []
        for slot, mesh in zip(self.dispatcher.slots, self.meshes, strict=True):
            actor, refs = (mesh.actor, list(mesh._refs)) if mesh is not None else ("", [])
            row = TableRow(slot.index, slot.generation, slot.state, actor, refs)
            dims = mesh.sizes if mesh is not None else {}
            rows.append(msgspec.structs.replace(
                row, restarts=slot.restarts, last_failure=slot.last_failure, dims=dims
            ))  # fmt: skip
        return rows

    def apply_table(self, rows: list[TableRow]) -> None:
        """Follow a table from the orchestrator: newer generations, failures,
        replicas given up, a stop. Older news than this client's is ignored."""
        if self.dispatcher.stopped:
            return
        for row in rows:
            if row.index >= len(self.meshes):
                continue
            slot = self.dispatcher.slots[row.index]
            if row.state == STOPPED:
                self.stop()
                return
            slot.restarts = max(slot.restarts, row.restarts)
            if row.last_failure:
                slot.last_failure = row.last_failure
            if row.generation == slot.generation and row.state == UNREADY:
                self.replica_unready(row.index, row.generation, row.last_failure)
            elif row.generation == slot.generation and row.state == HEALTHY:
                self.replica_ready(row.index, row.generation)  # (if UNREADY)
            elif row.state != HEALTHY and row.generation == slot.generation:
                # The orchestrator knew first (a health check): out of routing.
                self.replica_failed(row.index, row.generation, row.last_failure or row.state, False)
            if row.state == HEALTHY and row.generation > slot.generation and row.refs:
                shape = Shape(row.dims or {"procs": len(row.refs)}, [r.rank for r in row.refs])
                mesh: ActorMesh[Any] = ActorMesh(
                    row.actor, self.cls_name, self.endpoints, shape, list(row.refs)
                )
                self.set_replica(row.index, row.generation, mesh)
            elif row.state == "UNHEALTHY" and slot.state != "UNHEALTHY":
                self.replica_gone(row.index)

    # ------------------------------------------------------------ requests

    def submit(
        self,
        endpoint: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
        session: Session | None,
        retry: bool,
        pinned: int | None = None,
        least_loaded: bool = False,
        req_id: str = "",
    ) -> asyncio.Future[Any]:
        """Make a request and route it; runs on the runtime's loop."""
        try:
            packed = Codec.pack(args, kwargs)
        except Exception as exc:
            raise encode_error(
                f"arguments of {endpoint!r} cannot be sent: {type(exc).__name__}: {exc}",
                exc,
                mesh=self.name,
            ) from exc
        loop = self.rt.loop
        fut: asyncio.Future[Any] = loop.create_future()
        limit = timeout if timeout is not None else self.dispatcher.config.request_timeout
        now = loop.time()
        req = Request(
            req_id, endpoint, now + limit, retry=retry, session=session, pinned=pinned,
            least_loaded=least_loaded, args=packed, sink=[fut, None], start=now,
        )  # fmt: skip
        self.start(req)
        return fut

    def start(self, req: Request) -> None:
        """Route a new request; its timer runs unless it ended at once (its ``sink``
        is ``[future or stream source, timer]``)."""
        decisions = self.dispatcher.submit(req)
        if not req.done:
            req.sink[1] = self.rt.loop.call_at(req.deadline, self._expire, req)
        self.carry(decisions)

    def _settle(self, req: Request, error: BaseException | None, value: Any) -> None:
        fut, timer = req.sink
        if timer is not None:
            timer.cancel()
        if req.stream:  # its sink is the stream's source (zmesh._service.streaming)
            fut.finish(error)
            return
        if fut.done():
            return
        if error is None:
            fut.set_result(value)
        else:
            fut.set_exception(error)

    def _send(self, attempt: Attempt) -> None:
        req, slot = attempt.request, attempt.slot
        if slot.generation != attempt.generation or slot.state != HEALTHY:
            # Out of routing since the decision: an earlier send of its batch
            # found the replica broken (``Runtime.send`` fails a broken
            # connection's targets at once). Not sent: routed again.
            self.carry(self.dispatcher.unsent(attempt))
            return
        mesh = self.meshes[slot.index]
        assert mesh is not None
        if req.stream:  # a generator endpoint: one StreamCall, to return_rank
            req.sink[0].start(attempt, mesh, self.dispatcher.config.return_rank)
        else:
            _call(self, attempt, mesh)

    async def serving(self, endpoint: str, timeout: float | None) -> float:
        """Wait until a replica is healthy, for a fan-out; the seconds left of the timeout.

        A fan-out goes to the replicas healthy when it starts: with none (every
        one being replaced), it waits for one rather than answer with nothing.

        Raises:
            ServiceError: no replica became healthy within ``timeout`` (default
                ``request_timeout``), or none can (every one reached its
                restart limit, or the process that made the service is gone).
            ActorStoppedError: the service was stopped.
        """
        d, loop = self.dispatcher, self.rt.loop
        limit = timeout if timeout is not None else d.config.request_timeout
        end = loop.time() + limit
        while True:
            if d.stopped:
                raise ActorStoppedError(f"service {self.name} was stopped", mesh=self.name)
            if d.healthy():
                return max(end - loop.time(), SPENT)
            states = ", ".join(f"{s.index}: {s.state}" for s in d.slots)
            if not d.recovering():
                raise ServiceError(
                    f"service {self.name} is DOWN: no replica can take {endpoint!r} "
                    f"({d.why_down()}; replicas {states})",
                    mesh=self.name,
                )
            left = end - loop.time()
            if left <= 0:
                raise ServiceError(
                    f"no replica of {self.name} became healthy for {endpoint!r} within "
                    f"{limit:g}s (replicas {states})",
                    mesh=self.name,
                )
            changed: asyncio.Future[None] = loop.create_future()
            self._watchers.append(changed)
            await asyncio.wait([changed], timeout=left)

    def broadcast(self, endpoint: str, payload: w.Payload, buffers: list[Any]) -> None:
        """Send to every healthy replica (all its ranks); no reply, no retry."""
        for slot in self.dispatcher.healthy():
            mesh = self.meshes[slot.index]
            if mesh is not None:
                call = functools.partial(
                    w.Call, actor=mesh.actor, method=endpoint, payload=payload, oneway=True
                )
                self.rt.send(mesh._refs, call, buffers, None)


def _call(client: ServiceClient, attempt: Attempt, mesh: ActorMesh[Any]) -> None:
    """Send ``attempt`` to every rank of ``mesh`` (a replica); settle it once all
    answered (with ``return_rank``'s value), or at the first failure."""
    req, rt = attempt.request, client.rt
    refs = mesh._refs
    results: list[Any] = [None] * len(refs)
    remaining = len(refs)
    want = min(client.dispatcher.config.return_rank, len(refs) - 1)

    def deliver(i: int, ok: bool, value: Any) -> None:
        nonlocal remaining
        if not attempt.held:
            return  # the first failure settled it; the rest is late
        if ok:
            results[i] = value
            remaining -= 1
            if remaining == 0:
                client.settled(attempt, Outcome.OK, results[want])
            return
        broken = isinstance(value, SupervisionError | ActorStoppedError)
        client.settled(attempt, Outcome.BROKEN if broken else Outcome.ERROR, value)

    payload, buffers = req.args
    left = max(req.deadline - rt.loop.time(), SPENT)  # the budget (zmesh._wire.deadlines)
    actor, method, req_id = mesh.actor, req.endpoint, req.id
    # No client-side timeout on the send: the dispatcher ends the request
    # for its caller at its deadline, and the proc skips it if it arrives
    # late. The attempt keeps its slot until the replica answers.
    rt.send(
        refs,
        lambda i: w.Call(i, actor, method, payload, left, False, req_id, time.monotonic(), CLOCK),
        buffers,
        deliver,
    )


class Follower:
    """Keeps a handle away from its owner up to date with the orchestrator's table.

    It asks the agents of the service's replicas for their statistics (which
    hold the table the orchestrator last reported) about once a second, and
    every ``FOLLOW_INTERVAL_DOWN`` while a replica is down, until the table
    shows its new generation.
    """

    def __init__(self, client: ServiceClient, service_id: str, agents: set[str]) -> None:
        self.client = client
        self.service_id = service_id
        self.agents = set(agents)
        self.wake = asyncio.Event()
        self._task = client.rt.loop.create_task(self._run())
        client.follower = self
        client.on_failure = lambda index, gen, why: self.wake.set()

    def cancel(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        client = self.client
        heard = time.monotonic()
        while not client.dispatcher.stopped:
            down = any(s.state != HEALTHY for s in client.dispatcher.slots)
            try:
                await asyncio.wait_for(
                    self.wake.wait(), FOLLOW_INTERVAL_DOWN if down else FOLLOW_INTERVAL
                )
            except TimeoutError:
                pass
            self.wake.clear()
            rows = await self._read()
            if rows is not None:
                heard = time.monotonic()
                client.apply_table(rows)
            elif time.monotonic() - heard > FOLLOW_GIVE_UP:
                return

    async def _read(self) -> list[TableRow] | None:
        """The newest table any agent holds for this service, or ``None``."""
        ctl = self.client.rt.controller
        for mesh in self.client.meshes:
            if mesh is not None:
                self.agents.update(r.agent for r in mesh._refs)
        best: list[TableRow] | None = None
        for addr in sorted(self.agents):
            try:
                reply = await ctl.agent(addr).request(lambda i: w.GetStats(i), timeout=1.0)
            except ZmeshError:
                continue
            for summary in reply.stats.services:
                if getattr(summary, "id", "") != self.service_id or not summary.table:
                    continue
                rows = decode_table(summary.table)
                if best is None or _newer(rows, best):
                    best = rows
        return best


def _newer(a: list[TableRow], b: list[TableRow]) -> bool:
    return sum(r.generation for r in a) > sum(r.generation for r in b)


def _carry(client: ServiceClient, dec: Decision) -> None:
    """Carry out one decision (``ServiceClient.carry``)."""
    if isinstance(dec, Send):
        client._send(dec.attempt)
    elif isinstance(dec, Settle):
        client._settle(dec.request, dec.error, dec.value)
    elif isinstance(dec, Failed):
        if client.on_failure is not None:
            client.on_failure(dec.index, dec.generation, dec.reason)
    else:  # Changed
        watchers, client._watchers = client._watchers, []
        for fut in watchers:
            if not fut.done():
                fut.set_result(None)
