"""A stream's reader goes away: the producing actor serves its next message (issue 23 item 1).

However a reader leaves a generator endpoint's stream (its proc killed
with SIGKILL, its mesh stopped, the client script that reads it killed, or a
reader that breaks out of its loop), the generator closes (its ``finally``
runs to its end, even one that awaits or raises) and the producing actor
goes on with its next message, whether it runs alone or as a service's
replica. Async and sync generators alike; real procs, real kills.
"""

from __future__ import annotations

import asyncio
import gc
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

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

# The producer's next plain call must be answered within this (it answers in
# milliseconds once the stream closed; a reader that dies is noticed within
# a quarter of a second of the producer running out of credit).
SERVE_BUDGET = 10.0

GENERATORS = ["agen", "sgen", "agen_awaits_in_finally", "agen_raises_in_finally",
              "sgen_raises_in_finally"]  # fmt: skip


class Producer(zmesh.Actor):
    """Endless streams, each noting in ``closed`` that its ``finally`` ran to its end."""

    def __init__(self) -> None:
        self.made = 0
        self.closed: list[str] = []

    @zmesh.endpoint
    async def agen(self, tag: str) -> AsyncIterator[int]:
        try:
            while True:
                self.made += 1
                yield self.made
        finally:
            self.closed.append(tag)

    @zmesh.endpoint
    def sgen(self, tag: str) -> Iterator[int]:
        try:
            while True:
                self.made += 1
                yield self.made
        finally:
            self.closed.append(tag)

    @zmesh.endpoint
    async def agen_awaits_in_finally(self, tag: str) -> AsyncIterator[int]:
        try:
            while True:
                self.made += 1
                yield self.made
        finally:
            await asyncio.sleep(0.05)  # a cleanup that awaits (a flush, a release)
            self.closed.append(tag)

    @zmesh.endpoint
    async def agen_raises_in_finally(self, tag: str) -> AsyncIterator[int]:
        try:
            while True:
                self.made += 1
                yield self.made
        finally:
            self.closed.append(tag)
            raise RuntimeError("a cleanup that fails")

    @zmesh.endpoint
    def sgen_raises_in_finally(self, tag: str) -> Iterator[int]:
        try:
            while True:
                self.made += 1
                yield self.made
        finally:
            self.closed.append(tag)
            raise RuntimeError("a cleanup that fails")

    @zmesh.endpoint(concurrent=True)  # answers while a stream holds the actor
    async def made_so_far(self) -> int:
        return self.made

    @zmesh.endpoint  # a plain message: it runs only once the actor is free again
    async def closed_tags(self) -> list[str]:
        return list(self.closed)


class Reader(zmesh.Actor):
    """Reads a producer's stream from its own proc."""

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def read_forever(self, producer: Any, endpoint: str, tag: str) -> int:
        n = 0
        async for _ in getattr(producer, endpoint)(tag):
            n += 1
        return n

    @zmesh.endpoint
    async def take(self, producer: Any, endpoint: str, tag: str, n: int) -> list[int]:
        got = []
        async for x in getattr(producer, endpoint)(tag):
            got.append(x)
            if len(got) == n:
                break
        return got


@pytest.fixture
async def producer() -> AsyncIterator[Any]:
    mesh = await Producer.options().as_actor()
    yield mesh
    await mesh.stop()


@pytest.fixture
async def reader() -> AsyncIterator[Any]:
    mesh = await Reader.options().as_actor()
    yield mesh
    await mesh.stop()


async def streaming(producer: Any, timeout: float = 20.0) -> None:
    """Wait until ``producer`` (an actor or a replica) has made items."""
    deadline = time.monotonic() + timeout
    while not await producer.made_so_far.options(timeout=5).call_one():
        assert time.monotonic() < deadline, f"the stream did not start within {timeout}s"
        await asyncio.sleep(0.02)


async def serves_next(producer: Any, tag: str) -> None:
    """The producer answers its next plain message, and the stream's generator closed."""
    t0 = time.monotonic()
    tags = await producer.closed_tags.options(timeout=SERVE_BUDGET).call_one()
    assert tag in tags, f"the generator of {tag!r} did not finish its finally: {tags}"
    assert time.monotonic() - t0 < SERVE_BUDGET


# ------------------------------------------------------------ an actor reads


@pytest.mark.parametrize("endpoint", GENERATORS)
async def test_the_reader_proc_killed_leaves_the_producer_serving(
    producer: Any, reader: Any, endpoint: str
) -> None:
    pid = await reader.pid.call_one()
    reading = reader.read_forever.call_one(producer, endpoint, "killed")
    await streaming(producer)
    os.kill(pid, signal.SIGKILL)
    await serves_next(producer, "killed")
    with pytest.raises(zmesh.SupervisionError):
        await reading


@pytest.mark.parametrize("endpoint", ["agen", "sgen", "agen_awaits_in_finally"])
async def test_the_reader_mesh_stopped_leaves_the_producer_serving(
    producer: Any, reader: Any, endpoint: str
) -> None:
    reading = reader.read_forever.call_one(producer, endpoint, "stopped")
    await streaming(producer)
    await reader.stop()
    await serves_next(producer, "stopped")
    with pytest.raises(zmesh.ActorStoppedError):
        await reading


@pytest.mark.parametrize("endpoint", GENERATORS)
async def test_a_reader_actor_that_breaks_early_leaves_the_producer_serving(
    producer: Any, reader: Any, endpoint: str
) -> None:
    assert len(await reader.take.call_one(producer, endpoint, "broke", 3)) == 3
    await serves_next(producer, "broke")
    # And again: the actor is whole, not merely answering once.
    assert len(await reader.take.call_one(producer, endpoint, "again", 100)) == 100
    await serves_next(producer, "again")


# ------------------------------------------------------------ the client reads


CLIENT = textwrap.dedent(
    """
    import pickle, sys
    mesh = pickle.loads(bytes.fromhex(sys.argv[1]))
    for x in getattr(mesh, sys.argv[2]).call_one("client"):
        if x == 100:
            print("reading", flush=True)
    """
)


@pytest.mark.parametrize("endpoint", GENERATORS)
async def test_the_reading_client_killed_leaves_the_producer_serving(
    producer: Any, endpoint: str
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-c", CLIENT, pickle.dumps(producer).hex(), endpoint]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, env=env) as child:
        try:
            assert child.stdout is not None
            line = await asyncio.get_running_loop().run_in_executor(None, child.stdout.readline)
            assert line == b"reading\n"
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            await serves_next(producer, "client")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)


@pytest.mark.parametrize("endpoint", GENERATORS)
async def test_a_client_that_breaks_early_leaves_the_producer_serving(
    producer: Any, endpoint: str
) -> None:
    async for x in getattr(producer, endpoint).call_one("async-for"):
        if x >= 3:
            break
    await serves_next(producer, "async-for")

    def plain() -> None:
        for x in getattr(producer, endpoint).call_one("for"):
            if x >= 3:
                break

    await asyncio.to_thread(plain)
    await serves_next(producer, "for")
    stream = getattr(producer, endpoint).call_one("aclose")
    await stream.__anext__()
    await stream.aclose()
    await serves_next(producer, "aclose")
    stream = getattr(producer, endpoint).call_one("dropped")  # stops reading, and lets go
    await stream.__anext__()
    del stream
    gc.collect()
    await serves_next(producer, "dropped")


@pytest.mark.stress
async def test_a_hundred_readers_that_leave_leave_the_producer_serving(producer: Any) -> None:
    """Readers that break at once, mid-window, or after credit came back, in a row."""
    for i in range(100):
        endpoint = GENERATORS[i % len(GENERATORS)]
        async for x in getattr(producer, endpoint).call_one(f"r{i}"):
            if x % (1 + i % 97) == 0:
                break
    tags = await producer.closed_tags.options(timeout=SERVE_BUDGET).call_one()
    assert [t for t in tags if t.startswith("r")] == [f"r{i}" for i in range(100)]


# ------------------------------------------------------------ through a service


@pytest.mark.parametrize("endpoint", ["agen", "sgen", "agen_raises_in_finally"])
async def test_a_service_streams_reader_killed_leaves_the_replica_serving(
    reader: Any, endpoint: str
) -> None:
    svc: Any = await Producer.options(replicas=1).as_service()
    try:
        replica = svc.replica(0)
        pid = await reader.pid.call_one()
        reading = reader.read_forever.call_one(svc, endpoint, "svc-killed")
        await streaming(replica)
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        tags = await svc.closed_tags.options(timeout=SERVE_BUDGET)()
        assert "svc-killed" in tags
        assert time.monotonic() - t0 < SERVE_BUDGET
        # Every later call is served, and the service says so truthfully.
        for _ in range(20):
            assert "svc-killed" in await svc.closed_tags.options(timeout=SERVE_BUDGET)()
        stats = svc.statistics()
        assert stats.replicas[0].in_flight == 0
        with pytest.raises(zmesh.SupervisionError):
            await reading
    finally:
        await svc.stop()


@pytest.mark.parametrize("endpoint", ["agen", "sgen", "agen_awaits_in_finally"])
async def test_a_service_stream_read_by_a_client_that_breaks_leaves_the_replica_serving(
    endpoint: str,
) -> None:
    svc: Any = await Producer.options(replicas=1).as_service()
    try:
        for round_ in range(3):
            async for x in getattr(svc, endpoint)(f"svc-broke{round_}"):
                if x % 5 == 0:
                    break
            tags = await svc.closed_tags.options(timeout=SERVE_BUDGET)()
            assert f"svc-broke{round_}" in tags
        assert svc.statistics().replicas[0].in_flight == 0
    finally:
        await svc.stop()
