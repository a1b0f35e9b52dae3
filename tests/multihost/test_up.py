"""``zmesh up`` / ``zmesh down`` across three real (namespaced) hosts, through a launcher."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import zmesh
from zmesh._client.control import local as _local
from zmesh._shared import registry
from zmesh._wire import security as _security

from netns_cluster import NetnsCluster


class Where(zmesh.Actor):
    @zmesh.endpoint
    def where(self) -> int:
        return os.stat("/proc/self/ns/net").st_ino  # the namespace this proc runs in


class BareHosts(NetnsCluster):
    """The namespaces and their network, no agents: ``zmesh up`` starts those."""

    def _start_agent(self, h: object) -> None:
        pass


@pytest.fixture
def hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, NetnsCluster]]:
    runtime = tempfile.mkdtemp(prefix="zu-", dir="/tmp")
    monkeypatch.setenv("ZMESH_RUNTIME_DIR", runtime)  # the hosts' registry: shared /tmp
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # where keys and logs are copied
    monkeypatch.setenv("ZMESH_FORWARD_LOGS", "0")
    with BareHosts(3) as cluster:
        hostfile = tmp_path / "hosts.txt"
        hostfile.write_text(
            "# netns  address\n" + "".join(f"{h.netns} {h.ip}\n" for h in cluster.hosts)
        )
        try:
            yield hostfile, cluster
        finally:
            zmesh.shutdown()
            _local.configure(None)
            _security.use(None)
            # Whatever up started and down did not stop (a failed test).
            for e in registry.live():
                os.kill(e.pid, 15)
            shutil.rmtree(runtime, ignore_errors=True)


def _zmesh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zmesh", *args], capture_output=True, text=True, timeout=120
    )


def test_up_starts_an_agent_per_host_and_down_stops_them(
    hosts: tuple[Path, NetnsCluster], tmp_path: Path
) -> None:
    hostfile, cluster = hosts
    launch = ["--launcher", "ip netns exec {host}", "--zmesh", f"{sys.executable} -m zmesh"]
    keys = str(tmp_path / "keys")
    up = _zmesh("up", str(hostfile), "--keys", keys, *launch, "--json")
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    assert info["agents"] == [f"tcp://{h.ip}:7411" for h in cluster.hosts]
    assert info["keys"] == keys and os.path.exists(os.path.join(keys, "zmesh.key_secret"))
    # The keys went to each host, private; each agent runs in its own namespace.
    for h in cluster.hosts:
        copied = tmp_path / "home" / ".zmesh" / "up" / h.netns / "keys"
        assert (copied / "zmesh.key_secret").stat().st_mode & 0o077 == 0
    entries = registry.live()
    assert sorted(e.label for e in entries) == sorted(h.netns for h in cluster.hosts)
    for e in entries:
        ns = os.stat(f"/proc/{e.pid}/ns/net").st_ino
        assert ns == os.stat(f"/run/netns/{e.label}").st_ino
    # A client with the printed keys uses all three.
    zmesh.connect(info["agents"], keys=info["keys"])
    mesh = Where.options(hosts=3).as_actor().get(timeout=60)
    where = mesh.where.call().get(timeout=30).values()
    assert where == [os.stat(f"/run/netns/{h.netns}").st_ino for h in cluster.hosts]
    mesh.stop().get(timeout=30)
    zmesh.shutdown()
    # Down: every agent stops (through the same launcher).
    down = _zmesh("down", str(hostfile), *launch, "--json")
    assert down.returncode == 0, down.stdout + down.stderr
    assert [r["ok"] for r in json.loads(down.stdout)] == [True, True, True]
    deadline = time.monotonic() + 15
    while any(registry.running(e) for e in entries) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(registry.running(e) for e in entries), "the agents outlived zmesh down"
    assert registry.live() == []


def test_up_says_which_host_did_not_come_up(
    hosts: tuple[Path, NetnsCluster], tmp_path: Path
) -> None:
    hostfile, cluster = hosts
    bad = tmp_path / "bad.txt"
    bad.write_text(f"{cluster.hosts[0].netns} {cluster.hosts[0].ip}\nnosuchns 10.213.0.99\n")
    up = _zmesh("up", str(bad), "--launcher", "ip netns exec {host}", "--timeout", "10")
    assert up.returncode == 2 and "Traceback" not in up.stderr
    assert "nosuchns" in up.stderr
    down = _zmesh("down", str(hostfile), "--launcher", "ip netns exec {host}")
    assert "stopped" in down.stdout or "no agent" in down.stdout + down.stderr
