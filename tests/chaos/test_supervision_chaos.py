"""The supervision plane under real failures: real processes, real signals.

Every test waits on conditions with deadlines, signals only procs of its own
meshes (by the pid the proc itself or the controller reports), and stops
what it started (the autouse fixture in conftest calls ``zmesh.shutdown()``;
``local_cluster`` stops its agents).

Measured latencies are printed (``pytest -s`` shows them) as ``LATENCY ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import zmq

import zmesh
from zmesh._client.calls import runtime as _runtime
from zmesh._shared.state import Rank, Status
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec
from zmesh.testing import local_cluster

from _actors import Ranked
from _helpers import latency, outcome, pid_alive, status_of, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]


class Worker(Ranked):
    def __init__(self) -> None:
        self.count = 0

    @zmesh.endpoint
    async def slow(self, i: int) -> int:
        await asyncio.sleep(0.003)
        return i

    @zmesh.endpoint
    async def nap(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    @zmesh.endpoint
    async def bump(self) -> int:
        self.count += 1
        return self.count

    @zmesh.endpoint
    async def counter(self) -> int:
        return self.count


# ------------------------------------------------------------ helpers


async def force_resync(mesh: zmesh.ActorMesh[Any]) -> None:
    """Make the client re-read its agent's state (GetState) and wait until done."""
    rt, _ = _runtime.current()
    for conn in rt.controller.agents.values():
        conn._resync()
    await wait_until(
        lambda: all(not c.syncing for c in rt.controller.agents.values()), 5.0, "resync done"
    )


async def collect(mesh: zmesh.ActorMesh[Any], into: list[zmesh.SupervisionEvent]) -> None:
    async for ev in mesh.supervision_events():
        into.append(ev)


# ---------------------------------------------------------------- kill -9


async def test_kill9_with_1000_calls_in_flight() -> None:
    mesh = await Worker.options(procs=4).as_actor()
    victim = mesh.slice(procs=1)
    pid = await victim.pid.call_one()
    assert mesh.state().ranks[1].pid == pid

    calls = [asyncio.ensure_future(outcome(victim.slow.call_one(i))) for i in range(1000)]
    # Let a few answers come back, so the rest are really queued at the proc.
    await wait_until(lambda: sum(c.done() for c in calls) >= 20, 10.0, "first answers")
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    _, pending = await asyncio.wait(calls, timeout=2.0)
    assert not pending, f"{len(pending)} of 1000 calls hung more than 2 s after kill -9"
    results = [c.result() for c in calls]
    ok = [(i, v) for i, (_, good, v) in enumerate(results) if good]
    errors = [v for _, good, v in results if not good]
    assert all(i == v for i, v in ok)
    assert errors, "the kill came too late: every call had finished"
    assert all(isinstance(e, zmesh.SupervisionError) for e in errors), {type(e) for e in errors}
    last_error = max(t for t, good, _ in results if not good)
    latency("kill -9 -> SupervisionError of in-flight calls", last_error - killed)
    assert last_error - killed < 2.0
    print(f"(answered before the kill: {len(ok)}, failed: {len(errors)})")

    # The other ranks keep answering.
    for r in (0, 2, 3):
        assert await mesh.slice(procs=r).ping.options(timeout=5).call_one() == r
    assert status_of(mesh, 1) is Status.FAILED
    assert all(status_of(mesh, r) is Status.RUNNING for r in (0, 2, 3))
    assert mesh.state().status is Status.FAILED  # never healthier than its worst rank

    # Later calls to the dead rank fail at once, with the whole story.
    for call in (victim.slow.call_one(1), mesh.ping.call(), victim.ping.choose()):
        t0 = time.monotonic()
        with pytest.raises(zmesh.SupervisionError) as info:
            await call
        assert time.monotonic() - t0 < 0.1
        err = info.value
        assert err.mesh == mesh.proc_mesh
        assert err.rank == 1
        assert err.host == "local"
        assert err.reason == "killed by SIGKILL"
        assert err.log_path and err.log_path.endswith(".log") and os.path.exists(err.log_path)
        for part in (mesh.proc_mesh, "rank=1", "host=local", "killed by SIGKILL", err.log_path):
            assert part in str(err)
    # in-flight errors carry the same story
    assert {(e.rank, e.reason) for e in errors} == {(1, "killed by SIGKILL")}


# ------------------------------------------------ exactly one event per rank


class CloneSubscriber(threading.Thread):
    """A raw ZeroMQ "Clone" client of one agent, in its own thread.

    SUB to the agent's stream, wait for the welcome, ``GetState`` the mesh,
    then apply buffered and later events whose seq is past the snapshot.
    Counts every failure it is told of (snapshot or event) per (rank,
    generation): the protocol must tell each exactly once, with no dedup.
    """

    def __init__(self, control: str, stream: str, mesh: str, ranks: int) -> None:
        super().__init__(daemon=True)
        self.control, self.stream, self.mesh, self.n = control, stream, mesh, ranks
        self.welcomed = threading.Event()
        self.told: Counter[tuple[int, int]] = Counter()
        self.from_snapshot = 0
        self.from_stream = 0
        self.gaps = 0
        self.error: BaseException | None = None
        self.finished = False

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.finished = True

    def _run(self) -> None:
        ctx: zmq.Context[Any] = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        ctl = ctx.socket(zmq.DEALER)
        try:
            for s in (sub, ctl):
                s.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(self.stream)
            ctl.connect(self.control)
            self._follow(sub, ctl)
        finally:
            sub.close(linger=0)
            ctl.close(linger=0)

    def _follow(self, sub: zmq.Socket, ctl: zmq.Socket) -> None:
        stream_codec = Codec(w.STREAM)
        reply_codec = Codec(w.AGENT_REPLIES)
        out = Codec(w.AGENT_INBOX)
        deadline = time.monotonic() + 15.0
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(ctl, zmq.POLLIN)
        buffered: list[w.Event] = []
        snapshot: w.StateReply | None = None
        seq = 0
        state: dict[int, Rank] = {}
        quiet_beats = 0

        def tell(rank: int, st: w.RankState) -> None:
            self.told[(rank, st.generation)] += 1

        while time.monotonic() < deadline:
            for sock, _ in poller.poll(50):
                if sock is ctl:
                    snapshot = reply_codec.decode(ctl.recv_multipart())
                    assert isinstance(snapshot, w.StateReply)
                    seq = snapshot.seq
                    for m in snapshot.meshes:
                        if m.name != self.mesh:
                            continue
                        for rs in m.ranks:
                            state[rs.rank] = Rank(Status(rs.status), rs.generation)
                            if Status(rs.status).failure:
                                tell(rs.rank, rs)
                                self.from_snapshot += 1
                    for ev in buffered:
                        if ev.seq > seq:
                            seq = self._apply(ev, seq, tell)
                    buffered = []
                    continue
                msg = stream_codec.decode(sub.recv_multipart())
                if isinstance(msg, w.Heartbeat):
                    if msg.seq == -1:
                        if not self.welcomed.is_set():
                            self.welcomed.set()
                            ctl.send_multipart(out.encode(w.GetState(1, self.mesh)))
                        continue
                    if snapshot is None:
                        continue
                    if msg.seq > seq:
                        self.gaps += 1  # an event was lost: a real client re-reads state
                    if self._all_told() and msg.seq == seq:
                        quiet_beats += 1
                        if quiet_beats >= 3:  # the agent has nothing newer to say
                            return
                    continue
                if snapshot is None:
                    if self.welcomed.is_set():
                        buffered.append(msg)
                    continue
                seq = self._apply(msg, seq, tell)
        raise AssertionError(f"subscriber gave up: told {dict(self.told)}")

    def _apply(self, ev: w.Event, seq: int, tell: Callable[[int, w.RankState], None]) -> int:
        if ev.seq != seq + 1:
            self.gaps += 1
        if ev.mesh == self.mesh and Status(ev.state.status).failure:
            tell(ev.state.rank, ev.state)
            self.from_stream += 1
        return ev.seq

    def _all_told(self) -> bool:
        return {r for r, _ in self.told} >= set(range(self.n))


# A second client process: a fresh runtime that gets the mesh handle as a
# value and follows it with supervision_events(), joining after the fact.
_CLIENT = """
import asyncio, json, pickle, sys, time
from zmesh._client.calls import runtime as _runtime

async def main():
    mesh = pickle.loads(bytes.fromhex(sys.stdin.readline()))
    n = int(sys.argv[1])
    seen = []

    async def collect():
        async for ev in mesh.supervision_events():
            seen.append(ev)
            print(json.dumps([ev.rank, ev.generation, ev.status.value, ev.reason]), flush=True)

    task = asyncio.ensure_future(collect())
    deadline = time.monotonic() + 10
    while len(seen) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    rt, _ = _runtime.current()
    for conn in rt.controller.agents.values():
        conn._resync()  # re-read state: must not report anything twice
    while any(c.syncing for c in rt.controller.agents.values()) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    task.cancel()
    print("DONE", flush=True)

asyncio.run(main())
"""


async def second_client(mesh: zmesh.ActorMesh[Any], n: int) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CLIENT, str(n),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(pickle.dumps(mesh).hex().encode() + b"\n")
    await proc.stdin.drain()
    proc.stdin.close()
    return proc


def describe(control: str) -> w.AgentInfo:
    """Ask an agent who it is, with the raw wire message."""
    ctx: zmq.Context[Any] = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(control)
        s.send_multipart(Codec(w.AGENT_INBOX).encode(w.Describe(7)))
        assert s.poll(5000), "agent did not answer Describe"
        info = Codec(w.AGENT_REPLIES).decode(s.recv_multipart())
    finally:
        s.close(linger=0)
    assert isinstance(info, w.AgentInfo) and info.id == 7
    return info


async def test_exactly_one_failure_event_per_rank() -> None:
    n = 8
    with local_cluster(1) as agents:
        agent = agents[0]
        info = describe(agent.control)
        assert info.stream == agent.stream and info.label == agent.label

        mesh = await Worker.options(procs=n).as_actor()
        pids = (await mesh.pid.call()).values()
        assert pids == [mesh.state().ranks[r].pid for r in range(n)]

        seen_a: list[zmesh.SupervisionEvent] = []
        seen_b: list[zmesh.SupervisionEvent] = []
        iters = [asyncio.ensure_future(collect(mesh, seen)) for seen in (seen_a, seen_b)]
        early = CloneSubscriber(agent.control, info.stream, mesh.proc_mesh, n)
        early.start()
        await wait_until(early.welcomed.is_set, 5.0, "early subscriber welcomed")

        # The burst: half the mesh dies, a subscriber joins, the rest dies
        # while it is taking its snapshot.
        for pid in pids[: n // 2]:
            os.kill(pid, signal.SIGKILL)
        await wait_until(
            lambda: all(status_of(mesh, r) is Status.FAILED for r in range(n // 2)),
            2.0,
            "first half failed",
        )
        other = await second_client(mesh, n)
        late = CloneSubscriber(agent.control, info.stream, mesh.proc_mesh, n)
        late.start()
        await wait_until(late.welcomed.is_set, 5.0, "late subscriber welcomed")
        for pid in pids[n // 2 :]:
            os.kill(pid, signal.SIGKILL)

        await wait_until(
            lambda: len(seen_a) >= n and len(seen_b) >= n, 3.0, "every failure reported"
        )
        # Re-reading state must not report anything twice.
        await force_resync(mesh)
        latest = CloneSubscriber(agent.control, info.stream, mesh.proc_mesh, n)
        latest.start()
        seen_c: list[zmesh.SupervisionEvent] = []
        iters.append(asyncio.ensure_future(collect(mesh, seen_c)))  # joins after the fact
        await wait_until(lambda: len(seen_c) >= n, 2.0, "late iterator replays failures")
        for sub in (early, late, latest):
            await wait_until(partial(getattr, sub, "finished"), 15.0, "subscriber done")
        # the client's own controller after its resync, and a last wait for
        # anything in the sockets: still one event per rank
        await force_resync(mesh)
        for t in iters:
            t.cancel()
        await asyncio.gather(*iters, return_exceptions=True)

        for seen in (seen_a, seen_b, seen_c):
            assert sorted(e.rank for e in seen) == list(range(n)), seen
            assert all(e.status is Status.FAILED for e in seen)
            assert all(e.reason == "killed by SIGKILL" for e in seen)
            assert all(e.mesh == mesh.proc_mesh and e.host == agent.label for e in seen)
            assert all(e.generation == 1 and e.exit_code == -9 for e in seen)
        for sub in (early, late, latest):
            assert sub.error is None, sub.error
            assert sub.gaps == 0
            assert dict(sub.told) == {(r, 1): 1 for r in range(n)}, sub.told
            print(
                f"subscriber knew {sub.from_snapshot} failure(s) from its snapshot "
                f"and {sub.from_stream} from the stream"
            )
        assert early.from_stream == n
        assert late.from_snapshot >= n // 2  # joined in the middle of the burst
        assert latest.from_snapshot == n

        try:
            out, _ = await asyncio.wait_for(other.communicate(), 20.0)
        finally:
            if other.returncode is None:
                other.kill()
                await other.wait()
        assert other.returncode == 0
        lines = out.decode().splitlines()
        assert lines[-1] == "DONE", lines
        told = sorted(json.loads(line) for line in lines[:-1])
        assert told == [[r, 1, "Failed", "killed by SIGKILL"] for r in range(n)], told
        assert mesh.state().status is Status.FAILED


# ---------------------------------------------------------------- SIGSTOP


async def test_sigstop_is_timeout_and_sigcont_does_not_revive() -> None:
    mesh = await Worker.options(procs=2).as_actor()
    victim = mesh.slice(procs=0)
    pid = await victim.pid.call_one()
    events: list[zmesh.SupervisionEvent] = []
    watcher = asyncio.ensure_future(collect(mesh, events))
    inflight = asyncio.ensure_future(outcome(victim.nap.call_one(30.0)))  # sent at once

    os.kill(pid, signal.SIGSTOP)
    try:
        took = await wait_until(
            lambda: status_of(mesh, 0) is Status.TIMEOUT, 3.0, "SIGSTOPped rank is Timeout"
        )
        latency("SIGSTOP -> Timeout", took)
        _, ok, err = await asyncio.wait_for(inflight, 1.0)
        assert not ok and isinstance(err, zmesh.SupervisionError), err
        assert "heartbeat" in err.reason
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    # The woken (or already reaped) generation does not come back.
    await wait_until(lambda: not pid_alive(pid), 5.0, "timed-out proc is gone")
    await force_resync(mesh)
    rt, _ = _runtime.current()
    conn = next(iter(rt.controller.agents.values()))
    reply = await conn.request(lambda i: w.GetState(i, mesh.proc_mesh))
    (agent_view,) = reply.meshes
    assert agent_view.ranks[0].status == "Timeout"
    assert agent_view.status == "Timeout"
    assert status_of(mesh, 0) is Status.TIMEOUT
    with pytest.raises(zmesh.SupervisionError) as info:
        await victim.ping.options(timeout=5).call_one()
    assert info.value.rank == 0 and info.value.mesh == mesh.proc_mesh
    assert await mesh.slice(procs=1).ping.options(timeout=5).call_one() == 1
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    assert [(e.rank, e.status) for e in events] == [(0, Status.TIMEOUT)]


# ---------------------------------------------------------------- agent lost


async def test_agent_killed_ranks_become_unknown() -> None:
    with local_cluster(1) as agents:
        mesh = await Worker.options(procs=2).as_actor()
        assert (await mesh.ping.call()).values() == [0, 1]
        events: list[zmesh.SupervisionEvent] = []
        watcher = asyncio.ensure_future(collect(mesh, events))
        inflight = [
            asyncio.ensure_future(outcome(mesh.slice(procs=r).nap.call_one(30.0))) for r in (0, 1)
        ]  # sent at once: in flight from here

        killed = time.monotonic()
        agents[0].kill()
        took = await wait_until(
            lambda: all(status_of(mesh, r) is Status.UNKNOWN for r in (0, 1)),
            2.0,
            "ranks Unknown after the agent was killed",
        )
        latency("agent kill -> Unknown", took)
        left = max(0.1, 2.5 - (time.monotonic() - killed))
        _, pending = await asyncio.wait(inflight, timeout=left)
        assert not pending, "calls in flight hung after the agent died"
        for t in inflight:
            _, ok, err = t.result()
            assert not ok and isinstance(err, zmesh.SupervisionError), err
            assert "unreachable" in err.reason
        for call in (mesh.slice(procs=0).ping.call_one(), mesh.ping.call()):
            t0 = time.monotonic()
            with pytest.raises(zmesh.SupervisionError):
                await call
            assert time.monotonic() - t0 < 0.1
        await wait_until(lambda: len(events) >= 2, 1.0, "Unknown events")
        assert sorted((e.rank, e.status) for e in events) == [
            (0, Status.UNKNOWN),
            (1, Status.UNKNOWN),
        ]
        assert mesh.state().status is Status.UNKNOWN
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


# ---------------------------------------------------------------- __supervise__


class Child(zmesh.Actor):
    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def crash(self) -> None:
        os._exit(3)


class Parent(zmesh.Actor):
    def __init__(self, handle: bool) -> None:
        self.handle = handle
        self.failures: list[str] = []
        self.child: Any = None

    def __supervise__(self, failure: zmesh.SupervisionEvent) -> bool:
        self.failures.append(f"{failure.rank}:{failure.status.value}:{failure.reason}")
        return self.handle

    @zmesh.endpoint
    async def spawn_child(self) -> int:
        self.child = await Child.options(procs=1).as_actor()
        return await self.child.pid.call_one()

    @zmesh.endpoint
    async def crash_child(self) -> None:
        self.child.crash.broadcast()

    @zmesh.endpoint
    async def seen(self) -> list[str]:
        return list(self.failures)

    @zmesh.endpoint
    async def ping(self) -> str:
        return "pong"


async def test_supervise_true_handles_child_failure() -> None:
    parent = await Parent.options().as_actor(True)
    child_pid = await parent.spawn_child.options(timeout=60).call_one()
    assert pid_alive(child_pid)
    events: list[zmesh.SupervisionEvent] = []
    watcher = asyncio.ensure_future(collect(parent, events))
    await parent.crash_child.call_one()

    async def seen() -> list[str]:
        return await parent.seen.options(timeout=5).call_one()

    deadline = time.monotonic() + 5.0
    while not (got := await seen()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert got == ["0:Failed:exited with code 3"]
    assert await parent.ping.options(timeout=5).call_one() == "pong"
    assert status_of(parent, 0) is Status.RUNNING
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    assert events == []


async def test_supervise_false_escalates_to_owner() -> None:
    parent = await Parent.options().as_actor(False)
    await parent.spawn_child.options(timeout=60).call_one()
    events: list[zmesh.SupervisionEvent] = []
    watcher = asyncio.ensure_future(collect(parent, events))
    await parent.crash_child.call_one()
    await wait_until(lambda: events, 5.0, "the parent's failure reaches the root")
    (ev,) = events
    # The parent actor failed, not its proc (as in Monarch), with a chained reason.
    assert ev.mesh == "parent" and ev.rank == 0 and ev.status is Status.FAILED
    assert ev.reason.startswith("The actor test_supervision_chaos.Parent parent")
    assert ev.reason.endswith("rank 0 failed: exited with code 3")
    with pytest.raises(zmesh.SupervisionError, match=r"Endpoint call parent\.ping"):
        await parent.ping.options(timeout=5).call_one()
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)


# ---------------------------------------------------------------- timeouts


async def test_call_timeout_and_late_requests_are_skipped() -> None:
    mesh = await Worker.options().as_actor()
    t0 = time.monotonic()
    with pytest.raises(zmesh.CallTimeoutError) as info:
        await mesh.nap.options(timeout=0.2).call_one(5.0)
    took = time.monotonic() - t0
    latency("0.2 s call timeout", took)
    assert 0.18 <= took < 0.5
    assert info.value.mesh == mesh.proc_mesh and info.value.rank == 0
    assert isinstance(info.value, TimeoutError)

    # Queue requests behind the 5 s nap; they expire in the queue.
    queued = [mesh.bump.options(timeout=0.2).call_one() for _ in range(5)]
    for fut in queued:
        with pytest.raises(zmesh.CallTimeoutError):
            await fut
    # queued behind the nap and the expired bumps: by then they were skipped
    assert await mesh.counter.options(timeout=10).call_one() == 0
    assert await mesh.bump.options(timeout=10).call_one() == 1
    assert status_of(mesh, 0) is Status.RUNNING


# ---------------------------------------------------------------- clean stop


async def test_clean_stop_is_not_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zmesh")
    mesh = await Worker.options(procs=2).as_actor()
    assert (await mesh.ping.call()).values() == [0, 1]
    events: list[zmesh.SupervisionEvent] = []
    watcher = asyncio.ensure_future(collect(mesh, events))
    await mesh.stop()
    await wait_until(
        lambda: all(status_of(mesh, r) is Status.STOPPED for r in (0, 1)), 5.0, "ranks Stopped"
    )
    await force_resync(mesh)
    for call in (mesh.ping.call(), mesh.slice(procs=1).ping.call_one()):
        with pytest.raises(zmesh.ActorStoppedError) as info:
            await call
        # "You stopped it": its own class (a SupervisionError too, as in Monarch).
        assert type(info.value) is zmesh.ActorStoppedError
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    assert events == []
    noisy = [
        r for r in caplog.records if r.name.startswith("zmesh") and r.levelno >= logging.WARNING
    ]
    assert not noisy, caplog.text


# ---------------------------------------------------------------- no listener


async def test_unhandled_failure_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="zmesh")
    mesh = await Worker.options().as_actor()
    pid = await mesh.pid.call_one()
    os.kill(pid, signal.SIGKILL)

    def logged() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "zmesh" and mesh.proc_mesh in r.getMessage()]

    await wait_until(logged, 2.0, "failure logged")
    (record,) = logged()
    assert record.levelno == logging.ERROR
    text = record.getMessage()
    log_path = mesh.state().ranks[0].log_path
    assert log_path
    for part in (mesh.proc_mesh, "rank 0", "local", "killed by SIGKILL", log_path):
        assert part in text, (part, text)
