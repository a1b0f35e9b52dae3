"""zmesh quickstart: a mesh of counters on the embedded local agent.

Run: python examples/quickstart.py
"""

from __future__ import annotations

import asyncio
import os

import zmesh


class Counter(zmesh.Actor):
    """A counter per actor; each knows its place in the mesh."""

    def __init__(self, start: int = 0) -> None:
        self.n = start

    @zmesh.endpoint
    async def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @zmesh.endpoint
    def whoami(self) -> str:
        point = zmesh.current_rank()
        return f"rank {point.rank} (procs={point['procs']}) in pid {os.getpid()}"

    @zmesh.endpoint
    async def fail(self) -> None:
        raise ValueError("this endpoint always fails")


async def main() -> None:
    mesh = await Counter.options(procs=4).as_actor(10)
    print(f"spawned {mesh} with sizes {mesh.sizes}")

    values = await mesh.incr.call(1)  # every actor
    print("call      ->", values.values())

    for point, who in (await mesh.whoami.call()).items():
        print(f"  {point}: {who}")

    one = mesh.slice(procs=2)
    print("call_one  ->", await one.incr.call_one(5))  # exactly one actor

    mesh.incr.broadcast(100)  # every actor, no reply
    print("choose    ->", await mesh.incr.choose(0))  # the least loaded actor

    print("stream    ->", end=" ")
    async for v in mesh.incr.stream(1):  # replies as they arrive
        print(v, end=" ")
    print()

    try:
        await one.fail.call_one()
    except zmesh.ActorError as err:
        print(f"ActorError -> {err.remote_type}: {err.remote_message} (rank {err.rank})")
    print("still alive ->", await one.incr.call_one(0))

    await mesh.stop()
    print("stopped")


if __name__ == "__main__":
    asyncio.run(main())
