"""Generator endpoints: items stream back in order, with flow control and cancellation.

A ``def`` generator or an async generator endpoint, called with ``call_one``
(one actor) or ``call`` (every actor, ``(point, item)`` pairs), streams its
items as they are made. The producer runs at most ``window`` items ahead of
its consumer; breaking out of the loop, closing the stream or the consumer
dying closes the generator (its ``finally`` runs); a producer that dies ends
the stream with ``SupervisionError`` at once.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import zmesh

pytestmark = pytest.mark.anyio


class Gen(zmesh.Actor):
    def __init__(self) -> None:
        self.made = 0  # items produced by the latest stream
        self.closed: list[str] = []  # streams whose ``finally`` ran, by tag

    @zmesh.endpoint
    def count(self, n: int, tag: str = "") -> Iterator[int]:
        self.made = 0
        try:
            for i in range(n):
                self.made += 1
                yield i
        finally:
            self.closed.append(tag)

    @zmesh.endpoint
    async def acount(self, n: int, tag: str = "", pause: float = 0.0) -> AsyncIterator[int]:
        self.made = 0
        try:
            for i in range(n):
                self.made += 1
                yield i
                if pause:
                    await asyncio.sleep(pause)
        finally:
            self.closed.append(tag)

    @zmesh.endpoint(window=4)
    async def blobs(self, n: int, size: int) -> AsyncIterator[bytes]:
        self.made = 0
        for _ in range(n):
            self.made += 1
            yield b"x" * size

    @zmesh.endpoint
    async def prefilled(self, n: int, delay: float) -> AsyncIterator[int]:
        await asyncio.sleep(delay)  # the first item takes a while
        for i in range(n):
            yield i
            await asyncio.sleep(0.01)

    @zmesh.endpoint
    async def sleepy(self) -> AsyncIterator[int]:
        await asyncio.sleep(30)
        yield 0

    @zmesh.endpoint
    async def fail_after(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i
        raise ValueError(f"after {n}")

    @zmesh.endpoint
    def sync_fail_after(self, n: int) -> Iterator[int]:
        yield from range(n)
        raise KeyError("sync")

    @zmesh.endpoint
    async def ranked(self, n: int, fail_rank: int = -1) -> AsyncIterator[int]:
        me = zmesh.current_rank().rank
        try:
            for i in range(n):
                if me == fail_rank and i == 2:
                    raise RuntimeError(f"rank {me} fails")
                yield me * 1000 + i
                await asyncio.sleep(0.01)
        finally:
            self.closed.append(f"ranked{me}")

    @zmesh.endpoint(concurrent=True)  # runs while a stream holds the actor
    async def made_so_far(self) -> int:
        return self.made

    @zmesh.endpoint
    async def closed_tags(self) -> list[str]:
        return list(self.closed)

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.fixture
async def gen() -> AsyncIterator[zmesh.ActorMesh[Gen]]:
    mesh = await Gen.options().as_actor()
    yield mesh
    await mesh.stop()


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def eventually(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


# ------------------------------------------------------------------ order


@pytest.mark.parametrize("endpoint", ["count", "acount"])
async def test_ten_thousand_items_arrive_in_order(gen: Any, endpoint: str) -> None:
    items = [x async for x in getattr(gen, endpoint).call_one(10_000)]
    assert items == list(range(10_000))


def test_a_stream_reads_with_plain_for_in_sync_code() -> None:
    mesh: Any = Gen.options().as_actor().get(timeout=30)  # (call_one is typed as a Future)
    try:
        assert list(mesh.count.call_one(10_000)) == list(range(10_000))
        assert list(mesh.acount.call_one(5)) == [0, 1, 2, 3, 4]
    finally:
        mesh.stop().get(timeout=10)


@pytest.mark.parametrize(("endpoint", "error"), [("fail_after", "ValueError"),
                                                 ("sync_fail_after", "KeyError")])  # fmt: skip
async def test_an_error_arrives_after_the_items_before_it(
    gen: Any, endpoint: str, error: str
) -> None:
    got = []
    with pytest.raises(zmesh.ActorError) as info:
        async for x in getattr(gen, endpoint).call_one(3):
            got.append(x)
    assert got == [0, 1, 2]
    assert info.value.remote_type == error and info.value.rank == 0
    assert await gen.made_so_far.call_one() >= 0  # the actor lives on


async def test_a_mesh_call_yields_point_item_pairs_from_every_rank() -> None:
    mesh: Any = await Gen.options(procs=4).as_actor()
    try:
        pairs = [(p.rank, x) async for p, x in mesh.ranked.call(50)]
        assert sorted(pairs) == sorted((r, r * 1000 + i) for r in range(4) for i in range(50))
        for r in range(4):  # each rank's items in its order
            assert [x for q, x in pairs if q == r] == [r * 1000 + i for i in range(50)]
    finally:
        await mesh.stop()


async def test_one_ranks_error_ends_a_mesh_stream_and_closes_the_others() -> None:
    mesh: Any = await Gen.options(procs=3).as_actor()
    try:
        got = []
        with pytest.raises(zmesh.ActorError, match="rank 1 fails") as info:
            async for point, x in mesh.ranked.call(10_000, 1):
                got.append((point.rank, x))
        assert info.value.rank == 1
        assert [x for r, x in got if r == 1] == [1000, 1001]  # its items before the error
        for r in (0, 2):  # the others' generators closed: their finally ran
            assert await mesh.slice(procs=r).closed_tags.call_one() == [f"ranked{r}"]
    finally:
        await mesh.stop()


class Reader(zmesh.Actor):
    @zmesh.endpoint
    async def total(self, producer: Any, n: int) -> int:
        """Read a stream from another actor, inside an actor."""
        return sum([x async for x in producer.acount.call_one(n)])


async def test_an_actor_reads_a_stream_from_another_actor(gen: Any) -> None:
    reader = await Reader.options().as_actor()
    try:
        assert await reader.total.call_one(gen, 1000) == sum(range(1000))
    finally:
        await reader.stop()


# ------------------------------------------------------------ flow control


@pytest.mark.parametrize("endpoint", ["count", "acount"])
async def test_the_producer_runs_at_most_a_window_ahead(gen: Any, endpoint: str) -> None:
    stream = getattr(gen, endpoint).options(window=8).call_one(10_000)
    first = [await stream.__anext__() for _ in range(3)]
    assert first == [0, 1, 2]
    await asyncio.sleep(0.5)  # a consumer that stops reading
    made = await gen.made_so_far.call_one()
    assert 3 <= made <= 3 + 8, made
    await stream.aclose()


async def test_a_slow_consumer_keeps_the_procs_memory_flat(gen: Any) -> None:
    pid = await gen.pid.call_one()
    stream = gen.blobs.call_one(400, 1 << 20)  # 400 MB if nothing held the producer back
    seen = 0
    async for item in stream:
        assert len(item) == 1 << 20
        seen += 1
        if seen == 10:
            base = rss(pid), rss(os.getpid())
        if seen >= 10:
            await asyncio.sleep(0.02)  # reads slowly from now on
        if seen == 40:
            break
    proc_growth, client_growth = rss(pid) - base[0], rss(os.getpid()) - base[1]
    assert proc_growth < 32 << 20, f"the proc grew by {proc_growth >> 20} MB"
    assert client_growth < 32 << 20, f"the client grew by {client_growth >> 20} MB"
    assert await gen.made_so_far.call_one() <= 40 + 4


# ------------------------------------------------------------ cancellation


@pytest.mark.parametrize("endpoint", ["count", "acount"])
async def test_break_after_three_items_runs_the_generators_finally(gen: Any, endpoint: str) -> None:
    async for x in getattr(gen, endpoint).call_one(1_000_000, "broke"):
        if x == 2:
            break
    # The actor handles one message at a time: this runs once the stream closed.
    assert await gen.closed_tags.call_one() == ["broke"]
    assert await gen.made_so_far.call_one() < 1000


async def test_aclose_reaches_a_generator_that_is_awaiting(gen: Any) -> None:
    stream = gen.acount.call_one(10, "paused", 30.0)  # sleeps 30 s after each item
    assert await stream.__anext__() == 0
    t0 = time.monotonic()
    await stream.aclose()
    assert await gen.closed_tags.call_one() == ["paused"]
    assert time.monotonic() - t0 < 1.0


def test_break_in_sync_code_runs_the_generators_finally() -> None:
    mesh: Any = Gen.options().as_actor().get(timeout=30)
    try:
        for x in mesh.count.call_one(1_000_000, "sync"):
            if x == 2:
                break
        assert mesh.closed_tags.call_one().get(timeout=10) == ["sync"]
    finally:
        mesh.stop().get(timeout=10)


CONSUMER = textwrap.dedent(
    """
    import pickle, sys
    mesh = pickle.loads(bytes.fromhex(sys.argv[1]))
    for x in mesh.count.call_one(10**9, "dead"):
        if x == 100:
            print("reading", flush=True)
    """
)


async def test_a_consumer_that_dies_closes_the_generator(gen: Any) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CONSUMER, pickle.dumps(gen).hex()],
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ) as child:  # fmt: skip
        try:
            assert child.stdout is not None
            line = await asyncio.get_running_loop().run_in_executor(None, child.stdout.readline)
            assert line == b"reading\n"
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            await eventually(gen.closed_tags.call_one, 5.0, "the generator to close")
            assert await gen.closed_tags.call_one() == ["dead"]
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)


# ------------------------------------------------------------ failures


async def test_kill_9_of_the_producer_ends_the_stream_with_supervision_error(gen: Any) -> None:
    pid = await gen.pid.call_one()
    stream = gen.acount.call_one(10**9, "", 0.001)
    assert await stream.__anext__() == 0
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(zmesh.SupervisionError) as info:
        async for _ in stream:
            pass
    assert time.monotonic() - t0 < 0.5
    assert info.value.rank == 0 and info.value.log_path


async def test_a_timeout_bounds_the_wait_for_the_first_item(gen: Any) -> None:
    t0 = time.monotonic()
    with pytest.raises(zmesh.CallTimeoutError):
        async for _ in gen.acount.options(timeout=0.5).call_one(3, "slow", 30.0):
            pass  # the first item comes at once; the second after 30 s
    assert time.monotonic() - t0 < 0.5 + 5.0
    assert await gen.closed_tags.call_one() == ["slow"]  # the generator closed
    with pytest.raises(zmesh.CallTimeoutError):
        async for _ in gen.sleepy.options(timeout=0.3).call_one():
            pass
    assert time.monotonic() - t0 < 0.8 + 5.0


async def test_a_stream_from_a_dead_rank_fails_before_sending(gen: Any) -> None:
    pid = await gen.pid.call_one()
    os.kill(pid, signal.SIGKILL)

    async def failed() -> bool:
        return bool(gen.state().status == zmesh.Status.FAILED)

    await eventually(failed, 10, "the rank to fail")
    with pytest.raises(zmesh.SupervisionError):
        async for _ in gen.count.call_one(3):
            pass


async def test_a_generator_endpoint_called_without_streaming_says_so(gen: Any) -> None:
    # A handle that does not know the endpoint streams sends a plain call.
    blind: Any = zmesh.ActorMesh(gen.actor, gen.cls_name, gen.endpoints, gen._shape, gen._refs)
    with pytest.raises(zmesh.EndpointError, match="generator endpoint"):
        await blind.count.call_one(3)
    assert [x async for x in gen.count.call_one(3)] == [0, 1, 2]
