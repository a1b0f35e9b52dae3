"""The commands that watch agents, when agents are many, keyed differently, silent or missing."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from zmesh._wire import security as _security

from _helpers import keyed_loopback_agent, own_runtime_dir

pytestmark = pytest.mark.slow


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with own_runtime_dir(monkeypatch) as path:
        yield path


def zmesh_cmd(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zmesh", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **env}, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_top_once_exits_2_when_no_agent_answers(runtime_dir: str) -> None:
    silent = f"tcp://127.0.0.1:{free_port()}"
    for how in ("--once", "--json"):
        done = zmesh_cmd("top", how, "--agents", silent, "--timeout", "1")
        assert done.returncode == 2, (how, done.returncode, done.stderr)  # as ps does
        assert f"agent {silent} did not answer" in done.stderr, done.stderr


def test_missing_zmesh_keys_does_not_advise_a_client_to_make_new_keys(
    runtime_dir: str, tmp_path: Path
) -> None:
    missing = str(tmp_path / "nokeys")
    for cmd in (["ps"], ["status"], ["top", "--once"]):
        done = zmesh_cmd(*cmd, "--timeout", "1", ZMESH_KEYS=missing)
        assert done.returncode == 2, (cmd, done.stderr)
        err = done.stderr
        assert f"ZMESH_KEYS={missing}" in err, err  # where the path came from
        assert f"zmesh keygen {missing}" not in err, err  # new agents' keys: not authorised
        assert "--authorize-in" in err and "Traceback" not in err, err
    # An agent given a missing directory is told to make its keys.
    done = zmesh_cmd("agent", "--bind", "tcp://127.0.0.1:0", "--keys", missing, timeout=30)
    assert done.returncode == 2 and f"zmesh keygen {missing}" in done.stderr, done.stderr


def test_two_local_agents_with_different_keys_are_both_watched(
    runtime_dir: str, tmp_path: Path
) -> None:
    a_keys, b_keys = str(tmp_path / "a-keys"), str(tmp_path / "b-keys")
    _security.keygen(a_keys)
    _security.keygen(b_keys)
    with contextlib.ExitStack() as stack:
        stack.enter_context(keyed_loopback_agent(a_keys, tmp_path / "a", "alpha"))
        b = stack.enter_context(keyed_loopback_agent(b_keys, tmp_path / "b", "beta"))
        for cmd in (["ps", "--json"], ["status"], ["top", "--json"]):
            done = zmesh_cmd(*cmd, "--timeout", "10")  # the registry: each with its own keys
            assert done.returncode == 0, (cmd, done.stdout, done.stderr)
        done = zmesh_cmd("status", "--timeout", "10")
        assert "agents 2/2 ok" in done.stdout, done.stdout
        # With a key directory given, the registered agents still use their own.
        done = zmesh_cmd("status", "--timeout", "10", ZMESH_KEYS=a_keys)
        assert done.returncode == 0 and "agents 2/2 ok" in done.stdout, done.stdout + done.stderr
        assert json.loads(zmesh_cmd("ps", "--json").stdout) == []

        # An agent we do not know, reached with keys it refuses: status says why.
        elsewhere = tempfile.mkdtemp(prefix="zr-", dir="/tmp")
        try:
            done = zmesh_cmd(
                "status", "--agents", b, "--keys", a_keys, "--timeout", "2",
                ZMESH_RUNTIME_DIR=elsewhere,
            )  # fmt: skip
        finally:
            shutil.rmtree(elsewhere, ignore_errors=True)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"({b}) is unreachable: the CURVE handshake with {b} failed" in done.stdout, (
            done.stdout
        )


RUN_HERE = """#!/bin/sh
# Runs its command on this machine, whatever the host.
shift
exec "$@"
"""


def test_an_agent_on_a_taken_port_says_so_in_one_line(tmp_path: Path) -> None:
    keys = str(tmp_path / "keys")
    _security.keygen(keys)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        bind = f"tcp://127.0.0.1:{port}"
        done = zmesh_cmd("agent", "--bind", bind, "--keys", keys, timeout=30)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
        assert f"cannot bind {bind} (Address already in use)" in done.stderr, done.stderr

        # zmesh up, detached and attached: the agent's exit ends the wait, not --timeout.
        launcher = tmp_path / "launch.sh"
        launcher.write_text(RUN_HERE)
        launcher.chmod(0o700)
        hosts = tmp_path / "hosts"
        hosts.write_text("h1 127.0.0.1\n")
        home = tmp_path / "home"
        home.mkdir()
        for attach in ([], ["--attach"]):
            t0 = time.monotonic()
            done = zmesh_cmd(
                "up", str(hosts), "--launcher", f"{launcher} {{host}}", "--port", str(port),
                "--timeout", "60", "--keys", keys, "--zmesh", f"{sys.executable} -m zmesh",
                *attach, HOME=str(home), timeout=120,
            )  # fmt: skip
            took = time.monotonic() - t0
            assert done.returncode == 2, (attach, done.stdout, done.stderr)
            assert "the agent exited before it answered on h1" in done.stderr, done.stderr
            assert "Traceback" not in done.stderr, done.stderr
            if not attach:  # its log's last line says why
                assert "Address already in use" in done.stderr, done.stderr
            assert took < 30, f"zmesh up {attach} took {took:.1f}s"
