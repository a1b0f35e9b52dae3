"""zmesh supervision: kill -9 one proc of a mesh and watch what callers see.

Run: python examples/supervision.py
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import zmesh


class Worker(zmesh.Actor):
    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def work(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return zmesh.current_rank().rank


async def first_failure(mesh: zmesh.ActorMesh[Worker]) -> zmesh.SupervisionEvent:
    async for failure in mesh.supervision_events():
        return failure
    raise AssertionError("the event stream ended")


async def main() -> None:
    mesh = await Worker.options(procs=4).as_actor()
    pids = (await mesh.pid.call()).values()
    print(f"{mesh}: pids {pids}")

    watcher = asyncio.create_task(first_failure(mesh))
    victim = mesh.slice(procs=2)
    in_flight = victim.work.call_one(60)  # would take a minute
    await asyncio.sleep(0.2)  # let it start

    t0 = time.monotonic()
    os.kill(pids[2], signal.SIGKILL)  # what the OOM killer or a crash would do
    try:
        await in_flight
        raise AssertionError("the call should have failed")
    except zmesh.SupervisionError as err:
        print(f"in flight -> SupervisionError after {time.monotonic() - t0:.2f}s")
        print(f"  {err}")
        print(f"  err.rank={err.rank} err.reason={err.reason!r}")

    event = await asyncio.wait_for(watcher, 5)
    print(f"event     -> {event.status.value} rank {event.rank}: {event.reason}")
    state = mesh.state()
    ranks = {r: st.status.value for r, st in state.ranks.items()}
    print(f"state     -> {state.status.value} {ranks}")

    t0 = time.monotonic()
    try:
        await victim.work.call_one(0)
        raise AssertionError("the call should have failed")
    except zmesh.SupervisionError as err:
        print(f"later call -> SupervisionError in {time.monotonic() - t0:.3f}s: {err.message}")

    for rank in (0, 1, 3):
        print(f"rank {rank}    ->", await mesh.slice(procs=rank).work.call_one(0))
    print("first two ->", (await mesh.slice(procs=slice(0, 2)).work.call(0)).values())

    await mesh.stop()
    print("stopped")


if __name__ == "__main__":
    asyncio.run(main())
