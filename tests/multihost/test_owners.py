"""An owner on another host: its agent cannot watch its process, only its heartbeats.

The owner runs in a namespace of its own network *and* pids, so that, to the
agent, it is as remote as a client on another machine: its pid means nothing
there, and only the heartbeat grace (``ZMESH_OWNER_GRACE``, made short here)
can tell that it died.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from zmesh._host.ptree import children

from _helpers import pid_alive
from netns_cluster import NetnsCluster

GRACE = 2.0

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
