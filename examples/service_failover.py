"""zmesh services: a 3-replica service keeps answering while its replicas are killed.

A load generator sends 200 requests a second for 10 s. Every 2.5 s the script
SIGKILLs one replica's process (the pid comes from the replica itself). The
service takes the dead replica out of routing as soon as its agent reports
it, re-sends the requests that were on it to a healthy replica, and respawns
it. At the end: requests sent / succeeded / retried / lost (lost must be 0).

Run: python examples/service_failover.py
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

import zmesh

RATE = 200  # requests per second
DURATION = 10.0  # seconds of load
KILL_EVERY = 2.5  # seconds between kills


class Scorer(zmesh.Actor):
    """A stateless replica: the same question always gets the same answer."""

    @zmesh.endpoint(concurrent=True)
    async def score(self, i: int) -> int:
        await asyncio.sleep(0.01)  # some work
        return i * i

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


def states(svc: zmesh.Service[Scorer]) -> str:
    return " ".join(f"{r.state}/g{r.generation}" for r in svc.statistics().replicas)


def replica(svc: zmesh.Service[Scorer], index: int) -> zmesh.ActorMesh[Scorer]:
    """Replica ``index``'s mesh (the replicas this example calls are up)."""
    mesh = svc.replica(index)
    assert mesh is not None, f"replica {index} is down"
    return mesh


async def main() -> int:
    svc = await Scorer.options(replicas=3).spawn()  # replicas=: a service
    pids = [await replica(svc, i).pid.call_one() for i in range(len(svc))]
    print(f"{svc}: replica pids {pids}")

    sent = succeeded = wrong = lost = 0
    calls: list[asyncio.Task[None]] = []

    async def request(i: int) -> None:
        nonlocal succeeded, wrong, lost
        try:
            value = await svc.score.options(timeout=30)(i)  # one healthy replica
        except zmesh.ZmeshError as err:
            lost += 1
            print(f"  lost request {i}: {err!r}")
            return
        if value == i * i:
            succeeded += 1
        else:
            wrong += 1

    start = time.monotonic()

    async def load() -> None:
        nonlocal sent
        while (now := time.monotonic() - start) < DURATION:
            while sent < int(now * RATE):
                calls.append(asyncio.create_task(request(sent)))
                sent += 1
            await asyncio.sleep(0.005)

    async def killer() -> None:
        turn = 0
        while time.monotonic() - start + KILL_EVERY < DURATION:
            await asyncio.sleep(KILL_EVERY)
            healthy = [r.index for r in svc.statistics().replicas if r.state == "HEALTHY"]
            if not healthy:
                continue
            index = healthy[turn % len(healthy)]
            turn += 1
            pid = await replica(svc, index).pid.call_one()
            os.kill(pid, signal.SIGKILL)
            print(f"t={time.monotonic() - start:4.1f}s  SIGKILL replica {index} (pid {pid})")

    async def report() -> None:
        while time.monotonic() - start < DURATION:
            await asyncio.sleep(1.0)
            stats = svc.statistics()
            print(
                f"t={time.monotonic() - start:4.1f}s  sent {sent:5d}  ok {succeeded:5d}  "
                f"retried {stats.retried:3d}  {stats.state:8s}  {states(svc)}"
            )

    await asyncio.gather(load(), killer(), report())
    await asyncio.wait(calls, timeout=30)
    hung = sum(not c.done() for c in calls)

    deadline = time.monotonic() + 20
    while svc.statistics().state != "OK" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    stats = svc.statistics()
    print()
    print(f"requests sent:      {sent}  ({sent / DURATION:.0f}/s)")
    print(f"succeeded:          {succeeded}")
    print(f"retried:            {stats.retried}  (re-sent after their replica died)")
    print(f"lost:               {lost + hung + wrong}")
    print(f"service:            {stats.state}")
    for r in stats.replicas:
        p50 = f"{r.p50 * 1000:.1f} ms" if r.p50 is not None else "-"
        p99 = f"{r.p99 * 1000:.1f} ms" if r.p99 is not None else "-"
        print(
            f"  replica {r.index}: {r.state:9s} generation {r.generation}  restarts {r.restarts}  "
            f"completed {r.completed:4d}  retried {r.retried:2d}  p50 {p50}  p99 {p99}  "
            f"sent after failure {r.sent_after_failure}"
        )
    await svc.stop()
    return 1 if lost + hung + wrong else 0


if __name__ == "__main__":
    logging.basicConfig(format="%(message)s")  # show the service's WARNINGs (on stderr)
    sys.exit(asyncio.run(main()))
