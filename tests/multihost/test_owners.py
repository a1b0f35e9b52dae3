"""An owner on another host: its agent cannot watch its process, only its heartbeats.

The owner runs in a namespace of its own network *and* pids, so that, to the
agent, it is as remote as a client on another machine: its pid means nothing
there, and only the heartbeat grace (``ZMESH_OWNER_GRACE``, made short here)
can tell that it died.
"""

from __future__ import annotations

import json
import os
import pickle
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zmesh
from zmesh._host.agent.ptree import children
from zmesh._wire.security import Keys, authorize, keygen_client

from _actors import Ranked
from _helpers import connected, pid_alive, run_python
from netns_cluster import NetnsCluster

GRACE = 2.0
INTRUDER = Path(__file__).parents[1] / "security" / "owner_intruder.py"

OWNER = """
import json, os, sys, time
import zmesh

class Pid(zmesh.Actor):
    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

if __name__ == "__main__":
    zmesh.connect([sys.argv[1]], keys=sys.argv[2])
    mesh = Pid.options(procs=2).as_actor().get(timeout=60)
    print(json.dumps(mesh.pid.call().get(timeout=30).values()), flush=True)
    time.sleep(120)
"""


@pytest.fixture
def short_grace(keys_dir: str) -> Iterator[NetnsCluster]:
    """Two hosts whose agents give a silent owner only ``GRACE`` seconds."""
    with NetnsCluster(2, keys=keys_dir, env={"ZMESH_OWNER_GRACE": str(GRACE)}) as cluster:
        yield cluster


def test_a_dead_remote_owner_loses_its_procs_after_the_grace(
    short_grace: NetnsCluster, keys_dir: str, tmp_path: Path
) -> None:
    agent, elsewhere = short_grace.hosts
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    popen = subprocess.Popen(
        ["ip", "netns", "exec", elsewhere.netns, "unshare", "--pid", "--fork", "--mount-proc",
         sys.executable, str(script), agent.control, keys_dir],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert popen.stdout is not None
        ready, _, _ = select.select([popen.stdout], [], [], 60)
        line = popen.stdout.readline() if ready else ""
        if not line:
            popen.kill()
            pytest.fail(f"the owner did not start: {popen.communicate(timeout=10)}")
        pids = json.loads(line)
        assert all(pid_alive(p) for p in pids)
        (owner,) = children(popen.pid)  # the owner: pid 1 of its own pid namespace

        os.kill(owner, signal.SIGKILL)  # and with it, everything in its namespace
        killed = time.monotonic()
        # Its last heartbeat was at most 0.5 s before: the grace has not run out.
        while time.monotonic() < killed + GRACE - 0.7:
            assert all(pid_alive(p) for p in pids), "reaped before the grace: not judged remote"
            time.sleep(0.05)
        while any(pid_alive(p) for p in pids):
            assert time.monotonic() < killed + GRACE + 3.0, "procs outlived the grace"
            time.sleep(0.02)
        took = time.monotonic() - killed
        print(f"\nLATENCY remote owner kill -9 -> procs gone (grace {GRACE}s): {took * 1e3:.0f} ms")
        log = Path(agent.log_dir, "agent.log").read_text()
        assert "silent for" in log, log[-2000:]
    finally:
        if popen.poll() is None:
            popen.kill()
        popen.communicate(timeout=10)


# ------------------------------------------ another admitted key against our meshes


@pytest.fixture
def bob_keys(keys_dir: str, tmp_path: Path) -> str:
    """A second client's own keypair, admitted by the agents as the first one is."""
    path = str(tmp_path / "bob")
    made = keygen_client(path, Keys.load(keys_dir).public)
    authorize(keys_dir, made.public, "bob")
    return path


@pytest.mark.stress
def test_another_admitted_key_changes_nothing_of_ours_on_either_host(
    keys_dir: str, client_keys: str, bob_keys: str, tmp_path: Path
) -> None:
    """Hosts apart, CURVE on every socket, two keys the agents admit: B gets A's
    handles and A's owner id, and can only call (tests/security/test_owner_acts.py)."""
    with NetnsCluster(2, keys=keys_dir) as cluster, connected(cluster.controls, client_keys):
        first, second = cluster.controls
        procs = zmesh.this_host().spawn_procs(per_host={"procs": 2}).get(timeout=90)
        try:
            assert procs._refs[0].agent == first
            env = {"ZMESH_KEYS": bob_keys, "ZMESH_AGENTS": ",".join(cluster.controls)}

            def intrude(given: dict[str, Any]) -> dict[str, Any]:
                done = run_python(
                    [str(INTRUDER), pickle.dumps(given).hex(), first, second], 120, env=env
                )
                out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
                return out

            # A's id, read on host 0, gives nothing on host 1, which A has not used yet.
            out = intrude({"procs": procs})
            assert "is not proven by the secret" in out["squat"], out
            assert "may stop it" in out["raw_stop_mesh"], out
            both = Ranked.options(hosts=2).as_actor().get(timeout=90)  # on host 1 too
            guest = procs.spawn("guest", Ranked).get(timeout=60)
            svc = Ranked.options(replicas=2).as_service().get(timeout=90)
            try:
                out = intrude({"owned": both, "guest": guest, "procs": procs, "svc": svc})
                for key in ("stop_owned", "stop_guest", "stop_replica"):
                    assert out[key].startswith("SecurityError: "), out
                    assert "may stop its actors" in out[key], out
                assert "may spawn actors into it" in out["spawn"], out
                assert out["raw_stop"].startswith("denied: "), out
                assert out["raw_spawn"].startswith("denied: "), out
                # Everything of A's still serves, on both hosts.
                assert both.ping.call().get(timeout=20).values() == [0, 1]
                assert guest.ping.call().get(timeout=20).values() == [0, 1]
                assert [svc.ping().get(timeout=20) for _ in range(4)] == [0] * 4
            finally:
                svc.stop().get(timeout=30)
                both.stop().get(timeout=30)
        finally:
            procs.stop().get(timeout=30)
