"""CURVE keys, fail-closed agents, and sockets that admit only authorised keys."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

import zmesh
from zmesh._client.control import local as _local
from zmesh._client.control.local import await_ready
from zmesh._shared import paths as _paths
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.codec import Codec
from zmesh.testing import local_cluster

from _helpers import pid_alive, run_attacker_as_nobody, wait_for, wait_gone


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


def _refused_bind(bind: str) -> str:
    """Start a keyless agent on ``bind``; check it refuses (exit 2, naming the bind); its stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "agent", "--bind", bind],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"refusing to bind {bind}" in done.stderr
    return done.stderr


def test_agent_refuses_a_non_loopback_bind_without_keys() -> None:
    # Refused before anything is bound.
    stderr = _refused_bind("tcp://0.0.0.0:0")
    assert "zmesh keygen" in stderr and "--insecure" in stderr


def test_unreadable_keys_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(zmesh.SecurityError, match="zmesh keygen"):
        _security.Keys.load(str(tmp_path / "nope"))


class Echo(zmesh.Actor):
    @zmesh.endpoint
    def echo(self, x: object) -> object:
        return x


def _answers(addr: str, curve: tuple[bytes, bytes, bytes] | None, msg: list[bytes]) -> bool:
    """Whether a raw DEALER (NULL, or CURVE with ``curve``) gets any reply in 1.5 s."""
    ctx: zmq.Context[Any] = zmq.Context.instance()
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

    describe = Codec(w.AGENT_INBOX).encode(w.Describe(1))
    stranger_pub, stranger_sec = zmq.curve_keypair()
    # The right keys get an answer; a stranger's key and no key at all do not.
    assert _answers(control, (keys.public, keys.public, keys.secret), describe)
    assert not _answers(control, (keys.public, stranger_pub, stranger_sec), describe)
    assert not _answers(control, None, describe)
    # The procs' own sockets are CURVE-protected too.
    payload, _ = Codec.pack((1,), {})
    call = Codec(w.PROC_INBOX).encode(w.Call(1, mesh.actor, "echo", payload))
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
    create = Codec(w.AGENT_INBOX).encode(
        w.CreateOrUpdate(
            1, "pwn", w.ProcSpec(owner="mallory:1:0", ranks=[0], dims={"procs": 1},
                                 main=w.MainSpec(sys_path=[attack_dir])),
        )
    )  # fmt: skip
    spawn = Codec(w.PROC_INBOX).encode(
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
    ctx: zmq.Context[Any] = zmq.Context.instance()
    s = _security.secure_client(ctx.socket(zmq.DEALER), addr=control)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(control)
    try:
        s.send_multipart(Codec(w.AGENT_INBOX).encode(msg))
        assert s.poll(10_000), f"the agent at {control} did not answer its owner"
        return Codec(w.AGENT_REPLIES).decode(s.recv_multipart())
    finally:
        s.close(linger=0)


def _describe(control: str) -> w.AgentInfo:
    info = _ask(control, w.Describe(1))
    assert isinstance(info, w.AgentInfo)
    return info


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
    results = run_attacker_as_nobody(py, attack_dir, plan)
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
    results = run_attacker_as_nobody(py, attack_dir, plan)
    assert not (failed := _attack_succeeded(attack_dir, results)), failed
    # A NULL-mechanism peer is dropped at the handshake by a CURVE server.
    assert {r["result"] for r in results} <= {"closed", "refused"}, results
    assert _ask(control, w.GetState(2, "pwn")).meshes == []
    assert mesh.echo.call_one(3).get(timeout=10) == 3


# ------------------------------------------------------------ binds and sockets


def test_agent_refuses_keyless_tcp_even_on_loopback() -> None:
    # Every local user can connect to 127.0.0.1: keyless TCP is --insecure only.
    assert "--insecure" in _refused_bind("tcp://127.0.0.1:0")


def test_insecure_loopback_agent_warns_out_loud(tmp_path: Path) -> None:
    popen, log_path = _local.launch_agent(
        "loud", str(tmp_path / "logs"), bind="tcp://127.0.0.1:0", insecure=True
    )
    try:
        info = await_ready(popen, log_path)
        assert info.control.startswith("tcp://127.0.0.1:")
        log = Path(log_path).read_text()
        assert "WITHOUT authentication (--insecure)" in log and "unpickled" in log
    finally:
        popen.terminate()
        popen.wait(timeout=10)


def test_sockets_are_private_files_removed_when_their_process_exits() -> None:
    mesh = Echo.options(procs=2).as_actor().get(timeout=60)
    control = _local.agents(1)[0]
    info = _describe(control)
    paths = [a[len("ipc://") :] for a in (control, info.stream, *(r.addr for r in mesh._refs))]
    assert all(a.startswith("ipc://") for a in (control, info.stream))
    base = os.path.dirname(paths[0])
    assert all(os.path.dirname(p) == base for p in paths)  # one directory per agent
    assert all(len(p.encode()) < 100 for p in paths)  # sun_path holds 108 bytes
    for d in (base, os.path.dirname(base)):
        st = os.stat(d)
        assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700, d
    assert all(stat.S_ISSOCK(os.stat(p).st_mode) for p in paths)
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in paths)
    # A proc killed with SIGKILL leaves its socket file: its agent removes it.
    victim = mesh._refs[0]
    os.kill(mesh.state().ranks[0].pid, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(victim.addr[len("ipc://") :]), 10, "the dead proc's socket")
    zmesh.shutdown()  # the embedded agent exits: its directory goes
    wait_for(lambda: not os.path.exists(base), 10, "the agent's socket directory to go")


def test_a_runtime_directory_open_to_others_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("ZMESH_RUNTIME_DIR", str(shared))
    with pytest.raises(zmesh.SecurityError, match=f"refusing {shared}: group or others"):
        _paths.runtime_dir()
    # An agent told to use it does not start, and says why.
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "agent", "--log-dir", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and f"refusing {shared}" in done.stderr
    # Someone else's directory, or a symlink to ours, is refused too.
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(theirs, 65534, 65534)
        with pytest.raises(zmesh.SecurityError, match="belongs to uid 65534"):
            _paths.private_dir(str(theirs))
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "mine")
    (tmp_path / "mine").mkdir(mode=0o700)
    with pytest.raises(zmesh.SecurityError, match="symbolic link"):
        _paths.private_dir(str(link))


# ------------------------------------------------------------ clients' own keys

CLIENT = """
import json, sys, time
import zmesh

class Echo(zmesh.Actor):
    @zmesh.endpoint
    def echo(self, x):
        return x

if __name__ == "__main__":
    t = time.monotonic()
    try:
        mesh = Echo.options().as_actor().get(timeout=60)
        out = {"ok": mesh.echo.call_one(41).get(timeout=10) + 1}
    except zmesh.ZmeshError as exc:
        out = {"error": type(exc).__name__, "message": str(exc)}
    out["seconds"] = time.monotonic() - t
    print(json.dumps(out), flush=True)
"""


def _client(script: Path, control: str, keys: str) -> dict[str, Any]:
    """Run a client script in its own process with its own keys; what it printed."""
    env = {**os.environ, "ZMESH_AGENTS": control, "ZMESH_KEYS": keys}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _keygen(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "keygen", *args], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_a_client_with_its_own_authorised_key_gets_in_and_a_stranger_does_not(
    keyed_agent: tuple[str, str], tmp_path: Path
) -> None:
    control, agents_dir = keyed_agent
    alice, bob = str(tmp_path / "alice"), str(tmp_path / "bob")
    _keygen("--client", alice, "--authorize-in", agents_dir, "--name", "alice")
    _keygen("--client", bob, "--agents-key", os.path.join(agents_dir, "agents.key"))
    for d in (alice, bob):  # each its own keypair; neither holds the agents' secret
        keys = _security.Keys.load(d)
        assert keys.server == _security.Keys.load(agents_dir).public != keys.public
        assert not keys.can_serve
        assert stat.S_IMODE(os.stat(os.path.join(d, "zmesh.key_secret")).st_mode) == 0o600
    assert (Path(agents_dir) / "authorized" / "alice.key").exists()
    script = tmp_path / "client.py"
    script.write_text(CLIENT)

    # Keys authorised while the agent runs are admitted within about a second.
    alice_keys = _security.Keys.load(alice)
    wait_for(lambda: not _security.probe(control, 2.0, alice_keys), 5, "alice's key admitted")
    assert _client(script, control, alice)["ok"] == 42
    # Bob's key is not in authorized/: a clear error, at once, not a 10 s silence.
    refused = _client(script, control, bob)
    assert refused["error"] == "SecurityError", refused
    assert "refused our CURVE key" in refused["message"] and bob in refused["message"]
    assert refused["seconds"] < 5.0
    # Authorising bob takes effect without restarting the agent.
    shutil.copy(os.path.join(bob, "zmesh.key"), os.path.join(agents_dir, "authorized", "bob.key"))
    bob_keys = _security.Keys.load(bob)
    wait_for(lambda: not _security.probe(control, 2.0, bob_keys), 5, "bob's key admitted")
    assert _client(script, control, bob)["ok"] == 42


def test_a_stranger_key_gets_nothing_from_the_procs(
    keyed_agent: tuple[str, str], tmp_path: Path
) -> None:
    control, agents_dir = keyed_agent
    alice, bob = str(tmp_path / "alice"), str(tmp_path / "bob")
    _keygen("--client", alice, "--authorize-in", agents_dir)
    _keygen("--client", bob, "--agents-key", agents_dir)
    zmesh.connect([control], keys=alice)
    mesh = Echo.options().as_actor().get(timeout=60)
    payload, _ = Codec.pack((1,), {})
    call = Codec(w.PROC_INBOX).encode(w.Call(1, mesh.actor, "echo", payload))
    server = _security.Keys.load(agents_dir).public
    a, b = _security.Keys.load(alice), _security.Keys.load(bob)
    proc = mesh._refs[0].addr
    assert _answers(proc, (server, a.public, a.secret), call)
    assert not _answers(proc, (server, b.public, b.secret), call)
    assert not _answers(
        control, (server, b.public, b.secret), Codec(w.AGENT_INBOX).encode(w.Describe(1))
    )


# ------------------------------------------------------------ only the owner stops

INTRUDER = """
import json, pickle, sys
import zmq
import zmesh
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

procs = pickle.loads(bytes.fromhex(sys.argv[1]))  # another client's ProcMesh handle
owner = sys.argv[2]
out = {}
# Through the API: the handle's stop() goes to the agent, which refuses it.
try:
    procs.stop().get(timeout=20)
    out["stop"] = "stopped"
except zmesh.ZmeshError as exc:
    out["stop"] = f"{type(exc).__name__}: {exc}"
# On the wire: a Stop without the owner's proof, and an OwnerGone for the owner.
s = zmq.Context.instance().socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.connect(procs._refs[0].agent)
codec, replies = Codec(w.AGENT_INBOX), Codec(w.AGENT_REPLIES)
for key, msg in (("raw_stop", w.Stop(7, procs.name, secret="guess")),
                 ("owner_gone", w.OwnerGone(owner, secret=""))):
    s.send_multipart(codec.encode(msg))
    out[key] = replies.decode(s.recv_multipart()).error if s.poll(10_000) else "no reply"
print(json.dumps(out), flush=True)
zmesh.shutdown()
"""


def test_only_the_owner_can_stop_its_mesh(tmp_path: Path) -> None:
    with local_cluster(1) as agents:
        procs = zmesh.this_host().spawn_procs(per_host={"procs": 2}).get(timeout=60)
        mesh = procs.spawn("echo", Echo).get(timeout=60)
        state = _ask(agents[0].control, w.GetState(1, procs.name)).meshes[0]
        owner, pids = state.owner, [r.pid for r in state.ranks]
        assert owner == _local.owner_id()  # public: events and states carry it
        script = tmp_path / "intruder.py"
        script.write_text(INTRUDER)
        env = {**os.environ, "ZMESH_AGENTS": agents[0].control}
        done = subprocess.run(
            [sys.executable, str(script), pickle.dumps(procs).hex(), owner],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["stop"].startswith("SecurityError: ") and "not the owner" in out["stop"], out
        assert "not the owner" in out["raw_stop"] and "not the owner" in out["owner_gone"], out
        # Nothing was stopped: the procs live and answer, their owner was told nothing.
        assert all(pid_alive(p) for p in pids)
        assert mesh.echo.call(5).get(timeout=10).values() == [5, 5]
        state = _ask(agents[0].control, w.GetState(2, procs.name)).meshes[0]
        assert [r.status for r in state.ranks] == ["Running", "Running"]
        # The owner's own stop still works.
        procs.stop().get(timeout=20)
        with pytest.raises(zmesh.ActorStoppedError):
            mesh.echo.call(1).get(timeout=10)
        wait_gone(pids, 10, "the owner's stopped procs")
