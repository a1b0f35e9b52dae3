"""Detached services and meshes: they outlive their creating script on an
external agent, other scripts attach with ``zmesh.lookup``, ``zmesh stop``
ends them, and other keys neither find nor stop them.

One keyed ``zmesh agent`` on loopback TCP for the module; a creator script
(a subprocess, which exits) makes the detached service; the tests attach to
it from other scripts and from this process.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import pickle
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zmesh
from zmesh._client.control import local as _local
from zmesh._client.control import lookup as _lookup
from zmesh._wire import messages as w
from zmesh._wire import security as _security

from _helpers import connected, keyed_loopback_agent, pid_alive, run_python, wait_for, wait_gone

pytestmark = pytest.mark.usefixtures("_isolated")

CREATOR = textwrap.dedent(
    """
    import os, sys, zmesh

    class Embedder(zmesh.Actor):
        def __init__(self, scale: int) -> None:
            self.scale = scale

        @zmesh.endpoint
        def embed(self, x: int) -> int:
            return x * self.scale

        @zmesh.endpoint
        def pid(self) -> int:
            return os.getpid()

    kind = sys.argv[1]
    if kind == "service":
        svc = Embedder.options(name="embedder", replicas=2, detached=True).spawn(3).get(60)
        print(svc.embed(14).get(timeout=10), flush=True)
    else:
        mesh = Embedder.options(name="tables", procs=2, detached=True).as_actor(5)
        print(mesh.embed.call(1).get(timeout=60).values(), flush=True)
    """
)

USER = textwrap.dedent(
    """
    import zmesh

    svc = zmesh.lookup("embedder").get(timeout=30)
    print(type(svc).__name__, [svc.embed(i).get(timeout=10) for i in range(4)], flush=True)
    """
)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A keyed agent, its keys, and two more client key pairs: one it admits, one it does not."""
    root = tmp_path_factory.mktemp("detached")
    keys = str(root / "keys")
    agents_keys = _security.keygen(keys)
    other = str(root / "other")
    _security.keygen_client(other, agents_keys.public)
    _security.authorize(keys, _security.read_public(other), "other")
    stranger = str(root / "stranger")
    _security.keygen_client(stranger, agents_keys.public)
    with keyed_loopback_agent(keys, root / "logs", "ext") as control:
        yield {
            "control": control, "keys": keys, "other": other, "stranger": stranger,
            "dir": str(root),
        }  # fmt: skip


@pytest.fixture
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("ZMESH_AGENTS", "ZMESH_HOSTFILE", "ZMESH_KEYS"):
        monkeypatch.delenv(var, raising=False)
    yield
    zmesh.shutdown()
    _local.configure(None)
    _security.use(None)


def _env(agent: dict[str, str], keys: str = "keys") -> dict[str, str]:
    return {"ZMESH_AGENTS": agent["control"], "ZMESH_KEYS": agent[keys]}


def _create(agent: dict[str, str], kind: str) -> str:
    """Run the creator script to its end; what it printed."""
    script = Path(agent["dir"]) / "creator.py"
    script.write_text(CREATOR)
    done = run_python([str(script), kind], 120, env=_env(agent), cwd=agent["dir"])
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def _zmesh(agent: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_python(
        ["-m", "zmesh", *args, "--agents", agent["control"], "--keys", agent["keys"]], 60
    )


def _pids_of(agent: dict[str, str], name: str) -> list[int]:
    """The live pids of every mesh ``zmesh get NAME`` shows (orchestrator and replicas)."""
    done = _zmesh(agent, "get", name, "--json")
    if done.returncode != 0:
        return []
    got: Any = json.loads(done.stdout)
    meshes = got if isinstance(got, list) else [got]
    return [r["pid"] for m in meshes for r in m["ranks"] if r["status"] == "Running"]


@pytest.fixture(scope="module")
def service(agent: dict[str, str]) -> Iterator[list[int]]:
    """The detached ``embedder`` (2 replicas), made by a script that has exited; its pids."""
    assert _create(agent, "service") == "42"
    pids = wait_for(lambda: (p := _pids_of(agent, "embedder")) and len(p) == 3 and p, 30,
                    "the orchestrator and 2 replicas")  # fmt: skip
    yield pids
    _zmesh(agent, "stop", "embedder")  # a test failed before it stopped it: clean up
    wait_gone(pids, 20, "the detached service")


def test_a_detached_service_outlives_its_creator_and_serves_another_script(
    agent: dict[str, str], service: list[int]
) -> None:
    assert all(pid_alive(p) for p in service)
    done = run_python(["-c", USER], 60, env=_env(agent))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "Service [0, 3, 6, 9]"
    shown = _zmesh(agent, "ps")
    assert "kept as 'embedder' past its creator" in shown.stdout, shown.stdout
    got = json.loads(_zmesh(agent, "get", "embedder", "--json").stdout)
    kept = {m["name"]: m.get("detached", "") for m in got}
    # The orchestrator and both replicas: the replicas outlive the orchestrator too.
    assert sorted(kept.values()) == ["embedder"] * 3, kept


def test_lookup_of_an_unknown_name_lists_the_names_there(
    agent: dict[str, str], service: list[int]
) -> None:
    with connected([agent["control"]], keys=agent["keys"]):
        with pytest.raises(zmesh.NameNotFoundError, match=r"'embeder'.*names there: embedder") as e:
            zmesh.lookup("embeder").get(timeout=30)
        assert e.value.names == ["embedder"]


class Embedder(zmesh.Actor):
    @zmesh.endpoint
    def embed(self, x: int) -> int:
        return x


def test_a_name_in_use_is_refused_before_anything_spawns(
    agent: dict[str, str], service: list[int]
) -> None:
    with connected([agent["control"]], keys=agent["keys"]):
        again = Embedder.options(name="embedder", replicas=1, detached=True).spawn()
        with pytest.raises(zmesh.DetachError, match="is a detached service already"):
            again.get(timeout=30)
    assert sorted(_pids_of(agent, "embedder")) == sorted(service)  # nothing new, nothing lost


def test_other_keys_neither_find_nor_stop_it(agent: dict[str, str], service: list[int]) -> None:
    # Keys the agent admits, but not the creator's: the name is not theirs.
    with connected([agent["control"]], keys=agent["other"]):
        with pytest.raises(zmesh.NameNotFoundError, match="names there: none") as e:
            zmesh.lookup("embedder").get(timeout=30)
        assert e.value.names == []
        from zmesh._client.calls import runtime as _runtime
        from zmesh._client.control import lookup as _lookup

        async def stop() -> Any:
            rt = _runtime.home()
            make = functools.partial(w.StopDetached, name="embedder", principal=_lookup.principal())
            return await rt.controller.agent(agent["control"]).client.request(make, check=False)

        ack = _lookup.on_home(lambda rt: stop()).get(timeout=30)
        assert not ack.ok and "no detached service or mesh named 'embedder'" in ack.error
    # Keys the agent does not admit: refused at the handshake.
    with connected([agent["control"]], keys=agent["stranger"]):
        with pytest.raises(zmesh.SecurityError):
            zmesh.lookup("embedder").get(timeout=30)
    assert all(pid_alive(p) for p in service)
    done = run_python(["-c", USER], 60, env=_env(agent))  # still served
    assert done.returncode == 0 and "Service [0, 3, 6, 9]" in done.stdout, done.stderr


def test_kill9_of_a_replica_after_its_creator_exited_heals_with_nothing_lost(
    agent: dict[str, str], service: list[int]
) -> None:
    with connected([agent["control"]], keys=agent["keys"]):
        svc = zmesh.lookup("embedder").get(timeout=30)

        async def run() -> tuple[int, int, int]:
            victim = await svc.replica(0).pid.call_one()
            done = 0
            stop = asyncio.Event()

            async def caller(k: int) -> None:
                nonlocal done
                i = 0
                while not stop.is_set():
                    assert await svc.embed.options(timeout=30)(i) == i * 3
                    done += 1
                    i += k + 1

            callers = [asyncio.ensure_future(caller(k)) for k in range(4)]
            try:
                await asyncio.sleep(0.3)
                os.kill(victim, signal.SIGKILL)
                healed = await _respawned(svc, victim)
                await asyncio.sleep(0.3)
            finally:
                stop.set()
                results = await asyncio.gather(*callers, return_exceptions=True)
            assert not [r for r in results if r is not None], results  # no call lost
            return victim, healed, done

        victim, healed, done = asyncio.run(run())
        assert done > 0 and not pid_alive(victim) and pid_alive(healed)


async def _respawned(svc: Any, victim: int, index: int = 0) -> int:
    """Replica ``index``'s pid once it is not ``victim`` (the orchestrator respawned it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while loop.time() < deadline:
        mesh = svc.replica(index)
        if mesh is not None:
            try:
                pid: int = await mesh.pid.options(timeout=5).call_one()
            except zmesh.ZmeshError:  # the dead generation, not yet out of the table
                pid = victim
            if pid != victim:
                return pid
        await asyncio.sleep(0.1)
    raise AssertionError(f"replica {index} was not respawned within 30s")


def _mesh_pids(agent: dict[str, str], name: str) -> dict[str, list[int]]:
    """The live pids of each mesh ``zmesh get NAME`` shows, by mesh name."""
    done = _zmesh(agent, "get", name, "--json")
    if done.returncode != 0:
        return {}
    got: Any = json.loads(done.stdout)
    meshes = got if isinstance(got, list) else [got]
    return {m["name"]: [r["pid"] for r in m["ranks"] if r["status"] == "Running"] for m in meshes}


def test_kill9_of_the_orchestrator_loses_no_call_and_its_agent_restarts_it(
    agent: dict[str, str], service: list[int]
) -> None:
    # Callers pipeline calls while the orchestrator is SIGKILLed: none fails or
    # hangs (calls go straight to the replicas); the agent restarts the
    # orchestrator, which adopts the same replica processes (their state is
    # kept), lookup works again, and a replica killed afterwards is healed.
    with connected([agent["control"]], keys=agent["keys"]):
        svc = zmesh.lookup("embedder").get(timeout=30)
        orch_mesh = svc._detached[1].proc_mesh
        before = _mesh_pids(agent, "embedder")
        (orch_pid,) = before[orch_mesh]
        replicas = sorted(p for m, ps in before.items() if m != orch_mesh for p in ps)
        assert len(replicas) == 2

        async def restarted() -> int | None:
            """The orchestrator's new pid, once it runs (asked of its agent)."""
            reply = await _lookup.on_home(
                lambda rt: rt.controller.agent(agent["control"]).request(
                    lambda i: w.GetState(i, orch_mesh), timeout=10
                )
            )
            pids = [r.pid for m in reply.meshes for r in m.ranks if r.status.value == "Running"]
            return pids[0] if pids and pids[0] != orch_pid else None

        async def run() -> tuple[int, int, float, float, int]:
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            done, during, worst = 0, 0, 0.0
            killed_at: float | None = None
            back_at: float | None = None

            async def caller(k: int) -> None:
                nonlocal done, during, worst
                i = k
                while not stop.is_set():
                    t0 = loop.time()
                    assert await svc.embed.options(timeout=10)(i) == i * 3
                    done += 1
                    if killed_at is not None and back_at is None:
                        during += 1
                        worst = max(worst, loop.time() - t0)
                    i += 8

            callers = [asyncio.ensure_future(caller(k)) for k in range(8)]
            try:
                await asyncio.sleep(0.3)
                killed_at = loop.time()
                os.kill(orch_pid, signal.SIGKILL)
                deadline = killed_at + 30
                new = None
                while new is None:
                    assert loop.time() < deadline, "the orchestrator was not restarted in 30 s"
                    new = await restarted()
                    await asyncio.sleep(0.02)
                await zmesh.lookup("embedder")  # answered by the new orchestrator
                back_at = loop.time()
                await asyncio.sleep(0.3)
            finally:
                stop.set()
                results = await asyncio.gather(*callers, return_exceptions=True)
            assert not [r for r in results if r is not None], results  # no call lost
            return new, done, back_at - killed_at, worst, during

        new_orch, done, gap, worst, during = asyncio.run(run())
        print(f"\nORCHESTRATOR kill -9: lookup answers again after {gap * 1000:.0f} ms; "
              f"{done} calls, {during} while down, slowest {worst * 1000:.1f} ms")  # fmt: skip
        assert not pid_alive(orch_pid) and pid_alive(new_orch) and during > 0
        # The same replica processes, adopted (not re-created): their state is kept.
        after = _mesh_pids(agent, "embedder")
        assert sorted(p for m, ps in after.items() if m != orch_mesh for p in ps) == replicas
        got = run_python(["-c", USER], 60, env=_env(agent))  # lookup works again
        assert got.returncode == 0 and "Service [0, 3, 6, 9]" in got.stdout, got.stderr

        async def heal() -> tuple[int, int]:  # the new orchestrator supervises again
            victim = await svc.replica(1).pid.call_one()
            os.kill(victim, signal.SIGKILL)
            return victim, await _respawned(svc, victim, 1)

        victim, healed = asyncio.run(heal())
        assert not pid_alive(victim) and pid_alive(healed)

        # Both at once: the restarted orchestrator (adopted, restarted again)
        # and a replica. The next orchestrator respawns the dead replica.
        async def both() -> tuple[int, int]:
            victim = await svc.replica(0).pid.call_one()
            (orch_now,) = _mesh_pids(agent, "embedder")[orch_mesh]
            os.kill(orch_now, signal.SIGKILL)
            os.kill(victim, signal.SIGKILL)
            return victim, await _respawned(svc, victim, 0)

        victim, healed = asyncio.run(both())
        assert pid_alive(healed) and svc.embed(3).get(timeout=10) == 9
        assert zmesh.lookup("embedder").get(timeout=30).embed(4).get(timeout=10) == 12


def test_zmesh_stop_ends_the_orchestrator_and_every_replica(
    agent: dict[str, str], service: list[int]
) -> None:
    pids = _pids_of(agent, "embedder")  # the respawned replica too
    assert len(pids) == 3
    done = _zmesh(agent, "stop", "embedder")
    assert done.returncode == 0, done.stderr
    assert "embedder (detached) on ext: stopped" in done.stdout
    wait_gone(pids, 20, "the detached service's procs")
    with connected([agent["control"]], keys=agent["keys"]):
        with pytest.raises(zmesh.NameNotFoundError):
            zmesh.lookup("embedder").get(timeout=30)


def test_svc_stop_from_an_attached_script_ends_it(agent: dict[str, str]) -> None:
    _create(agent, "service")
    pids = wait_for(lambda: (p := _pids_of(agent, "embedder")) and len(p) == 3 and p, 30,
                    "the orchestrator and 2 replicas")  # fmt: skip
    with connected([agent["control"]], keys=agent["keys"]):
        svc = zmesh.lookup("embedder").get(timeout=30)
        assert svc.embed(2).get(timeout=10) == 6
        svc.stop().get(timeout=30)
        wait_gone(pids, 20, "the detached service's procs")
        with pytest.raises(zmesh.ActorStoppedError):
            svc.embed(2).get(timeout=10)


def test_a_detached_mesh_is_looked_up_as_an_actor_mesh(agent: dict[str, str]) -> None:
    assert _create(agent, "mesh") == "[5, 5]"
    with connected([agent["control"]], keys=agent["keys"]):
        mesh = zmesh.lookup("tables").get(timeout=30)
        assert isinstance(mesh, zmesh.ActorMesh)
        assert mesh.embed.call(2).get(timeout=30).values() == [10, 10]
        pids = mesh.pid.call().get(timeout=30).values()
    done = _zmesh(agent, "stop", "tables")
    assert done.returncode == 0 and "tables (detached)" in done.stdout, done.stdout + done.stderr
    wait_gone(pids, 20, "the detached mesh's procs")


def test_stop_of_a_looked_up_mesh_stops_its_procs_and_only_for_its_keys(
    agent: dict[str, str],
) -> None:
    assert _create(agent, "mesh") == "[5, 5]"
    with connected([agent["control"]], keys=agent["keys"]):
        mesh = zmesh.lookup("tables").get(timeout=30)
        pids = mesh.pid.call().get(timeout=30).values()
        blob = pickle.dumps(mesh)
    # A copy of the handle that reached other keys calls it, but cannot stop it.
    with connected([agent["control"]], keys=agent["other"]):
        theirs = pickle.loads(blob)
        with pytest.raises(zmesh.NameNotFoundError, match="no detached service or mesh"):
            theirs.stop().get(timeout=30)
    assert all(pid_alive(p) for p in pids)
    with connected([agent["control"]], keys=agent["keys"]):
        mesh = pickle.loads(blob)
        mesh.stop().get(timeout=30)
        wait_gone(pids, 20, "the detached mesh's procs")  # its procs, not only its actors
        with pytest.raises(zmesh.ActorStoppedError):
            mesh.embed.call(1).get(timeout=10)
        with pytest.raises(zmesh.NameNotFoundError):
            zmesh.lookup("tables").get(timeout=30)


class Admin(zmesh.Actor):
    """An actor that uses, finds and stops detached services from inside a mesh."""

    @zmesh.endpoint
    async def find_and_call(self, name: str) -> int:
        svc = await zmesh.lookup(name)
        result: int = await svc.embed(7)
        return result

    @zmesh.endpoint
    async def call(self, svc: Any) -> int:
        result: int = await svc.embed(5)
        return result

    @zmesh.endpoint
    async def stop_it(self, handle: Any) -> None:
        await handle.stop()


def test_an_actor_acts_for_the_keys_of_the_script_that_spawned_it(agent: dict[str, str]) -> None:
    _create(agent, "service")
    pids = wait_for(lambda: (p := _pids_of(agent, "embedder")) and len(p) == 3 and p, 30,
                    "the orchestrator and 2 replicas")  # fmt: skip
    with connected([agent["control"]], keys=agent["keys"]):
        blob = pickle.dumps(zmesh.lookup("embedder").get(timeout=30))
    # An actor of other keys (admitted by the agent): the handle calls, but
    # neither lookup nor stop reach a name that is not its script's.
    with connected([agent["control"]], keys=agent["other"]):
        theirs = Admin.options().as_actor().get(timeout=60)
        assert theirs.call.call_one(pickle.loads(blob)).get(timeout=30) == 15
        with pytest.raises(zmesh.ActorError, match="NameNotFoundError"):
            theirs.find_and_call.call_one("embedder").get(timeout=30)
        with pytest.raises(zmesh.ActorError, match="no detached service or mesh named 'embedder'"):
            theirs.stop_it.call_one(pickle.loads(blob)).get(timeout=30)
        theirs.stop().get(timeout=30)
    assert all(pid_alive(p) for p in pids)
    # An actor of the creator's keys finds it, and stops it with a handle passed in.
    with connected([agent["control"]], keys=agent["keys"]):
        ours = Admin.options().as_actor().get(timeout=60)
        assert ours.find_and_call.call_one("embedder").get(timeout=30) == 21
        ours.stop_it.call_one(pickle.loads(blob)).get(timeout=30)
        wait_gone(pids, 20, "the detached service's procs")
        with pytest.raises(zmesh.NameNotFoundError):
            zmesh.lookup("embedder").get(timeout=30)
        ours.stop().get(timeout=30)


class Plain(zmesh.Actor):
    @zmesh.endpoint
    def one(self) -> int:
        return 1


def test_detached_on_the_embedded_agent_is_a_typed_error() -> None:
    with pytest.raises(zmesh.DetachError, match=r"embedded agent.*ZMESH_AGENTS"):
        Plain.options(replicas=2, detached=True).spawn()
    with pytest.raises(zmesh.DetachError, match="zmesh agent"):
        Plain.options(detached=True).as_actor()
    assert isinstance(zmesh.DetachError("x"), zmesh.SpawnError)
    with pytest.raises(zmesh.NameNotFoundError, match="no agents are configured"):
        zmesh.lookup("embedder").get(timeout=10)
