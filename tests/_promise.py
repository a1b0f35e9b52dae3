"""The ways of calling that tests/chaos/test_promise_matrix.py holds to the promise.

A proc imports the module of the class it unpickles, so the actors and the
``drive`` function live here, importing nothing but zmesh (a test module
imports pytest, ~0.2 s per proc): the same ``drive`` runs in the test's own
process (the client calls) and inside a ``Reader`` actor (an actor calls, so
that the reader can be killed or stopped).

Every producer endpoint writes its pid to a *marker* file when its work is
under way, so a test injects its fault while the call is in flight (not
before it left, not after it ended) without sleeping blindly.
"""

from __future__ import annotations

import asyncio
import operator
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import zmesh

# Every way of calling, in the order of the matrix.
WAYS = (
    "call_one",
    "call",
    "broadcast",
    "choose",
    "stream_sync",
    "stream_async",
    "port_send",
    "explicit_port",
    "accumulator",
    "svc_call",
    "svc_stream",
    "svc_session",
    "svc_fanout",
    "svc_fanout_stream",
)
SERVICE_WAYS = frozenset(w for w in WAYS if w.startswith("svc_"))
# Ways whose value has one entry per replica: an empty one says nothing was called.
FANOUT_WAYS = frozenset({"svc_fanout", "svc_fanout_stream"})


def mark(marker: str) -> None:
    """Say "the work is under way, in this process" (once; the first writer wins)."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))


def marked_pid(marker: str) -> int | None:
    """The pid a producer wrote to ``marker``, or ``None`` while there is none."""
    try:
        with open(marker) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    return int(text) if text else None


def rss_mib(pid: int) -> float | None:
    """Resident memory of ``pid`` in MiB (``None``: it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class Pace:
    """How a producer behaves in one cell.

    ``seconds``: how long a plain call's work takes (and when an explicit
    port answers); ``count`` and ``gap``: how many items a generator yields
    (or a feeder sends) and the pause after each; ``timeout``: the call's
    own timeout (also each wait of a reader for its next item or value).
    """

    seconds: float
    count: int
    gap: float
    timeout: float


# A second client acting through handles: quick work, a generous timeout.
QUICK_PACE = Pace(seconds=0.05, count=5, gap=0.01, timeout=10.0)


class Producer(zmesh.Actor):
    """The callee of every way: each endpoint marks when its work is under way."""

    @zmesh.endpoint
    async def ping(self, x: int = 0) -> int:
        return x

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def work(self, marker: str, seconds: float) -> float:
        mark(marker)
        await asyncio.sleep(seconds)
        return seconds

    @zmesh.endpoint
    def gen_sync(self, marker: str, count: int, gap: float) -> Iterator[int]:
        for i in range(count):
            yield i
            mark(marker)
            time.sleep(gap)

    @zmesh.endpoint
    async def gen_async(self, marker: str, count: int, gap: float) -> AsyncIterator[int]:
        for i in range(count):
            yield i
            mark(marker)
            await asyncio.sleep(gap)

    @zmesh.endpoint
    async def feed(self, port: zmesh.Port[int], marker: str, count: int, gap: float) -> int:
        for i in range(count):
            port.send(i)
            mark(marker)
            await asyncio.sleep(gap)
        return count

    @zmesh.endpoint
    async def flood(self, port: zmesh.Port[bytes], marker: str, count: int, size: int) -> int:
        """Send ``count`` values of ``size`` bytes in bursts of 256, a short pause
        between bursts: as fast as a reading receiver takes them, so none is dropped
        on the way for a full send queue (only a receiver's own bound may drop). A
        receiver at its bound refuses a value (``PortFullError``): the sender is told,
        and stops there; how many values went."""
        blob = b"x" * size
        for i in range(count):
            try:
                port.send(blob)
            except zmesh.PortFullError:
                return i
            if i % 256 == 0:
                mark(marker)
                await asyncio.sleep(0.002)
        return count

    @zmesh.endpoint(explicit_response_port=True)
    async def answer_later(self, port: zmesh.Port[float], marker: str, seconds: float) -> None:
        mark(marker)

        async def later() -> None:
            await asyncio.sleep(seconds)
            port.send(seconds)

        self.pending = asyncio.get_running_loop().create_task(later())


class Reader(zmesh.Actor):
    """An actor that calls a producer one way: the reader a test kills or stops."""

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def run(self, way: str, target: Any, marker: str, pace: Pace) -> Any:
        return await drive(way, target, marker, pace)

    @zmesh.endpoint
    async def stall(self, way: str, target: Any, marker: str, seconds: float) -> float:
        """Start reading ``way``, take one item, then stop reading (alive, holding it
        open) while the producer goes on (``seconds`` for a stream; a port: until its
        feeder sent everything); how much this process's RSS grew, in MiB."""
        return await stall(way, target, marker, seconds)


# A stalled reader's producer: this many values of this many bytes (~400 MiB in
# all; a receiver that keeps at most 10,000 of them holds ~40 MiB). The reader
# measures once they are all sent (about 1-5 s), or after FLOOD_LIMIT seconds.
FLOOD = (100_000, 4096)
FLOOD_LIMIT = 20.0
STREAM_WAYS = ("stream_sync", "stream_async", "svc_stream")


async def stall(way: str, target: Any, marker: str, seconds: float) -> float:
    """See ``Reader.stall``: ``way`` is ``port_send`` or one of ``STREAM_WAYS``."""
    before = rss_mib(os.getpid()) or 0.0
    if way == "port_send":
        port, rx = zmesh.Channel.open()
        one = target.flatten("ranks").slice(ranks=0)
        fed = one.flood.options(timeout=30).call_one(port, marker, *FLOOD)
        await rx.recv()
        try:
            await asyncio.wait_for(_awaited(fed), FLOOD_LIMIT)  # every value sent, none read
        except asyncio.TimeoutError:
            pass  # still sending: what arrived so far counts
        grown = (rss_mib(os.getpid()) or 0.0) - before
        rx.close()
        return grown
    if way == "svc_stream":
        stream = target.gen_async.options(timeout=30)(marker, 1_000_000, 0.0)
    else:
        one = target.flatten("ranks").slice(ranks=0)
        gen = one.gen_sync if way == "stream_sync" else one.gen_async
        stream = gen.options(timeout=30).call_one(marker, 1_000_000, 0.0)
    items = stream.__aiter__()
    await items.__anext__()
    await asyncio.sleep(seconds)  # the stall itself: the producer is the one that must wait
    grown = (rss_mib(os.getpid()) or 0.0) - before
    await stream.aclose()
    return grown


async def _awaited(fut: zmesh.Future[Any]) -> Any:
    return await fut


async def drive(way: str, target: Any, marker: str, pace: Pace) -> Any:
    """Call ``target`` (a producer mesh of 2 procs, or a service) in ``way``; its value.

    Raises whatever the call raises: the tests check it is a zmesh error.
    """
    t, s, n, gap = pace.timeout, pace.seconds, pace.count, pace.gap
    if way in SERVICE_WAYS:
        svc: zmesh.Service[Producer] = target
        if way == "svc_call":
            return await svc.work.options(timeout=t)(marker, s)
        if way == "svc_stream":
            return [i async for i in svc.gen_async.options(timeout=t)(marker, n, gap)]
        if way == "svc_fanout":
            return await svc.work.options(timeout=t).call(marker, s)
        if way == "svc_fanout_stream":
            return [v async for v in svc.work.options(timeout=t).stream(marker, s)]
        async with svc.session():
            await svc.ping.options(timeout=t)(1)
            return await svc.work.options(timeout=t)(marker, s)
    mesh: zmesh.ActorMesh[Producer] = target
    one = mesh.flatten("ranks").slice(ranks=0)
    if way == "call_one":
        return await one.work.options(timeout=t).call_one(marker, s)
    if way == "call":
        return (await mesh.work.options(timeout=t).call(marker, s)).values()
    if way == "broadcast":
        mesh.work.broadcast(marker, s)
        return None
    if way == "choose":
        return await mesh.work.options(timeout=t).choose(marker, s)
    if way == "stream_sync":
        return [i async for i in one.gen_sync.options(timeout=t).call_one(marker, n, gap)]
    if way == "stream_async":
        return [i async for i in one.gen_async.options(timeout=t).call_one(marker, n, gap)]
    if way == "port_send":
        return await _read_port(one, marker, pace)
    if way == "explicit_port":
        return await one.answer_later.options(timeout=t).call_one(marker, s)
    if way == "accumulator":
        return await zmesh.Accumulator(mesh.work.options(timeout=t), 0.0, operator.add).accumulate(
            marker, s
        )
    raise ValueError(f"no such way: {way}")


async def _read_port(one: zmesh.ActorMesh[Producer], marker: str, pace: Pace) -> list[int]:
    """Open a channel, have ``one`` feed it (a value every ``gap`` for ``seconds``),
    and read every value; the feeding call's own error if it fails first."""
    port, rx = zmesh.Channel.open()
    count = max(2, int(pace.seconds / pace.gap))

    async def fed_call() -> int:
        return await one.feed.options(timeout=pace.timeout).call_one(port, marker, count, pace.gap)

    async def next_value() -> Any:
        return await rx.recv()

    fed = asyncio.ensure_future(fed_call())
    got: list[int] = []
    try:
        while len(got) < count:
            value = asyncio.ensure_future(next_value())
            watch = {value} if fed.done() and fed.exception() is None else {value, fed}
            done, _ = await asyncio.wait(watch, timeout=pace.timeout,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            if value in done:
                got.append(value.result())
                continue
            value.cancel()
            if fed in done and fed.exception() is not None:
                raise fed.exception()  # type: ignore[misc]  # the call says why
            if not done:
                raise zmesh.CallTimeoutError(f"no value on the port within {pace.timeout}s")
        await fed
        return got
    finally:
        fed.cancel()
        rx.close()
