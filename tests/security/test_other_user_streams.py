"""Another local user (``nobody``) against what landed last round: the agents'
log streams (actors' output, forwarded) and the TCP inboxes of ports.

Each is something zmesh binds, so each must refuse a peer with neither
filesystem permission nor a key (``../shared/DESIGN.md``, Security). The
attacker is ``tests/integration/zmtp_attacker.py``, run as ``nobody``: it
speaks ZMTP with the NULL mechanism, subscribes to everything on a PUB, and
sends a forged message to a ROUTER. While it tries, our actor prints a
secret on stdout and stderr (so the agent is forwarding), and the forged
port value must never arrive.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

import zmesh
from zmesh import Channel, Port
from zmesh._client.control import local as _local
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.codec import Codec

from _helpers import connected, keyed_loopback_agent, run_attacker_as_nobody

SECRET = "s3cret-" + os.urandom(4).hex()


class Chatty(zmesh.Actor):
    """Prints SECRET on both streams, from a thread, until told to stop."""

    def __init__(self) -> None:
        self.hush = threading.Event()
        threading.Thread(target=self._talk, daemon=True).start()

    def _talk(self) -> None:
        while not self.hush.wait(0.05):
            print(f"out {SECRET}", flush=True)
            print(f"err {SECRET}", file=sys.stderr, flush=True)

    @zmesh.endpoint
    async def quiet(self) -> None:
        self.hush.set()

    @zmesh.endpoint
    async def send(self, port: Port[Any], value: Any) -> str:
        port.send(value)
        return port.route()[0]


def _python_for(user: str) -> str | None:
    """A Python interpreter ``user`` can run (the venv's may sit in root's home)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return None
    for py in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        ok = subprocess.run(
            ["runuser", "-u", user, "--", py, "-c", "pass"], capture_output=True, timeout=30
        )
        if ok.returncode == 0:
            return py
    return None


@pytest.fixture(scope="module")
def py() -> str:
    found = _python_for("nobody")
    if found is None:
        pytest.skip("needs root, runuser and a Python the user nobody can run")
    return found


@pytest.fixture
def attack_dir() -> Iterator[str]:
    """A directory ``nobody`` can read (pytest's tmp_path is private to us)."""
    path = tempfile.mkdtemp(prefix="zmesh-attack-")
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def attack(py: str, attack_dir: str, plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the attacker as ``nobody`` on ``plan``; one result per target."""
    results = run_attacker_as_nobody(py, attack_dir, plan)
    assert [r["name"] for r in results] == [t["name"] for t in plan]
    return results


def describe(control: str) -> w.AgentInfo:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    s = _security.secure_client(ctx.socket(zmq.DEALER), addr=control)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(control)
    try:
        s.send_multipart(Codec(w.AGENT_INBOX).encode(w.Describe(1)))
        assert s.poll(10_000), f"the agent at {control} did not answer"
        info = Codec(w.AGENT_REPLIES).decode(s.recv_multipart())
    finally:
        s.close(linger=0)
    assert isinstance(info, w.AgentInfo) and info.logs
    return info


def plan_for(info: w.AgentInfo, mesh: zmesh.ActorMesh[Any]) -> list[dict[str, Any]]:
    ref = mesh._refs[0]
    get_logs = Codec(w.AGENT_INBOX).encode(w.GetLogs(1, ref.mesh, 0, limit=4096))
    return [
        {"name": "logs", "addr": info.logs, "type": "SUB", "frames": []},
        {"name": "getlogs", "addr": info.control, "type": "DEALER",
         "frames": [f.hex() for f in get_logs]},
    ]  # fmt: skip


def no_secret(results: list[dict[str, Any]]) -> None:
    leaked = [r for r in results if SECRET.encode().hex() in r.get("reply", "")]
    assert not leaked, f"nobody read our actors' output: {leaked}"
    assert {r["result"] for r in results} <= {"refused", "closed"}, results


def test_nobody_reads_no_output_from_the_embedded_agents_log_stream(
    py: str, attack_dir: str
) -> None:
    mesh = Chatty.options().as_actor().get(timeout=60)
    try:
        info = describe(_local.agents(1)[0])
        assert info.logs.startswith("ipc://")
        results = attack(py, attack_dir, plan_for(info, mesh))
        no_secret(results)
        # The kernel refuses: the socket is in a directory only we may enter.
        assert all(r["result"] == "refused" for r in results), results
    finally:
        mesh.quiet.call_one().get(timeout=10)
        mesh.stop().get(timeout=30)


def test_nobody_reads_no_output_from_a_keyed_agents_log_stream(
    py: str, attack_dir: str, tmp_path: Path
) -> None:
    keys = str(tmp_path / "keys")
    _security.keygen(keys)
    with keyed_loopback_agent(keys, tmp_path / "logs", "keyed") as control:
        with connected([control], keys=keys):
            mesh = Chatty.options().as_actor().get(timeout=60)
            info = describe(control)
            assert info.logs.startswith("tcp://127.0.0.1:")  # reachable by every uid
            results = attack(py, attack_dir, plan_for(info, mesh))
            no_secret(results)
            mesh.quiet.call_one().get(timeout=10)


def test_nobody_cannot_send_to_a_ports_inbox(py: str, attack_dir: str) -> None:
    port, receiver = Channel.open()
    mesh = Chatty.options().as_actor().get(timeout=60)
    try:
        payload, buffers = Codec.pack_value("forged")
        forged = Codec(w.PORT_INBOX).encode(w.PortSend(port.number, 0, payload), buffers)
        plan = [{"name": "port", "addr": port.addr, "type": "DEALER",
                 "frames": [bytes(f).hex() for f in forged]}]  # fmt: skip
        results = attack(py, attack_dir, plan)
        assert results[0]["result"] == "refused", results
        mesh.send.call_one(port, "genuine").get(timeout=10)
        assert receiver.recv().get(timeout=10) == "genuine"
        with pytest.raises(zmesh.CallTimeoutError):
            receiver.recv().get(timeout=0.5)
    finally:
        mesh.quiet.call_one().get(timeout=10)
        mesh.stop().get(timeout=30)
        receiver.close()
