"""The promise as a matrix: every way of calling x every fault.

The promise (docs/architecture.md, "Every way of calling keeps this"): a
call resolves within its budget with a value or a typed zmesh error, the
surviving actor serves its next message, no non-owner changes anything, and
memory stays bounded. Each cell below is one way of calling (tests/_promise.py
``WAYS``) under one fault, checked for all four.

Ways: ``call_one``, ``call``, ``broadcast``, ``choose``, a stream of a sync
and of an async generator endpoint, ``Port.send`` (a feeder sending into a
channel the caller reads), an explicit response port, ``Accumulator``, a
service direct call, a service (generator) stream, a service session, and a
service fan-out (``svc.ep.call()``) and fan-out stream (``svc.ep.stream()``).

Faults (what is done; the survivor that must serve its next message):

- ``reader_killed``: the caller is an actor (``Reader``), its proc is killed
  with SIGKILL mid-call; survivor: the producer.
- ``reader_stopped``: the same, the reader's mesh stopped cleanly.
- ``reader_stalls``: the reader (an actor) takes one item or value and then
  stops reading, alive, while its producer goes on (a stream's generator
  runs as fast as it may; a feeder sends up to 100,000 values of 4 KiB); survivor:
  the producer, once the reader closes; memory: the reader's RSS and the
  producer's stay under ``RSS_BOUND_MIB``.
- ``producer_killed``: SIGKILL of the proc running the call; survivor: the
  producer's other rank (for a service, the service).
- ``producer_stopped``: ``mesh.stop()`` of the producer's actors (their
  procs live on; ``svc.stop()`` for a service) mid-call; survivor: a sibling
  actor on the same procs (a bystander mesh for a service).
- ``producer_stuck``: the work (or the next item, value or answer) takes
  1.5 s, the call's timeout is 0.5 s; survivor: the producer itself.
- ``owner_exits``: a client process spawned the producers, this process calls
  them through their handles, the owner gets SIGKILL; survivor: a mesh of
  this process, and none of the owner's procs may outlive it.
- ``agent_killed``: SIGKILL of the agent of the producers' first host;
  survivor: the rank on the other host (for a service, the service).
- ``intruder_acts``: a second admitted client (same user, same agent) uses
  every way through unpickled handles; survivor: the owner's producer.
- ``intruder_stops``: that client tries to stop what it was handed
  (``mesh.stop()``; ``svc.stop()`` and ``svc.replica(0).stop()``): each must
  be refused (``SecurityError``; a service handle's own ``ServiceError``)
  and the owner's producer must serve on.

Every cell is meaningful except those in ``NOT_MEANINGFUL``: each is a
skipped test whose reason says why. Memory (``RSS_BOUND_MIB``) is checked
where a process lives through the fault and may go on receiving: the
producer's RSS when its reader goes away (killed, stopped or stalled), the
stalled reader's own, and this process's when it calls through the fault.

Cells that fail on today's code are ``xfail(strict=True)`` (``KNOWN``), the
reason naming the item of issue 23 it is, or saying "new:" and what breaks:
fixing it turns the mark into a failure until it is removed. Run with
``-s`` to see each cell's record (how the call ended and when, the survivor,
RSS).

Speed: the cells of one fault run at once, in one *world* (fresh producers
per way, all faults injected concurrently or once for all), computed on the
first of its cells and read by the others; nothing is shared across worlds.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import zmesh
from zmesh.testing import local_cluster

from _helpers import end_child, pid_alive, read_line
from _keptagents import stop_meshes
from _promise import (
    FANOUT_WAYS,
    FLOOD_LIMIT,
    SERVICE_WAYS,
    STREAM_WAYS,
    WAYS,
    Pace,
    Producer,
    Reader,
    drive,
    marked_pid,
    rss_mib,
)

pytestmark = [pytest.mark.chaos, pytest.mark.stress]

FAULTS = (
    "reader_killed",
    "reader_stopped",
    "reader_stalls",
    "producer_killed",
    "producer_stopped",
    "producer_stuck",
    "owner_exits",
    "agent_killed",
    "intruder_acts",
    "intruder_stops",
)

# The work of a call in flight: long enough for a fault to land in it, short
# enough that an orphaned call (its reader gone) ends soon; generators run
# (a 10 ms beat) until closed. The call's own timeout is far past the budget:
# a cell must resolve from supervision, not from its timeout.
IN_FLIGHT = Pace(seconds=1.0, count=100_000, gap=0.01, timeout=30.0)
# Stuck: the work (or the next item, value or answer) takes 1.5 s; the timeout is 0.5 s.
STUCK = Pace(seconds=1.5, count=2, gap=1.5, timeout=0.5)

BUDGET = 5.0  # a call resolves this soon after its fault (supervision: ~0.2-1.2 s)
HARD = 6.0  # past this a call counts as hung (its cell fails; the suite goes on)
NEXT = 4.0  # the survivor's next message, after the producer's own work ends
RSS_BOUND_MIB = 64.0
# A stalled port reader holds what its receiver may queue (10,000 values: 40 MiB
# of 4 KiB ones) plus what its senders may have in flight to it (as much again),
# and the allocator's slack: measured 33-94 MiB. Unbounded, the flood (400 MiB)
# grows it by 300 MiB or more.
PORT_RSS_BOUND_MIB = 160.0

# Cells that test nothing, and why (each is a skipped test saying so).
NOT_MEANINGFUL: dict[tuple[str, str], str] = {
    (way, "reader_stalls"): (
        "not meaningful: a reader that stops reading only matters where the producer "
        "keeps producing for it (a stream or a port); this way's caller takes one reply "
        "per actor, which it holds whether it reads it or not"
    )
    for way in WAYS
    if way not in (*STREAM_WAYS, "port_send")
}

# Breaks that cells meet on today's code: (way, fault) -> reason. "issue 23 item N"
# is a known break of that issue; "new:" one found by this matrix.
KNOWN: dict[tuple[str, str], str] = {}


# ------------------------------------------------------------ one cell's record


@dataclass
class Outcome:
    """How one awaited thing ended: a value, an error (by type), or not at all.

    ``seconds`` counts from when the fault was injected (for a stuck
    producer: from when its work was under way) to the end.
    """

    ok: bool
    value: Any = None
    error: str = ""  # the exception's type name ("" for a value)
    message: str = ""
    zmesh_error: bool = False
    seconds: float = 0.0
    hung: bool = False

    def __str__(self) -> str:
        if self.hung:
            return f"HUNG (nothing after {self.seconds:.1f}s)"
        if self.ok:
            return f"value {_short(self.value)} after {self.seconds:.2f}s"
        return f"{self.error}: {self.message[:200]} after {self.seconds:.2f}s"


@dataclass
class Cell:
    """What one (way, fault) cell saw."""

    call: Outcome | None = None
    survivor: Outcome | None = None
    rss_growth: float | None = None  # MiB, of the process that had to stay bounded
    refused: dict[str, str] = field(default_factory=dict)  # a non-owner's stop -> outcome
    notes: list[str] = field(default_factory=list)
    landed: bool = True  # the producer's work was under way when the fault came

    def __str__(self) -> str:
        parts = [f"call: {self.call}", f"survivor: {self.survivor}"]
        if self.rss_growth is not None:
            parts.append(f"RSS +{self.rss_growth:.1f} MiB")
        parts += [f"{k}: {v}" for k, v in self.refused.items()] + self.notes
        return "; ".join(parts)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 60 else f"{text[:40]}... ({len(value)} items)"


async def _outcome(aw: Awaitable[Any], limit: float = HARD) -> Outcome:
    """Await ``aw`` for at most ``limit`` s; never raises."""
    t0 = time.monotonic()
    task = asyncio.ensure_future(_wrap(aw))
    # Not wait_for: CallTimeoutError is a TimeoutError too, and must not read as a hang.
    done, _ = await asyncio.wait({task}, timeout=limit)
    took = time.monotonic() - t0
    if not done:
        task.cancel()
        return Outcome(False, hung=True, seconds=took)
    exc = task.exception()
    if exc is not None:
        return Outcome(False, error=type(exc).__name__, message=str(exc),
                       zmesh_error=isinstance(exc, zmesh.ZmeshError), seconds=took)  # fmt: skip
    return Outcome(True, value=task.result(), seconds=took)


async def _wrap(aw: Awaitable[Any]) -> Any:
    return await aw


async def _marked(marker: str, task: asyncio.Future[Any], limit: float = 15.0) -> None:
    """Wait until the producer marked its work under way (or the call failed first).

    A call that ended well may still be ahead of its work: a ``broadcast``
    returns once sent (from a ``Reader``, the reply to its caller can arrive
    before the producer has the message), so it is waited for too.
    """
    deadline = time.monotonic() + limit
    while marked_pid(marker) is None and time.monotonic() < deadline:
        if task.done() and (task.cancelled() or task.exception() is not None):
            return
        await asyncio.sleep(0.01)


# ------------------------------------------------------------ producers


@dataclass
class Target:
    """One way's producer: a mesh of 2 procs (or a 2-replica service), plus a
    sibling actor on the same procs (a bystander mesh for a service)."""

    way: str
    handle: Any
    sibling: zmesh.ActorMesh[Producer]
    pids: list[int]
    marker: str


async def _target(way: str, markers: str, hosts: zmesh.HostMesh | None = None) -> Target:
    marker = os.path.join(markers, way)
    host = hosts or zmesh.this_host()
    if way in SERVICE_WAYS:
        svc = await Producer.options(replicas=2).as_service()
        pids = [await _replica_pid(svc, i) for i in range(2)]
        sibling = await host.spawn_procs(per_host={"procs": 1}).spawn("bystander", Producer)
        return Target(way, svc, sibling, pids, marker)
    per_host = {"procs": 1 if hosts is not None else 2}
    procs = await host.spawn_procs(per_host=per_host)
    mesh = await procs.spawn("producer", Producer)
    sibling = await procs.spawn("sibling", Producer)
    pids = (await mesh.pid.options(timeout=10).call()).values()
    return Target(way, mesh, sibling, pids, marker)


async def _replica_pid(svc: zmesh.Service[Producer], i: int) -> int:
    replica = svc.replica(i)
    assert replica is not None, f"replica {i} of {svc} is not up"
    return await replica.pid.options(timeout=10).call_one()


async def _ping_all(mesh: Any, ranks: list[int] | None = None) -> list[int]:
    """Every rank (or ``ranks``) of a mesh, or one call of a service, answers a ping."""
    if isinstance(mesh, zmesh.Service):
        return [await mesh.ping.options(timeout=NEXT)(7)]
    flat = mesh.flatten("r")
    picks = range(len(flat.points())) if ranks is None else ranks
    return [await flat.slice(r=i).ping.options(timeout=NEXT).call_one(7) for i in picks]


def _rss(pids: list[int]) -> float:
    return sum(rss_mib(p) or 0.0 for p in pids)


# ------------------------------------------------------------ worlds: one per fault


async def _client_world(fault: str, markers: str, hosts: zmesh.HostMesh | None = None,
                        on_all: Callable[[], None] | None = None) -> dict[str, Cell]:  # fmt: skip
    """This process calls every way; the fault hits each producer (or all at once)."""
    targets = await asyncio.gather(*(_target(w, markers, hosts) for w in WAYS))
    pace = STUCK if fault == "producer_stuck" else IN_FLIGHT
    cells = {t.way: Cell() for t in targets}
    me_before = rss_mib(os.getpid()) or 0.0
    tasks = {t.way: asyncio.ensure_future(drive(t.way, t.handle, t.marker, pace)) for t in targets}
    await asyncio.gather(*(_marked(t.marker, tasks[t.way]) for t in targets))
    if on_all is not None:
        on_all()

    async def one(t: Target) -> None:
        cell = cells[t.way]
        cell.landed = marked_pid(t.marker) is not None
        killed: int | None = None
        if fault == "producer_killed":
            killed = marked_pid(t.marker)
            if killed is not None:
                os.kill(killed, signal.SIGKILL)
        elif fault == "producer_stopped":
            stop = await _outcome(t.handle.stop())
            cell.notes.append(f"the stop: {stop}")
        cell.call = await _outcome(tasks[t.way])
        if fault == "producer_stopped":
            cell.survivor = await _outcome(_ping_all(t.sibling), NEXT + 2)
        elif t.way in SERVICE_WAYS:
            cell.survivor = await _outcome(_ping_all(t.handle), NEXT + 2)
            if fault == "agent_killed":
                bystander = await _outcome(_ping_all(t.sibling, [1]), NEXT)
                cell.notes.append(f"a bystander on the other host: {bystander}")
        else:
            if fault == "agent_killed":
                alive = [1]  # the rank on the other host
            else:
                alive = [i for i, p in enumerate(t.pids) if p != killed]
            cell.survivor = await _outcome(_ping_all(t.handle, alive), NEXT + 2)

    await asyncio.gather(*(one(t) for t in targets))
    growth = (rss_mib(os.getpid()) or 0.0) - me_before
    for cell in cells.values():
        cell.rss_growth = growth  # this process read every way through the fault
    return cells


async def _reader_world(fault: str, markers: str) -> dict[str, Cell]:
    """A ``Reader`` actor calls every way; it is killed or stopped mid-call."""
    targets = await asyncio.gather(*(_target(w, markers) for w in WAYS))
    readers = await asyncio.gather(*(Reader.options().as_actor() for _ in targets))
    cells = {t.way: Cell() for t in targets}

    async def one(t: Target, reader: zmesh.ActorMesh[Reader]) -> None:
        cell = cells[t.way]
        reader_pid = await reader.pid.call_one()
        run = reader.run.call_one(t.way, t.handle, t.marker, IN_FLIGHT)
        task = asyncio.ensure_future(_wrap(run))
        await _marked(t.marker, task)
        cell.landed = marked_pid(t.marker) is not None
        before = _rss(t.pids)
        if fault == "reader_killed":
            os.kill(reader_pid, signal.SIGKILL)
        else:
            cell.notes.append(f"the reader's stop: {await _outcome(reader.stop())}")
        cell.call = await _outcome(task)
        cell.survivor = await _outcome(_ping_all(t.handle), NEXT + 2)
        cell.rss_growth = _rss(t.pids) - before

    await asyncio.gather(*(one(t, r) for t, r in zip(targets, readers, strict=True)))
    return cells


STALL = 3.0  # how long a stalled reader holds its stream (a port reader: at most)


async def _stall_world(markers: str) -> dict[str, Cell]:
    """A ``Reader`` takes one item of every stream (one value of a port), then stalls."""
    ways = [w for w in WAYS if (w, "reader_stalls") not in NOT_MEANINGFUL]
    targets = await asyncio.gather(*(_target(w, markers) for w in ways))
    readers = await asyncio.gather(*(Reader.options().as_actor() for _ in targets))
    cells = {t.way: Cell() for t in targets}

    async def one(t: Target, reader: zmesh.ActorMesh[Reader]) -> None:
        cell = cells[t.way]
        before = _rss(t.pids)
        cell.call = await _outcome(reader.stall.call_one(t.way, t.handle, t.marker, STALL))
        cell.survivor = await _outcome(_ping_all(t.handle), NEXT + 2)
        producer = _rss(t.pids) - before
        if cell.call.ok:
            cell.rss_growth = max(cell.call.value, producer)
            cell.notes.append(f"RSS: the reader +{cell.call.value:.1f}, the producer "
                              f"+{producer:.1f} MiB")  # fmt: skip
        await _outcome(reader.stop())

    await asyncio.gather(*(one(t, r) for t, r in zip(targets, readers, strict=True)))
    return cells


OWNER = """
import pickle, sys
import zmesh
from _promise import Producer, SERVICE_WAYS, WAYS

handles = {}
for way in WAYS:
    if way in SERVICE_WAYS:
        handles[way] = Producer.options(replicas=2).as_service().get(timeout=60)
    else:
        procs = zmesh.this_host().spawn_procs(per_host={"procs": 2}).get(timeout=60)
        handles[way] = procs.spawn("producer", Producer).get(timeout=60)
with open(sys.argv[1], "wb") as f:
    pickle.dump(handles, f)
print("ready", flush=True)
sys.stdin.readline()  # until killed
"""


async def _owner_world(agent: str, scratch: str) -> dict[str, Cell]:
    """Another client process owns the producers; it dies while this one calls them."""
    script, handles_path = os.path.join(scratch, "owner.py"), os.path.join(scratch, "handles")
    Path(script).write_text(OWNER)
    markers = os.path.join(scratch, "markers")
    os.mkdir(markers)
    owner = _child(script, handles_path, agent, stdin=True)
    try:
        await asyncio.to_thread(read_line, owner, 60)
        with open(handles_path, "rb") as f:
            handles = pickle.load(f)
        pids: dict[str, list[int]] = {}
        for way, h in handles.items():
            if way in SERVICE_WAYS:
                pids[way] = [await _replica_pid(h, i) for i in range(2)]
            else:
                pids[way] = (await h.pid.options(timeout=10).call()).values()
        mine = await Producer.options().as_actor()
        pace = Pace(seconds=5.0, count=100_000, gap=0.01, timeout=30.0)
        marks = {w: os.path.join(markers, w) for w in WAYS}
        tasks = {w: asyncio.ensure_future(drive(w, handles[w], marks[w], pace)) for w in WAYS}
        await asyncio.gather(*(_marked(marks[w], tasks[w]) for w in WAYS))
        owner.kill()  # SIGKILL: no shutdown of its own
        cells = {w: Cell() for w in WAYS}

        async def one(way: str) -> None:
            cell = cells[way]
            cell.landed = marked_pid(marks[way]) is not None
            cell.call = await _outcome(tasks[way])
            t0 = time.monotonic()
            while any(pid_alive(p) for p in pids[way]) and time.monotonic() - t0 < NEXT:
                await asyncio.sleep(0.02)
            left = [p for p in pids[way] if pid_alive(p)]
            cell.notes.append(f"the owner's procs left: {left}")
            if left:
                cell.survivor = Outcome(False, error="Orphans", message=f"procs {left} outlived "
                                        "their owner", seconds=NEXT)  # fmt: skip
            else:
                cell.survivor = await _outcome(_ping_all(mine), NEXT)

        await asyncio.gather(*(one(w) for w in WAYS))
        return cells
    finally:
        owner.kill()
        end_child(owner, 10)


INTRUDER = """
import asyncio, json, os, pickle, sys
import zmesh
from _promise import QUICK_PACE, SERVICE_WAYS, drive

async def _aw(fut):
    return await fut

async def main():
    with open(sys.argv[1], "rb") as f:
        handles = pickle.load(f)
    acts = {}
    for way, h in handles.items():
        try:
            marker = os.path.join(sys.argv[2], way)
            v = await asyncio.wait_for(drive(way, h, marker, QUICK_PACE), 20)
            acts[way] = ["value", repr(v)[:80]]
        except Exception as exc:
            acts[way] = [type(exc).__name__, str(exc)[:200]]
    print(json.dumps(acts), flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # the owner looked: now the stops
    stops = {}
    for way, h in handles.items():
        tries = {"mesh.stop()": h.stop} if way not in SERVICE_WAYS else {
            "svc.stop()": h.stop, "svc.replica(0).stop()": lambda h=h: h.replica(0).stop()}
        stops[way] = {}
        for name, stop in tries.items():
            try:
                await asyncio.wait_for(_aw(stop()), 20)
                stops[way][name] = ["done", ""]
            except Exception as exc:
                stops[way][name] = [type(exc).__name__, str(exc)[:200]]
    print(json.dumps(stops), flush=True)

asyncio.run(main())
zmesh.shutdown()
"""


async def _intruder_world(agent: str, scratch: str) -> dict[str, dict[str, Cell]]:
    """A second admitted client acts through every way, then tries to stop each producer;
    after each, the owner's producers must be as they were."""
    script, handles_path = os.path.join(scratch, "intruder.py"), os.path.join(scratch, "handles")
    Path(script).write_text(INTRUDER)
    markers = os.path.join(scratch, "markers")
    os.mkdir(markers)
    targets = await asyncio.gather(*(_target(w, markers) for w in WAYS))
    with open(handles_path, "wb") as f:
        pickle.dump({t.way: t.handle for t in targets}, f)
    child = _child(script, handles_path, agent, markers, stdin=True)
    acts: dict[str, Cell] = {}
    stops: dict[str, Cell] = {}
    try:
        acted = json.loads(await asyncio.to_thread(read_line, child, 90))
        for t in targets:
            kind, text = acted[t.way]
            acts[t.way] = Cell(call=Outcome(kind == "value", value=text, message=text,
                                            error="" if kind == "value" else kind))  # fmt: skip
            acts[t.way].survivor = await _outcome(_ping_all(t.handle), NEXT)
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        tried = json.loads(await asyncio.to_thread(read_line, child, 90))
        for t in targets:
            stops[t.way] = Cell(refused={k: f"{v[0]}: {v[1]}" for k, v in tried[t.way].items()})
            stops[t.way].survivor = await _outcome(_ping_all(t.handle), NEXT)
    finally:
        child.kill()
        end_child(child, 10)
    return {"intruder_acts": acts, "intruder_stops": stops}


def _child(
    script: str, arg: str, agent: str, *more: str, stdin: bool = False
) -> subprocess.Popen[str]:
    """``python script arg *more``: a client of its own, on ``agent``, seeing this tree."""
    env = dict(os.environ, ZMESH_AGENTS=agent,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # fmt: skip
    return subprocess.Popen(
        [sys.executable, script, arg, *more], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip


def _compute(fault: str) -> dict[str, Cell]:
    """Run the world of ``fault`` (every way at once) and stop everything it started."""
    try:
        with tempfile.TemporaryDirectory(prefix="zm-matrix-") as scratch:
            if fault in ("reader_killed", "reader_stopped"):
                return asyncio.run(_reader_world(fault, scratch))
            if fault == "reader_stalls":
                return asyncio.run(_stall_world(scratch))
            if fault in ("producer_killed", "producer_stopped", "producer_stuck"):
                return asyncio.run(_client_world(fault, scratch))
            if fault == "agent_killed":
                with local_cluster(2) as agents:
                    hosts = zmesh.HostMesh([a.control for a in agents])
                    try:
                        return asyncio.run(_client_world(fault, scratch, hosts, agents[0].kill))
                    finally:
                        zmesh.shutdown()
            with local_cluster(1) as agents:
                try:
                    if fault == "owner_exits":
                        return asyncio.run(_owner_world(agents[0].control, scratch))
                    both = asyncio.run(_intruder_world(agents[0].control, scratch))
                    _WORLDS.update(both)  # one second client for both faults
                    return both[fault]
                finally:
                    zmesh.shutdown()
    finally:
        stop_meshes()


_WORLDS: dict[str, dict[str, Cell]] = {}


@pytest.fixture(scope="module")
def worlds() -> Iterator[Callable[[str], dict[str, Cell]]]:
    def get(fault: str) -> dict[str, Cell]:
        if fault not in _WORLDS:
            _WORLDS[fault] = _compute(fault)
        return _WORLDS[fault]

    yield get
    _WORLDS.clear()


# ------------------------------------------------------------ the cells


def _cells() -> Iterator[Any]:
    for fault in FAULTS:  # fault-major: one world, then its cells
        for way in WAYS:
            why = NOT_MEANINGFUL.get((way, fault))
            known = KNOWN.get((way, fault))
            marks = [pytest.mark.xfail(strict=True, reason=known)] if known else []
            if why is not None:
                marks = [pytest.mark.skip(reason=why)]
            yield pytest.param(way, fault, id=f"{fault}-{way}", marks=marks)


def _expected_errors(fault: str) -> tuple[str, ...]:
    """The typed errors a call may end with under ``fault`` (or a value)."""
    return {
        "reader_killed": ("SupervisionError", "ConnectionLostError"),
        "reader_stopped": ("ActorStoppedError",),
        "reader_stalls": (),
        "producer_killed": ("SupervisionError", "ConnectionLostError", "StreamInterruptedError"),
        "producer_stopped": ("ActorStoppedError",),
        "producer_stuck": ("CallTimeoutError",),
        "owner_exits": (
            "SupervisionError",
            "ConnectionLostError",
            "ActorStoppedError",
            "StreamInterruptedError",
            "ServiceError",
        ),
        "agent_killed": ("SupervisionError", "ConnectionLostError", "StreamInterruptedError"),
        "intruder_acts": (),
        "intruder_stops": (),
    }[fault]


@pytest.mark.parametrize(("way", "fault"), list(_cells()))
def test_cell(worlds: Callable[[str], dict[str, Cell]], way: str, fault: str) -> None:
    cell = worlds(fault)[way]
    where = f"{way} under {fault}: {cell}"
    print(f"CELL {fault} {way}: {cell}")  # pytest -s (or -rA) shows every cell's record
    assert cell.landed, f"the fault came before the producer's work was under way: {where}"
    # 1. The call resolves, in its budget, with a value or a typed zmesh error.
    if cell.call is not None:
        call = cell.call
        assert not call.hung, f"the call never resolved: {where}"
        if not call.ok:
            assert call.zmesh_error, f"not a zmesh error: {where}"
            assert call.error in _expected_errors(fault), f"unexpected error: {where}"
        elif fault == "producer_stuck":
            assert way == "broadcast", f"a stuck producer gave a value: {where}"
        if call.ok and way in FANOUT_WAYS:
            assert call.value not in ([], "[]"), f"an empty fan-out is no answer: {where}"
        budget = {
            "producer_stuck": STUCK.timeout + BUDGET,
            "reader_stalls": FLOOD_LIMIT + BUDGET,
        }.get(fault, BUDGET)
        if fault not in ("intruder_acts", "intruder_stops"):
            assert call.seconds <= budget, f"resolved past its budget of {budget}s: {where}"
    # 2. The survivor serves its next message.
    assert cell.survivor is not None and cell.survivor.ok, f"the survivor did not serve: {where}"
    # 3. No non-owner changes anything.
    for name, result in cell.refused.items():
        # A service's stop() is refused by the handle itself ("stopped by the process
        # that made it", a ServiceError); everything else at the process that acts on it.
        refusals = ("SecurityError", "ServiceError") if name == "svc.stop()" else ("SecurityError",)
        assert result.startswith(refusals), f"a non-owner's {name} was not refused: {where}"
    # 4. Memory stays bounded.
    if cell.rss_growth is not None:
        bound = (
            PORT_RSS_BOUND_MIB if (way, fault) == ("port_send", "reader_stalls") else RSS_BOUND_MIB
        )
        assert cell.rss_growth < bound, f"RSS grew {cell.rss_growth:.0f} MiB: {where}"
