"""CURVE keys, fail-closed agents, and sockets that admit only authorised keys."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

import zmesh
from zmesh import _local, _security
from zmesh import _wire as w
from zmesh._local import await_ready


def test_keygen_writes_a_private_secret_and_authorises_the_public_key(tmp_path: Path) -> None:
    d = tmp_path / "keys"
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "keygen", str(d)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(os.stat(d / "zmesh.key_secret").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    keys = _security.Keys.load(str(d))
    assert keys.public.decode() in (d / "authorized" / "zmesh.key").read_text()
    assert keys.secret.decode() not in (d / "zmesh.key").read_text()
    again = subprocess.run(
        [sys.executable, "-m", "zmesh", "keygen", str(d)], capture_output=True, text=True
    )
    assert again.returncode == 2 and "already holds keys" in again.stderr


def test_agent_refuses_a_non_loopback_bind_without_keys() -> None:
    # Refused before anything is bound.
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "agent", "--bind", "tcp://0.0.0.0:0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert "refusing to bind tcp://0.0.0.0:0" in done.stderr
    assert "zmesh keygen" in done.stderr and "--insecure" in done.stderr


def test_unreadable_keys_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(zmesh.SecurityError, match="zmesh keygen"):
        _security.Keys.load(str(tmp_path / "nope"))


@pytest.fixture
def keyed_agent(tmp_path: Path) -> Iterator[tuple[str, str]]:
    keys = str(tmp_path / "keys")
    _security.keygen(keys)
    logs = tmp_path / "logs"
    logs.mkdir()
    with open(logs / "agent.log", "ab") as err:
        popen = subprocess.Popen(
            [sys.executable, "-m", "zmesh", "agent", "--bind", "tcp://127.0.0.1:0",
             "--keys", keys, "--label", "keyed", "--log-dir", str(logs)],
            stdout=subprocess.PIPE, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        info = await_ready(popen, str(logs / "agent.log"))
        yield info["control"], keys
    finally:
        zmesh.shutdown()
        _local.configure(None)
        _security.use(None)
        popen.terminate()
        popen.wait(timeout=10)


class Echo(zmesh.Actor):
    @zmesh.endpoint
    def echo(self, x: object) -> object:
        return x


def _answers(addr: str, curve: tuple[bytes, bytes, bytes] | None, msg: list[bytes]) -> bool:
    """Whether a raw DEALER (NULL, or CURVE with ``curve``) gets any reply in 1.5 s."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        s.curve_serverkey, s.curve_publickey, s.curve_secretkey = curve
    s.connect(addr)
    try:
        s.send_multipart(msg)
        return bool(s.poll(1500))
    finally:
        s.close(linger=0)


def test_keyed_agent_and_procs_admit_only_authorised_keys(keyed_agent: tuple[str, str]) -> None:
    control, keys_dir = keyed_agent
    keys = _security.Keys.load(keys_dir)
    zmesh.connect([control], keys=keys_dir)
    mesh = Echo.options(procs=2).as_actor().get(timeout=60)
    assert mesh.echo.call([1, (2, 3)]).get(timeout=10).values() == [[1, (2, 3)]] * 2

    describe = w.Codec(w.AGENT_INBOX).encode(w.Describe(1))
    stranger_pub, stranger_sec = zmq.curve_keypair()
    # The right keys get an answer; a stranger's key and no key at all do not.
    assert _answers(control, (keys.public, keys.public, keys.secret), describe)
    assert not _answers(control, (keys.public, stranger_pub, stranger_sec), describe)
    assert not _answers(control, None, describe)
    # The procs' own sockets are CURVE-protected too.
    payload, _ = w.Codec.pack((1,), {})
    call = w.Codec(w.PROC_INBOX).encode(w.Call(1, mesh.actor, "echo", payload))
    proc = mesh._refs[0].addr
    assert _answers(proc, (keys.public, keys.public, keys.secret), call)
    assert not _answers(proc, (keys.public, stranger_pub, stranger_sec), call)
    assert not _answers(proc, None, call)


def test_ps_reaches_a_keyed_agent_only_with_its_keys(keyed_agent: tuple[str, str]) -> None:
    control, keys_dir = keyed_agent
    zmesh.connect([control], keys=keys_dir)
    mesh = Echo.options(procs=2).as_actor().get(timeout=60)
    pids = {r.pid for r in mesh.state().ranks.values()}
    cmd = [sys.executable, "-m", "zmesh", "ps", "--json", "--agents", control, "--timeout", "5"]
    env = {k: v for k, v in os.environ.items() if k != "ZMESH_KEYS"}
    with_keys = subprocess.run(
        [*cmd, "--keys", keys_dir], capture_output=True, text=True, timeout=60, env=env
    )
    assert with_keys.returncode == 0, with_keys.stderr
    assert pids <= {p["pid"] for p in json.loads(with_keys.stdout)}
    without = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert not any(str(pid) in without.stdout for pid in pids)
