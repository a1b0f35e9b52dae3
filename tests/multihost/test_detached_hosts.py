"""A detached service whose replicas run on two hosts: kill -9 its orchestrator.

The orchestrator runs on the first agent (host0); with two agents, replica 0
runs on host0 and replica 1 on host1. The promise (docs/services.md, "When
the orchestrator dies"): callers lose no call while it is down (they go
straight to the replicas), the agent restarts it, and the new orchestrator
adopts both replicas, the one on the *other* host too (same processes,
state kept), and supervises them: a replica on host1 killed afterwards is
respawned.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh
from zmesh._client.control import lookup as _lookup
from zmesh._wire import messages as w

from _helpers import connected, replica_pids, wait_for, wait_gone
from netns_cluster import NetnsCluster


class Kept(zmesh.Actor):
    def __init__(self) -> None:
        self.calls = 0  # the replica's state: adoption keeps it

    @zmesh.endpoint
    async def work(self, x: int) -> int:
        self.calls += 1
        return 2 * x

    @zmesh.endpoint
    async def calls_so_far(self) -> int:
        return self.calls

    @zmesh.endpoint
    async def ip(self, gateway: str) -> str:
        """This host's address (a UDP connect sends nothing)."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((gateway, 9))
            addr: str = s.getsockname()[0]
            return addr

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.fixture
def netns2(keys_dir: str, client_keys: str) -> Iterator[NetnsCluster]:
    with NetnsCluster(2, keys=keys_dir) as cluster:
        with connected(cluster.controls, keys=client_keys):
            yield cluster


def _orchestrator(control: str, mesh: str) -> tuple[int, int]:
    """``(pid, generation)`` of the orchestrator's running proc (``(0, 0)``: none)."""
    reply = _lookup.on_home(
        lambda rt: rt.controller.agent(control).request(lambda i: w.GetState(i, mesh), timeout=10)
    ).get(timeout=15)
    running = [(r.pid, r.generation) for m in reply.meshes for r in m.ranks
               if r.status.value == "Running"]  # fmt: skip
    return running[0] if running else (0, 0)


def test_kill9_of_the_orchestrator_keeps_and_re_adopts_the_replica_on_the_other_host(
    netns2: NetnsCluster,
) -> None:
    host0, host1 = netns2.hosts
    gateway = host0.ip.rsplit(".", 1)[0] + ".1"
    svc: Any = Kept.options(name="remote", replicas=2, detached=True).spawn().get(timeout=90)
    try:
        orch_mesh = svc._detached[1].proc_mesh
        assert svc._detached[1]._refs[0].agent == host0.control
        ips = [svc.replica(i).ip.call_one(gateway).get(timeout=15) for i in range(2)]
        assert ips == [host0.ip, host1.ip], ips
        before = asyncio.run(replica_pids(svc))

        async def load() -> tuple[int, int]:
            stop = asyncio.Event()
            done = 0

            async def caller(k: int) -> None:
                nonlocal done
                i = k
                while not stop.is_set():
                    assert await svc.work.options(timeout=15)(i) == 2 * i
                    done += 1
                    i += 8

            callers = [asyncio.ensure_future(caller(k)) for k in range(8)]
            try:
                await asyncio.sleep(0.3)
                pid, gen = _orchestrator(host0.control, orch_mesh)
                os.kill(pid, signal.SIGKILL)  # host0's netns shares our pid space
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                while _orchestrator(host0.control, orch_mesh)[1] <= gen:
                    assert loop.time() < deadline, "the orchestrator was not restarted in 30 s"
                    await asyncio.sleep(0.1)
                await zmesh.lookup("remote")  # the new orchestrator answers
                at_restart = done
                await asyncio.sleep(0.3)
            finally:
                stop.set()
                results = await asyncio.gather(*callers, return_exceptions=True)
            assert not [r for r in results if r is not None], results  # no call lost
            return done, at_restart

        done, at_restart = asyncio.run(load())
        assert done > at_restart > 0
        # Adopted, not re-created: the same processes on both hosts, their state kept.
        assert asyncio.run(replica_pids(svc)) == before
        kept = sum(svc.replica(i).calls_so_far.call_one().get(timeout=15) for i in range(2))
        assert kept >= done
        # The new orchestrator supervises the replica on host1: a kill there heals.
        os.kill(before[1], signal.SIGKILL)

        def respawned() -> int | None:
            mesh = svc.replica(1)
            try:
                pid: int = mesh.pid.options(timeout=5).call_one().get(timeout=10)
            except (zmesh.ZmeshError, AttributeError):  # down, or not yet in the table
                return None
            return pid if pid != before[1] else None

        healed = wait_for(respawned, 45, "replica 1 respawned by the adopted orchestrator")
        assert [svc.work(i).get(timeout=15) for i in range(4)] == [0, 2, 4, 6]
        # Both at once: the orchestrator and the replica on host1. The next
        # orchestrator respawns that replica from the agents' last table.
        pid, gen = _orchestrator(host0.control, orch_mesh)
        before[1] = healed
        os.kill(pid, signal.SIGKILL)
        os.kill(healed, signal.SIGKILL)
        wait_for(respawned, 45, "replica 1 respawned by the next orchestrator")
        assert _orchestrator(host0.control, orch_mesh)[1] > gen
        assert svc.replica(0).pid.call_one().get(timeout=15) == before[0]  # still adopted
        fresh = zmesh.lookup("remote").get(timeout=30)  # from another handle, too
        assert fresh.work(5).get(timeout=15) == 10
    finally:
        pids = [p for p in (_orchestrator(host0.control, svc._detached[1].proc_mesh)[0],) if p]
        svc.stop().get(timeout=30)
        wait_gone(pids, 20, "the orchestrator")


def test_when_the_orchestrators_host_is_lost_lookup_says_where_the_replicas_serve(
    netns2: NetnsCluster,
) -> None:
    # host0's agent dies (and the orchestrator with it: nobody restarts it).
    # The handles that have the service keep calling the replica on host1; a
    # lookup says at once what happened and where the replicas are, instead
    # of "no such name" after a timeout; svc.stop() still ends them.
    from zmesh._client.calls import runtime as _runtime

    host0, host1 = netns2.hosts
    svc: Any = Kept.options(name="orphan", replicas=2, detached=True).spawn().get(timeout=90)
    survivor = svc.replica(1).pid.call_one().get(timeout=15)
    assert host0.agent is not None
    host0.agent.kill()
    host0.agent.wait(10)
    wait_for(lambda: _runtime.home().controller.agent(host0.control).lost, 15, "host0 lost")
    assert [svc.work(i).get(timeout=15) for i in range(4)] == [0, 2, 4, 6]
    t0 = time.monotonic()
    with pytest.raises(
        zmesh.ServiceError, match=rf"'orphan'.*replicas on {host1.control}.*zmesh stop orphan"
    ):
        zmesh.lookup("orphan").get(timeout=60)
    took = time.monotonic() - t0
    assert took < 5, f"lookup took {took:.1f}s"
    svc.stop().get(timeout=60)  # waits out host0's request timeout (10 s): it may be alive
    wait_gone([survivor], 20, "the replica on host1")
    with pytest.raises(zmesh.NameNotFoundError):
        zmesh.lookup("orphan").get(timeout=60)
