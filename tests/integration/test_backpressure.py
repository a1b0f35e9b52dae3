"""Deep pipelines: every call resolves, memory stays bounded, order holds.

A caller keeps at most ``MAX_IN_FLIGHT`` calls unanswered on one proc
connection; the rest wait in order in the caller (or fail with
``OverloadedError`` under ``block=False``). A proc stops reading past its
backlog bound. A connection that drops fails exactly the calls on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh
from zmesh._client.calls import connections as _connections
from zmesh._client.calls import runtime as _runtime
from zmesh._wire import messages as w

from _actors import Journal

# Four times the in-flight window (MAX_IN_FLIGHT, 10,000): the window stays
# full (10,000 calls in the proc's pipe and backlog) while the caller's wait
# queue refills it three times over, in order. (It was 150,000: the same
# mechanism, five times as long.)
DEEP = 40_000
# A buffer argument travels as a ZeroMQ frame of its own, so every call is
# one ZeroMQ message (no batching): the load that once filled a pipe, had
# the connection dropped by ZMTP heartbeats, and aborted in libzmq.
BUF = memoryview(b"12345678")


class Tagger(Journal):
    @zmesh.endpoint
    async def tag(self, i: int, buf: memoryview) -> int:
        return i

    @zmesh.endpoint
    async def work(self, i: int, buf: memoryview) -> int:
        # ~20 µs of work a call: a proc that handles calls slower than a
        # caller sends them, so the calls pile up somewhere.
        until = time.perf_counter() + 2e-5
        while time.perf_counter() < until:
            pass
        return i

    @zmesh.endpoint
    async def slow(self, i: int, seconds: float) -> int:
        await asyncio.sleep(seconds)
        self.log.append(i)
        return i


def _conn(mesh: zmesh.ActorMesh[Any]) -> _connections.ProcConn:
    rt, _ = _runtime.current()
    return rt.conns[mesh._refs[0].addr]


def _set_limit(monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    """Lower the per-connection in-flight limit: the runtime reads its own copy
    on every call, the connections (their wait queues) theirs."""
    monkeypatch.setattr(_runtime, "MAX_IN_FLIGHT", limit)
    monkeypatch.setattr(_connections, "MAX_IN_FLIGHT", limit)


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A per-connection in-flight limit small enough to see it work."""
    _set_limit(monkeypatch, 50)
    yield 50


# ------------------------------------------------------------ at depth


@pytest.mark.stress
@pytest.mark.timeout(300)
@pytest.mark.anyio
async def test_40k_pipelined_call_ones_all_resolve() -> None:
    mesh = await Tagger.options().as_actor()
    t0 = time.monotonic()
    futures = [asyncio.ensure_future(mesh.tag.call_one(i, BUF)) for i in range(DEEP)]
    conn = _conn(mesh)
    # Memory in ZeroMQ stays bounded: the rest waits here, in order.
    assert len(conn.pending) <= _connections.MAX_IN_FLIGHT
    assert len(conn.waiting) >= DEEP - _connections.MAX_IN_FLIGHT
    _, pending = await asyncio.wait(futures, timeout=90)
    assert not pending, f"{len(pending)} of {DEEP} calls never resolved"
    assert [f.result() for f in futures] == list(range(DEEP))
    assert mesh.state().status == zmesh.Status.RUNNING
    print(f"{DEEP} pipelined calls in {time.monotonic() - t0:.1f}s")


@pytest.mark.stress
@pytest.mark.timeout(300)
def test_40k_pipelined_calls_from_plain_code_all_resolve() -> None:
    mesh = Tagger.options().as_actor().get(timeout=60)
    futures = [mesh.work.call_one(i, BUF) for i in range(DEEP)]
    deadline = time.monotonic() + 120
    assert [f.get(timeout=max(0.01, deadline - time.monotonic())) for f in futures] == list(
        range(DEEP)
    )


@pytest.mark.stress
@pytest.mark.timeout(300)
@pytest.mark.anyio
async def test_fan_out_calls_at_depth_all_resolve() -> None:
    mesh = await Tagger.options(procs=2).as_actor()
    n = 40_000  # to each proc, four times its in-flight window; 80,000 replies
    futures = [asyncio.ensure_future(mesh.tag.call(i, BUF)) for i in range(n)]
    _, pending = await asyncio.wait(futures, timeout=120)
    assert not pending, f"{len(pending)} of {n} fan-out calls never resolved"
    assert [f.result().values() for f in futures] == [[i, i] for i in range(n)]


# ------------------------------------------------------------ the mechanism


@pytest.mark.anyio
async def test_calls_over_the_limit_wait_in_order_and_all_resolve(small_limit: int) -> None:
    mesh = await Tagger.options().as_actor()
    n = 2000
    peak = 0
    futures = []
    for i in range(n):
        futures.append(asyncio.ensure_future(mesh.append.call_one(i)))
        if i % 2:
            mesh.append.broadcast(-i)  # oneways keep their place in the order too
    conn = _conn(mesh)
    assert len(conn.pending) == small_limit
    while not all(f.done() for f in futures):
        peak = max(peak, len(conn.pending))
        await asyncio.sleep(0)
    assert peak <= small_limit
    assert [f.result() for f in futures] == list(range(n))
    expected = []
    for i in range(n):
        expected.append(i)
        if i % 2:
            expected.append(-i)
    assert await mesh.take.call_one() == expected
    # What is left in flight is only the standing watch of the actor's death.
    assert not conn.waiting and all(getattr(r, "standing", False) for r in conn.pending.values())


@pytest.mark.anyio
async def test_block_false_fails_at_once_with_overloaded_error(small_limit: int) -> None:
    mesh = await Tagger.options().as_actor()
    held = [asyncio.ensure_future(mesh.slow.call_one(i, 0.01)) for i in range(small_limit)]
    eager = mesh.append.options(block=False)
    fut = eager.call_one(-1)
    assert fut.done()  # refused at once, nothing was sent
    with pytest.raises(zmesh.OverloadedError, match=f"limit {small_limit} calls") as info:
        await fut
    assert info.value.mesh == mesh.proc_mesh and info.value.rank == 0
    assert isinstance(info.value, zmesh.ZmeshError)
    with pytest.raises(zmesh.OverloadedError):
        await eager.call(-2)  # the fan-out adverb too
    assert [await f for f in held] == list(range(small_limit))
    assert await eager.call_one(7) == 7  # room again: it goes
    log = await mesh.take.call_one()
    assert -1 not in log and -2 not in log and 7 in log


@pytest.mark.anyio
async def test_a_waiting_call_that_times_out_or_is_cancelled_is_never_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _set_limit(monkeypatch, 2)
    mesh = await Tagger.options().as_actor()
    first = [asyncio.ensure_future(mesh.slow.call_one(i, 0.3)) for i in range(2)]
    late = mesh.slow.options(timeout=0.1).call_one(10, 0.0)  # waits behind the two
    cancelled = asyncio.ensure_future(mesh.slow.call_one(11, 0.0))
    after = asyncio.ensure_future(mesh.slow.call_one(12, 0.0))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(zmesh.CallTimeoutError):
        await late
    assert [await f for f in first] == [0, 1]
    assert await after == 12
    assert await mesh.take.call_one() == [0, 1, 12]


@pytest.mark.anyio
async def test_a_proc_stops_reading_past_its_backlog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZMESH_PROC_MAX_BACKLOG", "100")  # procs take ZMESH_* from the spawner
    mesh = await Tagger.options().as_actor()
    n = 3000
    results = await asyncio.gather(*(_aw(mesh.append.call_one(i)) for i in range(n)))
    assert results == list(range(n))
    assert await mesh.take.call_one() == list(range(n))
    # The proc's own account: its mailbox never held much more than the
    # bound (reads stop between ZeroMQ messages, and one may be a batch).
    rt, _ = _runtime.current()
    agent = rt.controller.agents[mesh._refs[0].agent]

    async def peak() -> int | None:
        reply = await agent.request(w.GetStats)
        for p in reply.stats.procs:
            if p.mesh == mesh.proc_mesh:
                return max((a.queue_peak for a in p.actors), default=0)
        return None

    deadline = time.monotonic() + 10
    seen: int | None = None
    while time.monotonic() < deadline:
        seen = await peak()
        if seen:  # statistics reach the agent about once a second
            break
        await asyncio.sleep(0.2)
    assert seen is not None and 0 < seen <= 100 + 2 * 64, seen


async def _aw(fut: zmesh.Future[int]) -> int:
    return await fut


# ------------------------------------------------------------ a dropped connection


@pytest.mark.anyio
async def test_a_dropped_connection_fails_exactly_its_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # This proc accepts parts of up to 1 MiB; the client's own limit is larger,
    # so a 2 MiB part gets out and the proc drops the connection over it: a
    # real disconnect, with calls on it.
    monkeypatch.setenv("ZMESH_MAX_MSG_SIZE", str(1 << 20))
    mesh = await Tagger.options().as_actor()
    assert await mesh.append.call_one(1) == 1
    ref = mesh._refs[0]
    t0 = time.monotonic()
    big = asyncio.ensure_future(mesh.tag.call_one(2, memoryview(bytearray(2 << 20))))
    behind = [asyncio.ensure_future(mesh.append.call_one(i)) for i in range(3, 8)]
    for fut in [big, *behind]:
        with pytest.raises(zmesh.ConnectionLostError) as info:
            await asyncio.wait_for(fut, 10)
        err = info.value
        assert isinstance(err, zmesh.SupervisionError)
        assert (err.mesh, err.rank, err.host, err.log_path) == (
            ref.mesh, ref.rank, ref.host, ref.log_path,
        )  # fmt: skip
        assert "may or may not have run" in str(err)
    assert time.monotonic() - t0 < 5
    # The proc is alive, and later calls go out on a fresh connection.
    assert mesh.state().status == zmesh.Status.RUNNING
    assert await asyncio.wait_for(_aw(mesh.append.call_one(9)), 10) == 9
    log = await mesh.take.call_one()
    assert log[0] == 1 and log[-1] == 9


def test_a_dropped_connection_fails_its_calls_from_plain_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZMESH_MAX_MSG_SIZE", str(1 << 20))
    mesh = Tagger.options().as_actor().get(timeout=60)
    big = mesh.tag.call_one(2, memoryview(bytearray(2 << 20)))
    with pytest.raises(zmesh.ConnectionLostError):
        big.get(timeout=10)
    assert mesh.append.call_one(5).get(timeout=10) == 5  # on a new connection
