"""``zmesh cluster --agents N``: N loopback agents as N hosts, stopped on Ctrl+C."""

from __future__ import annotations

import signal
import subprocess
import sys

from _fabric import read_line, session_pids, wait_for

import zmesh
from zmesh import _local


class Host(zmesh.Actor):
    @zmesh.endpoint
    def rank(self) -> int:
        return zmesh.current_rank().rank


def test_cluster_command_serves_hosts_until_ctrl_c() -> None:
    cluster = subprocess.Popen(
        [sys.executable, "-m", "zmesh", "cluster", "--agents", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, text=True,
    )  # fmt: skip
    try:
        line = read_line(cluster, 30)
        assert line.startswith("ZMESH_AGENTS="), line
        agents = line.strip().split("=", 1)[1].split(",")
        assert len(agents) == 2 and all(a.startswith("tcp://127.0.0.1:") for a in agents)
        zmesh.connect(agents)
        mesh = Host.options(hosts=2, procs=2).as_actor().get(timeout=60)
        assert mesh.rank.call().get(timeout=10).values() == [0, 1, 2, 3]
        assert {r.agent for r in mesh._refs} == set(agents)  # one host slice per agent
        procs = session_pids("proc")
        assert procs
        cluster.send_signal(signal.SIGINT)
        assert cluster.wait(timeout=15) == 0
        wait_for(lambda: not (session_pids("proc") & procs), 10, "the cluster's procs to go")
    finally:
        zmesh.shutdown()
        _local.configure(None)
        if cluster.poll() is None:
            cluster.kill()
            cluster.wait()
        for pipe in (cluster.stdout, cluster.stderr):
            if pipe is not None:
                pipe.close()


def test_hostfile_lists_agents(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
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
