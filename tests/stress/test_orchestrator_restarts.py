"""A detached service's orchestrator under kill -9: many callers, and the restart limit.

The promises (docs/services.md, "When the orchestrator dies"): the
orchestrator is not in the calls' path, so killing it fails no call, loses
none and runs none twice (no replica died, so nothing is re-sent); its agent
restarts it at most ``ZMESH_ORCHESTRATOR_MAX_RESTARTS`` times within
``ZMESH_ORCHESTRATOR_RESTART_WINDOW`` seconds, then it stays down and the
replicas keep serving the handles that have them until ``zmesh stop``. A
``zmesh.lookup`` of a service whose orchestrator stays down says so at once,
with a typed error naming the service and what to do, rather than waiting.

One keyed agent for the module, started with a limit of one restart so
that the second kill hits it; each test makes its own service (restarts are
counted per orchestrator).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh
from zmesh._client.control import lookup as _lookup
from zmesh._wire import messages as w
from zmesh._wire import security as _security

from _helpers import connected, keyed_loopback_agent, pid_alive, replica_pids, wait_for, wait_gone

CALLERS = 64


class Counter(zmesh.Actor):
    """Counts every request id it runs: a call run twice shows up here."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    @zmesh.endpoint(concurrent=True)
    async def work(self, x: int) -> int:
        self.ran.append(zmesh.current_request())
        await asyncio.sleep(0.002)
        return x + 1

    @zmesh.endpoint
    async def ran_ids(self) -> list[str]:
        return self.ran

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("orch-restarts")
    keys = str(root / "keys")
    _security.keygen(keys)
    saved = {k: os.environ.get(k) for k in ("ZMESH_ORCHESTRATOR_MAX_RESTARTS",)}
    os.environ["ZMESH_ORCHESTRATOR_MAX_RESTARTS"] = "1"  # the agent reads it at start
    try:
        with keyed_loopback_agent(keys, root / "logs", "orch") as control:
            with connected([control], keys=keys):
                yield control
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _orchestrator(control: str, svc: Any) -> tuple[int, int]:
    """``(pid, generation)`` of the service's orchestrator, as its agent tells (0s: down)."""
    mesh = svc._detached[1].proc_mesh
    reply = _lookup.on_home(
        lambda rt: rt.controller.agent(control).request(lambda i: w.GetState(i, mesh), timeout=10)
    ).get(timeout=15)
    for m in reply.meshes:
        for r in m.ranks:
            if r.status.value == "Running":
                return r.pid, r.generation
    return 0, 0


def _kill_and_wait_restart(control: str, svc: Any) -> tuple[int, int]:
    pid, gen = _orchestrator(control, svc)
    assert pid
    os.kill(pid, signal.SIGKILL)
    return wait_for(lambda: (o := _orchestrator(control, svc))[1] > gen and o, 30,
                    "the orchestrator restarted")  # fmt: skip


@pytest.mark.stress
def test_many_callers_lose_and_repeat_no_call_while_the_orchestrator_is_killed(
    agent: str,
) -> None:
    svc = Counter.options(name="crowd", replicas=2, detached=True).spawn().get(timeout=60)
    try:
        replicas = asyncio.run(replica_pids(svc))
        stop = threading.Event()
        made: list[int] = [0] * CALLERS
        errors: list[BaseException] = []
        slowest = [0.0]

        def caller(k: int) -> None:
            i = 0
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    got = svc.work(k * 1_000_000 + i).get(timeout=15)
                except BaseException as exc:  # any error is a call the kill cost
                    errors.append(exc)
                    return
                slowest[0] = max(slowest[0], time.monotonic() - t0)
                assert got == k * 1_000_000 + i + 1
                made[k] += 1
                i += 1

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(CALLERS)]
        for t in threads:
            t.start()
        wait_for(lambda: all(made), 30, "every caller under way")
        before = sum(made)
        _kill_and_wait_restart(agent, svc)
        zmesh.lookup("crowd").get(timeout=30)  # answered by the new orchestrator
        wait_for(lambda: sum(made) > before + 2 * CALLERS, 30, "calls after the restart")
        stop.set()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a caller hangs"
        assert not errors, errors[:3]
        ran = [i for m in svc.ran_ids.call().get(timeout=30) for i in m]
        assert len(ran) == len(set(ran)), "a call ran twice"
        assert len(ran) == sum(made), (len(ran), sum(made))
        assert sorted(asyncio.run(replica_pids(svc))) == sorted(replicas)  # adopted, not re-made
        print(f"\n{sum(made)} calls by {CALLERS} threads, slowest {slowest[0] * 1000:.0f} ms")
        assert slowest[0] < 10, slowest
    finally:
        svc.stop().get(timeout=30)


@pytest.mark.stress
def test_100_tasks_on_one_loop_lose_no_call_while_the_orchestrator_is_killed(agent: str) -> None:
    # The same from async code: the calling loop's own client of the service
    # (not the I/O loop's) keeps routing while the orchestrator is replaced.
    svc = Counter.options(name="tasks", replicas=2, detached=True).spawn().get(timeout=60)
    try:

        async def run() -> tuple[int, float]:
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            made, slowest = 0, 0.0

            async def caller(k: int) -> None:
                nonlocal made, slowest
                i = 0
                while not stop.is_set():
                    t0 = loop.time()
                    assert await svc.work.options(timeout=15)(k * 1_000_000 + i) == (
                        k * 1_000_000 + i + 1
                    )
                    slowest = max(slowest, loop.time() - t0)
                    made += 1
                    i += 1

            tasks = [asyncio.ensure_future(caller(k)) for k in range(100)]
            try:
                await asyncio.sleep(0.3)
                pid, gen = await loop.run_in_executor(None, _orchestrator, agent, svc)
                os.kill(pid, signal.SIGKILL)
                deadline = loop.time() + 30
                while (await loop.run_in_executor(None, _orchestrator, agent, svc))[1] <= gen:
                    assert loop.time() < deadline, "the orchestrator was not restarted in 30 s"
                await zmesh.lookup("tasks")
                after = made
                while made < after + 200:
                    assert loop.time() < deadline, "calls stalled after the restart"
                    await asyncio.sleep(0.05)
            finally:
                stop.set()
                results = await asyncio.gather(*tasks, return_exceptions=True)
            assert not [r for r in results if r is not None], results[:3]
            return made, slowest

        made, slowest = asyncio.run(run())
        ran = [i for m in svc.ran_ids.call().get(timeout=30) for i in m]
        assert len(ran) == len(set(ran)) == made, (len(ran), len(set(ran)), made)
        assert slowest < 10, slowest
    finally:
        svc.stop().get(timeout=30)


def test_past_its_restart_limit_the_orchestrator_stays_down_and_lookup_says_so(
    agent: str,
) -> None:
    svc = Counter.options(name="limited", replicas=2, detached=True).spawn().get(timeout=60)
    replicas = asyncio.run(replica_pids(svc))
    _kill_and_wait_restart(agent, svc)  # the one restart allowed
    pid, _ = _orchestrator(agent, svc)
    os.kill(pid, signal.SIGKILL)  # one more: it stays down
    wait_gone([pid], 10, "the orchestrator")
    # The replicas keep serving the handles that have them.
    assert [svc.work(i).get(timeout=10) for i in range(4)] == [1, 2, 3, 4]
    t0 = time.monotonic()
    with pytest.raises(zmesh.ServiceError, match=r"'limited'.*stays down.*zmesh stop limited") as e:
        zmesh.lookup("limited").get(timeout=60)
    took = time.monotonic() - t0
    assert took < 5, f"lookup took {took:.1f}s to say the orchestrator stays down"
    assert e.value.mesh == "limited" and e.value.log_path, e.value
    assert _orchestrator(agent, svc) == (0, 0)  # not restarted meanwhile
    assert all(pid_alive(p) for p in replicas)
    with pytest.raises(zmesh.DetachError, match=r"is a detached service already.*stays down"):
        Counter.options(name="limited", replicas=1, detached=True).spawn().get(timeout=30)
    # zmesh stop (here: svc.stop()) still ends every replica.
    svc.stop().get(timeout=30)
    wait_gone(replicas, 20, "the replicas")
    with pytest.raises(zmesh.NameNotFoundError):
        zmesh.lookup("limited").get(timeout=30)


def test_stop_after_the_handle_was_used_in_an_ended_asyncio_run(agent: str) -> None:
    # Plain code that once awaited the service in asyncio.run() (which made
    # a client of it on that loop, now closed) still stops it.
    svc = Counter.options(name="onerun", replicas=1, detached=True).spawn().get(timeout=60)

    async def use() -> int:
        result: int = await svc.work(1)
        return result

    replicas = asyncio.run(replica_pids(svc))
    assert asyncio.run(use()) == 2
    svc.stop().get(timeout=30)
    wait_gone(replicas, 20, "the replica")
    with pytest.raises(zmesh.ActorStoppedError):
        svc.work(1).get(timeout=10)


def test_stop_while_the_orchestrator_is_being_restarted_leaves_nothing(agent: str) -> None:
    # svc.stop() lands while the agent waits to restart the orchestrator
    # (its backoff), or while the new one boots: nothing comes back.
    svc = Counter.options(name="racing", replicas=2, detached=True).spawn().get(timeout=60)
    replicas = asyncio.run(replica_pids(svc))
    pid, _ = _orchestrator(agent, svc)
    os.kill(pid, signal.SIGKILL)
    wait_gone([pid], 10, "the orchestrator")
    svc.stop().get(timeout=30)
    wait_gone(replicas, 20, "the replicas")
    time.sleep(0.5)  # past the restart's backoff (0.1 s): a restart would run by now
    assert _orchestrator(agent, svc) == (0, 0)
    with pytest.raises(zmesh.NameNotFoundError):
        zmesh.lookup("racing").get(timeout=30)


def test_a_stopped_orchestrator_sigstop_is_replaced_and_adopts_the_replicas(agent: str) -> None:
    # A hung orchestrator (SIGSTOP: a debugger, a frozen container) is judged
    # by its agent, killed and restarted as a dead one is; calls never stop.
    svc = Counter.options(name="frozen", replicas=2, detached=True).spawn().get(timeout=60)
    try:
        replicas = asyncio.run(replica_pids(svc))
        pid, gen = _orchestrator(agent, svc)
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        while _orchestrator(agent, svc)[1] <= gen:
            assert svc.work(1).get(timeout=10) == 2  # served meanwhile
            assert time.monotonic() - t0 < 30, "the frozen orchestrator was not replaced"
        assert not pid_alive(pid) or _orchestrator(agent, svc)[0] != pid
        assert zmesh.lookup("frozen").get(timeout=30).work(2).get(timeout=10) == 3
        assert sorted(asyncio.run(replica_pids(svc))) == sorted(replicas)
    finally:
        svc.stop().get(timeout=30)


class Fragile(zmesh.Actor):
    """Starts, unless its flag file exists; notes each start attempt in a file."""

    def __init__(self, flag: str) -> None:
        with open(flag + ".starts", "a") as f:
            f.write(f"{os.getpid()}\n")
        if os.path.exists(flag):
            raise RuntimeError("cannot load the model")

    @zmesh.endpoint
    async def work(self, x: int) -> int:
        return x + 1

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.mark.parametrize("then", ["UNHEALTHY", "RECOVERING"])
def test_an_orchestrator_restart_keeps_the_healthy_replicas_when_another_cannot_start(
    agent: str, tmp_path: Any, then: str
) -> None:
    # Replica 1 crash-loops at start: given up (UNHEALTHY), or waiting for
    # its next try (RECOVERING); the orchestrator then dies. The new one must
    # keep replica 0 serving (same process), and not take the whole service
    # down because replica 1 cannot start; a given-up one is not respawned.
    flag = str(tmp_path / "broken")
    starts = tmp_path / "broken.starts"
    given_up = then == "UNHEALTHY"
    opts = Fragile.options(
        name=f"fragile-{then.lower()}", replicas=2, detached=True,
        max_restarts=1 if given_up else 5, backoff_initial=0.05 if given_up else 0.5,
    )  # fmt: skip
    svc = opts.spawn(flag).get(timeout=60)
    try:
        healthy, doomed = asyncio.run(replica_pids(svc))
        open(flag, "w").close()
        os.kill(doomed, signal.SIGKILL)
        wait_for(lambda: len(starts.read_text().split()) > 2 and
                 [r.state for r in svc.statistics().replicas] == ["HEALTHY", then],
                 30, f"replica 1 {then} after a failed respawn")  # fmt: skip
        tries = len(starts.read_text().split())
        _kill_and_wait_restart(agent, svc)
        zmesh.lookup(f"fragile-{then.lower()}").get(timeout=30)  # the new orchestrator is up
        assert [svc.work(i).get(timeout=10) for i in range(4)] == [1, 2, 3, 4]
        first = svc.replica(0)
        assert first is not None and first.pid.call_one().get(timeout=10) == healthy
        if given_up:
            assert len(starts.read_text().split()) == tries, "the given-up replica was respawned"
        else:  # still tried, with its backoff
            wait_for(lambda: len(starts.read_text().split()) > tries, 30, "another try")
    finally:
        svc.stop().get(timeout=30)
