"""Stress: 4 procs x 32 actors under mixed traffic from async code and threads, then a kill.

For a few seconds, the event loop and two plain threads keep calls in flight
to every actor (``call_one`` to each, fan-outs with ``call`` and ``stream``,
``broadcast``s), each sender numbering its own messages. Then every actor
must have seen each sender's messages in send order, none lost. Last, a
proc is killed with calls in flight to its actors and to the whole mesh:
every call resolves (none hangs), the killed proc's with ``SupervisionError``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest

import zmesh

pytestmark = pytest.mark.stress

PROCS, PER = 4, 32
SECONDS = float(os.environ.get("ZMESH_STRESS_SECONDS", "4"))


class Counter(zmesh.Actor):
    def __init__(self) -> None:
        self.seen: dict[str, list[int]] = {}

    @zmesh.endpoint
    async def note(self, sender: str, i: int) -> int:
        self.seen.setdefault(sender, []).append(i)
        return zmesh.current_rank().rank

    @zmesh.endpoint
    def note_sync(self, sender: str, i: int) -> int:
        self.seen.setdefault(sender, []).append(i)
        return zmesh.current_rank().rank

    @zmesh.endpoint
    async def seen_by(self) -> dict[str, list[int]]:
        return self.seen

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def nap(self, s: float) -> int:
        await asyncio.sleep(s)
        return 0


def _thread_sender(mesh: zmesh.ActorMesh[Counter], name: str, stop: threading.Event,
                   sent: dict[str, int]) -> None:  # fmt: skip
    """Plain code: numbered fan-outs (call, broadcast, stream), waited with .get()."""
    i = 0
    while not stop.is_set():
        if i % 3 == 1:
            mesh.note.broadcast(name, i)
        elif i % 3 == 2:
            assert len(list(mesh.note_sync.stream(name, i))) == PROCS * PER
        else:
            mesh.note_sync.call(name, i).get(timeout=60)
        i += 1
    mesh.note.call(name, -1).get(timeout=60)  # (after the last broadcast)
    sent[name] = i


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_mixed_traffic_keeps_each_actors_order_then_a_kill_resolves_everything() -> None:
    mesh = await Counter.options(procs=PROCS, actors_per_proc=PER).as_actor()
    try:
        await _mixed(mesh)
        await _kill_one(mesh)
    finally:
        await mesh.stop()


async def _mixed(mesh: zmesh.ActorMesh[Counter]) -> None:
    stop = threading.Event()
    sent: dict[str, int] = {}
    threads = [
        threading.Thread(target=_thread_sender, args=(mesh, f"t{k}", stop, sent)) for k in range(2)
    ]
    for t in threads:
        t.start()
    n = 0
    actors = mesh.flatten("a")
    singles = [actors.slice(a=r) for r in range(PROCS * PER)]
    deadline = time.monotonic() + SECONDS
    try:
        while time.monotonic() < deadline:
            # 20 numbered messages to every actor from this loop, in flight at once:
            # a fan-out, a broadcast, a stream, the rest as call_one to each.
            futs: list[Any] = []
            for k in range(20):
                i = n + k
                if k == 3:
                    futs.append(mesh.note.call("loop", i))
                elif k == 7:
                    mesh.note.broadcast("loop", i)
                elif k == 11:
                    futs.append(_drain(mesh.note_sync.stream("loop", i)))
                elif k % 2:
                    futs.extend(a.note.call_one("loop", i) for a in singles)
                else:
                    futs.append(mesh.note_sync.call("loop", i))
            await asyncio.wait_for(asyncio.gather(*(_aw(f) for f in futs)), 60)
            n += 20
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    seen = await mesh.seen_by.call()
    assert len(seen) == PROCS * PER
    for point, by_sender in seen.items():
        assert by_sender["loop"] == list(range(n)), f"actor {point.rank}: loop's messages"
        for name, count in sent.items():
            got = by_sender.get(name, [])
            assert got == [*range(count), -1], f"actor {point.rank}: {name}'s messages"
    print(f"\n{n} messages from the loop and {sent} from threads to each of {len(seen)} actors")


async def _kill_one(mesh: zmesh.ActorMesh[Counter]) -> None:
    victim = await mesh.slice(procs=2, actors=0).pid.call_one()
    actors = mesh.flatten("a")
    naps = [actors.slice(a=r).nap.call_one(20) for r in range(0, PROCS * PER, 3)]
    fans = [mesh.nap.call(20), mesh.slice(procs=2).nap.call(20)]
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    dead = range(2 * PER, 3 * PER)
    for f in fans:
        with pytest.raises(zmesh.SupervisionError):
            await asyncio.wait_for(_aw(f), 15)
    for r, nap in zip(range(0, PROCS * PER, 3), naps, strict=True):
        if r in dead:
            with pytest.raises(zmesh.SupervisionError) as info:
                await asyncio.wait_for(_aw(nap), 15)
            assert info.value.rank == r
    took = time.monotonic() - t0
    assert took < 15, f"the dead proc's calls took {took:.1f}s to fail"


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


async def _aw(f: Any) -> Any:
    return await f
