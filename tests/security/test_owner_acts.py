"""Another admitted client against what it does not own, where the message lands.

Client A (this test process) makes meshes and a service; client B (a
process of its own, with keys of its own on TCP) gets A's handles as values
and A's owner id from a ``GetState``, and tries to change what A owns:

* through the API: stop A's actor mesh through its handle (the handle of a
  mesh that owns its procs, and of one spawned into a ``ProcMesh``), spawn
  into A's ``ProcMesh``, stop a replica of A's service;
* on the wire: a ``StopActor`` or ``SpawnActor`` sent straight to a proc's
  socket, with a guessed key or none;
* as A: a ``CreateOrUpdate`` on an agent A has not used yet, under A's id
  with B's own secret (squatting the id), and ``Stop``/``OwnerGone`` for A.

B may call A's actors (a handle is a capability to call), nothing else:
each attempt is a ``SecurityError`` (or a refused ``Ack``/``Failure``) whose
words fit the action, and A's meshes, service and next spawn are untouched.
Both one-host transports: ipc:// (same uid: the owner's secret is the proof)
and loopback TCP with CURVE, each client with its own authorised key.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import zmesh
from zmesh import testing
from zmesh._client.control import local as _local
from zmesh._client.control import lookup as _lookup
from zmesh._wire import messages as w
from zmesh._wire import security as _security

from _actors import Ranked, Worker, expected
from _helpers import (
    connected,
    keyed_loopback_agent,
    pid_alive,
    replica_pids,
    run_python,
    wait_for,
)

INTRUDER = Path(__file__).with_name("owner_intruder.py")


@pytest.fixture(params=["ipc", "curve"])
def two_clients(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[list[str], dict[str, str]]]:
    """Two agents, client A (this process) connected to them; B's environment."""
    with ExitStack() as stack:
        if request.param == "ipc":
            agents = stack.enter_context(testing.local_cluster(2))
            controls, env = [a.control for a in agents], {}
        else:
            keys = str(tmp_path / "cluster")
            _security.keygen(keys)
            server = _security.Keys.load(keys).public
            pairs = {}
            for who in ("alice", "bob"):
                pairs[who] = str(tmp_path / who)
                made = _security.keygen_client(pairs[who], server)
                _security.authorize(keys, made.public, who)
            controls = [
                stack.enter_context(keyed_loopback_agent(keys, tmp_path / f"logs{i}", f"host{i}"))
                for i in range(2)
            ]
            stack.enter_context(connected(controls, keys=pairs["alice"]))
            env = {"ZMESH_KEYS": pairs["bob"]}
        yield controls, env


def _intrude(
    tmp_path: Path, given: dict[str, Any], controls: list[str], env: dict[str, str]
) -> dict[str, Any]:
    done = run_python(
        [str(INTRUDER), pickle.dumps(given).hex(), *controls], 120,
        env={**env, "ZMESH_AGENTS": ",".join(controls)},
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _refused(out: dict[str, Any], key: str, *words: str) -> None:
    got = out[key]
    assert all(word in got for word in words), f"{key}: {got!r} (all: {out})"


@pytest.mark.stress
def test_another_client_changes_nothing_it_does_not_own(
    two_clients: tuple[list[str], dict[str, str]], tmp_path: Path
) -> None:
    controls, env = two_clients
    owned = Ranked.options(procs=2).as_actor().get(timeout=60)
    procs = zmesh.this_host().spawn_procs(per_host={"procs": 2}).get(timeout=60)
    guest = procs.spawn("guest", Ranked).get(timeout=60)
    svc = Worker.options(replicas=2).as_service().get(timeout=90)
    try:
        pids = owned.pid.call().get(timeout=20).values() + guest.pid.call().get(timeout=20).values()

        def replica_pids() -> list[int]:
            meshes = [svc.replica(i) for i in range(2)]
            assert all(m is not None for m in meshes)
            return [m.pid.call_one().get(timeout=20) for m in meshes if m is not None]

        replicas = replica_pids()
        given = {"owned": owned, "guest": guest, "procs": procs, "svc": svc}
        out = _intrude(tmp_path, given, controls, env)

        assert out["call"] == [0, 1]  # a handle is a capability to call
        for key in ("stop_owned", "stop_guest", "stop_replica"):
            _refused(out, key, "SecurityError: ", "not the owner", "may stop its actors")
        _refused(out, "spawn", "SecurityError: ", "not the owner", "may spawn actors into it")
        _refused(out, "raw_stop", "denied: ", "may stop its actors")
        _refused(out, "raw_stop_none", "denied: ", "may stop its actors")
        _refused(out, "raw_spawn", "denied: ", "may spawn actors into it")

        # Nothing of A's changed: every actor answers, in the same processes.
        assert all(pid_alive(p) for p in pids)
        assert owned.ping.call().get(timeout=20).values() == [0, 1]
        assert guest.ping.call().get(timeout=20).values() == [0, 1]
        assert replica_pids() == replicas  # the same replicas, serving
        assert sorted(svc.work(i).get(timeout=20) for i in range(4)) == sorted(
            expected(i) for i in range(4)
        )
        # A's own stops still work, where they land.
        guest.stop().get(timeout=20)
        with pytest.raises(zmesh.ActorStoppedError):
            guest.ping.call().get(timeout=20)
    finally:
        svc.stop().get(timeout=30)
        procs.stop().get(timeout=20)
        owned.stop().get(timeout=20)


@pytest.mark.stress
def test_an_owner_id_read_from_one_agent_is_worth_nothing_on_another(
    two_clients: tuple[list[str], dict[str, str]], tmp_path: Path
) -> None:
    controls, env = two_clients
    procs = zmesh.this_host().spawn_procs(per_host={"procs": 1}).get(timeout=60)  # the first agent
    try:
        out = _intrude(tmp_path, {"procs": procs}, controls, env)
        assert out["a"] == _local.owner_id()  # public: GetState carries it
        # Under A's id with B's secret: refused on the agent A has not used yet
        # and on the one it has, in words that say why.
        _refused(out, "squat", "the owner id", "is not proven by the secret")
        _refused(out, "squat_first", "is not proven by the secret")
        _refused(out, "raw_stop_mesh", "not the owner", "may stop it")
        _refused(out, "owner_gone", "not the owner", "may say that it exited")
        _refused(out, "same_name", "not the owner", "may update it or spawn under its name")
        # A forged hello (from a proc without the mesh's key) moves no rank.
        assert out["addr_after"] == out["addr_before"] == procs._refs[0].addr
        # A spawns on both agents, the one B tried to take its id on too.
        both = Ranked.options(hosts=2).as_actor().get(timeout=60)
        assert both.ping.call().get(timeout=20).values() == [0, 1]
        both.stop().get(timeout=20)
        assert procs.spawn("still", Ranked).get(timeout=30).ping.call_one().get(timeout=20) == 0
    finally:
        procs.stop().get(timeout=20)


# ------------------------------------- a detached service's table, forged


@pytest.fixture
def keyed_agent_and_bob(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A ``zmesh agent`` on CURVE TCP; A connected with its key; B's environment."""
    keys = str(tmp_path / "cluster")
    _security.keygen(keys)
    pairs = {}
    for who in ("alice", "bob"):
        pairs[who] = str(tmp_path / who)
        made = _security.keygen_client(pairs[who], _security.Keys.load(keys).public)
        _security.authorize(keys, made.public, who)
    with keyed_loopback_agent(keys, tmp_path / "logs", "kept") as control:
        with connected([control], keys=pairs["alice"]):
            yield control, {"ZMESH_KEYS": pairs["bob"], "ZMESH_AGENTS": control}


def _orchestrator(control: str, svc: Any) -> tuple[int, int]:
    """``(pid, generation)`` of the service's running orchestrator (0s: none)."""
    mesh = svc._detached[1].proc_mesh
    reply = _lookup.on_home(
        lambda rt: rt.controller.agent(control).request(lambda i: w.GetState(i, mesh), timeout=10)
    ).get(timeout=15)
    running = [r for m in reply.meshes for r in m.ranks if r.status.value == "Running"]
    return (running[0].pid, running[0].generation) if running else (0, 0)


@pytest.mark.stress
def test_a_restarted_orchestrator_adopts_its_own_table_not_a_forged_one(
    keyed_agent_and_bob: tuple[str, dict[str, str]],
) -> None:
    # B floods the agent with A's service's table, every replica marked
    # given up, as if from its orchestrator; then A's orchestrator is
    # killed. The next one must adopt the replicas as they are.
    control, env = keyed_agent_and_bob
    svc = Worker.options(name="kept", replicas=2, detached=True).spawn().get(timeout=90)
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **env)
    forger: subprocess.Popen[str] | None = None
    try:
        before = sorted(asyncio.run(replica_pids(svc)))
        given = pickle.dumps({"service": "kept"}).hex()
        forger = subprocess.Popen(
            [sys.executable, str(INTRUDER), given, control],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full,
        )  # fmt: skip
        assert forger.stdout is not None
        ready, _, _ = select.select([forger.stdout], [], [], 60)
        assert ready and forger.stdout.readline().strip() == "forging", "the forger did not start"
        pid, gen = _orchestrator(control, svc)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: _orchestrator(control, svc)[1] > gen, 30, "the orchestrator restarted")

        # The new orchestrator answers once it has adopted what it found: the
        # same replica processes, every one serving (not given up, not stopped).
        fresh = zmesh.lookup("kept").get(timeout=30)
        assert fresh.statistics().state == "OK", fresh.statistics()
        assert sorted(asyncio.run(replica_pids(fresh))) == before
        assert [svc.work(i).get(timeout=20) for i in range(4)] == [expected(i) for i in range(4)]
        assert all(pid_alive(p) for p in before)
    finally:
        if forger is not None:
            forger.kill()
            forger.communicate(timeout=10)
        svc.stop().get(timeout=30)
