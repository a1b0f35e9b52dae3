"""CURVE keys, fail-closed agents, and sockets that admit only authorised keys."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from _fabric import wait_for

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


# ------------------------------------------------------------ other local users

ATTACKER = Path(__file__).with_name("zmtp_attacker.py")


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


class _Evil:
    """Unpickling this runs a shell command: what a pickled SpawnActor can do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"id -u > {self.marker}",))


def _plan(attack_dir: str, control: str, stream: str, proc: str, mesh: str) -> list[dict[str, Any]]:
    evil = os.path.join(attack_dir, "evil.py")
    with open(evil, "w") as f:
        f.write(f"import os\nopen({os.path.join(attack_dir, 'pwned-agent')!r}, 'w')"
                ".write(str(os.getuid()))\n")  # fmt: skip
    os.chmod(evil, 0o644)
    create = w.Codec(w.AGENT_INBOX).encode(
        w.CreateOrUpdate(
            1, "pwn", w.ProcSpec(owner="mallory:1:0", ranks=[0], dims={"procs": 1},
                                 main={"init_main_from_path": evil}),
        )
    )  # fmt: skip
    spawn = w.Codec(w.PROC_INBOX).encode(
        w.SpawnActor(
            1, "pwn", pickle.dumps(_Evil(os.path.join(attack_dir, "pwned-proc"))),
            w.Payload(), mesh, {"procs": 1}, 0,
        )
    )  # fmt: skip
    return [
        {"name": "control", "addr": control, "type": "DEALER", "frames": [f.hex() for f in create]},
        {"name": "stream", "addr": stream, "type": "SUB", "frames": []},
        {"name": "proc", "addr": proc, "type": "DEALER", "frames": [f.hex() for f in spawn]},
    ]


def _ask(control: str, msg: Any) -> Any:
    """One control request to an agent, as its owner (same user, same keys)."""
    ctx = zmq.Context.instance()
    s = _security.secure_client(ctx.socket(zmq.DEALER), addr=control)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(control)
    try:
        s.send_multipart(w.Codec(w.AGENT_INBOX).encode(msg))
        assert s.poll(10_000), f"the agent at {control} did not answer its owner"
        return w.Codec(w.AGENT_REPLIES).decode(s.recv_multipart())
    finally:
        s.close(linger=0)


def _describe(control: str) -> w.AgentInfo:
    info = _ask(control, w.Describe(1))
    assert isinstance(info, w.AgentInfo)
    return info


def _run_attacker(py: str, attack_dir: str, plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    script = os.path.join(attack_dir, "attacker.py")
    shutil.copy(ATTACKER, script)
    plan_path = os.path.join(attack_dir, "plan.json")
    with open(plan_path, "w") as f:
        json.dump(plan, f)
    for p in (script, plan_path):
        os.chmod(p, 0o644)
    done = subprocess.run(
        ["runuser", "-u", "nobody", "--", py, script, plan_path],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _attack_succeeded(attack_dir: str, results: list[dict[str, Any]]) -> str:
    """What the attack got done: empty if nothing (a failure message otherwise)."""
    got_in = [r for r in results if r["result"] not in ("refused", "closed")]
    markers = [os.path.join(attack_dir, n) for n in ("pwned-agent", "pwned-proc")]
    if got_in:  # give code it may have started the time to show itself
        with contextlib.suppress(AssertionError):
            wait_for(lambda: all(os.path.exists(m) for m in markers), 10, "the attack")
    ran = {os.path.basename(m): Path(m).read_text().strip() for m in markers if os.path.exists(m)}
    if got_in or ran:
        return f"another user got in: {got_in}; code ran as uid {ran}"
    return ""


@pytest.fixture
def attack_dir() -> Iterator[str]:
    """A directory ``nobody`` can read (pytest's tmp_path is private to us)."""
    path = tempfile.mkdtemp(prefix="zmesh-attack-")
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_another_local_user_gets_nothing_from_the_embedded_agent(attack_dir: str) -> None:
    py = _python_for("nobody")
    if py is None:
        pytest.skip("needs root, runuser and a Python the user nobody can run")
    mesh = Echo.options().as_actor().get(timeout=60)
    assert mesh.echo.call_one(1).get(timeout=10) == 1
    control = _local.agents(1)[0]
    info = _describe(control)
    plan = _plan(attack_dir, control, info.stream, mesh._refs[0].addr, mesh._refs[0].mesh)
    results = _run_attacker(py, attack_dir, plan)
    assert [r["name"] for r in results] == ["control", "stream", "proc"]
    assert not (failed := _attack_succeeded(attack_dir, results)), failed
    # The agent knows nothing of the attacker's mesh, and ours still works.
    assert _ask(control, w.GetState(2, "pwn")).meshes == []
    # Refused by the kernel: the sockets sit in a directory only we may enter.
    assert all(r["result"] == "refused" and "PermissionError" in r["error"] for r in results), (
        results
    )
    assert mesh.echo.call_one(2).get(timeout=10) == 2


def test_another_local_user_gets_nothing_from_a_keyed_tcp_agent(
    attack_dir: str, keyed_agent: tuple[str, str]
) -> None:
    py = _python_for("nobody")
    if py is None:
        pytest.skip("needs root, runuser and a Python the user nobody can run")
    control, keys_dir = keyed_agent
    zmesh.connect([control], keys=keys_dir)
    mesh = Echo.options().as_actor().get(timeout=60)
    info = _describe(control)
    plan = _plan(attack_dir, control, info.stream, mesh._refs[0].addr, mesh._refs[0].mesh)
    results = _run_attacker(py, attack_dir, plan)
    assert not (failed := _attack_succeeded(attack_dir, results)), failed
    # A NULL-mechanism peer is dropped at the handshake by a CURVE server.
    assert {r["result"] for r in results} <= {"closed", "refused"}, results
    assert _ask(control, w.GetState(2, "pwn")).meshes == []
    assert mesh.echo.call_one(3).get(timeout=10) == 3
