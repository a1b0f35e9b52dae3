"""``zmesh cluster --agents N``: N local agents as N hosts, stopped on Ctrl+C."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import zmesh
from zmesh._client.control import local as _local
from zmesh._wire import security as _security

from _helpers import read_line, session_pids, wait_for


class Host(zmesh.Actor):
    @zmesh.endpoint
    def rank(self) -> int:
        return zmesh.current_rank().rank


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_cluster_command_serves_hosts_until_ctrl_c(transport: str) -> None:
    cmd = [sys.executable, "-m", "zmesh", "cluster", "--agents", "2"]
    cluster = subprocess.Popen(
        cmd + (["--tcp"] if transport == "tcp" else []),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, text=True,
    )  # fmt: skip
    keys = None
    try:
        line = read_line(cluster, 30)
        assert line.startswith("ZMESH_AGENTS="), line
        agents = line.strip().split("=", 1)[1].split(",")
        if transport == "ipc":  # private sockets: no keys needed, none printed
            assert len(agents) == 2 and all(a.startswith("ipc://") for a in agents)
        else:  # loopback TCP is CURVE, with keys made for the run
            assert len(agents) == 2 and all(a.startswith("tcp://127.0.0.1:") for a in agents)
            assert cluster.stdout is not None
            # Printed with the line above, so it is in the pipe's buffer already
            # (where select() would not see it).
            keys_line = cluster.stdout.readline()
            assert keys_line.startswith("ZMESH_KEYS="), keys_line
            keys = keys_line.strip().split("=", 1)[1]
            assert stat.S_IMODE(os.stat(keys).st_mode) == 0o700
        zmesh.connect(agents, keys=keys)
        mesh = Host.options(hosts=2, procs=2).as_actor().get(timeout=60)
        assert mesh.rank.call().get(timeout=10).values() == [0, 1, 2, 3]
        assert {r.agent for r in mesh._refs} == set(agents)  # one host slice per agent
        procs = session_pids("proc")
        assert procs
        cluster.send_signal(signal.SIGINT)
        assert cluster.wait(timeout=15) == 0
        wait_for(lambda: not (session_pids("proc") & procs), 10, "the cluster's procs to go")
        if keys is not None:
            assert not os.path.exists(keys)  # throwaway keys go with the cluster
    finally:
        zmesh.shutdown()
        _local.configure(None)
        _security.use(None)
        if cluster.poll() is None:
            cluster.kill()
            cluster.wait()
        for pipe in (cluster.stdout, cluster.stderr):
            if pipe is not None:
                pipe.close()


def test_hostfile_lists_agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two hosts\ntcp://127.0.0.1:7001\n\ntcp://127.0.0.1:7002  # b\n")
    monkeypatch.delenv("ZMESH_AGENTS", raising=False)
    monkeypatch.setenv("ZMESH_HOSTFILE", str(hostfile))
    assert _local.configured_agents() == ["tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002"]
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    monkeypatch.setenv("ZMESH_HOSTFILE", str(empty))
    import pytest

    with pytest.raises(zmesh.AgentError, match="lists no agent"):
        _local.configured_agents()
