"""The ``zmesh`` command's conventions: help, version, errors a user makes end in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import zmesh

from _helpers import wait_for

COMMANDS = [
    "agent",
    "cluster",
    "keygen",
    "top",
    "status",
    "ps",
    "stack",
    "logs",
    "stop",
    "get",
    "http",
    "up",
    "down",
]


def zmesh_cmd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zmesh", *args], capture_output=True, text=True, timeout=timeout
    )


def test_help_goes_to_stdout_and_lists_every_command() -> None:
    done = zmesh_cmd("--help")
    assert done.returncode == 0, done.stderr
    for name in COMMANDS:
        assert f"    {name} " in done.stdout, done.stdout
    assert zmesh_cmd("ps", "--help").stdout.startswith("usage: zmesh ps")


def test_version() -> None:
    done = zmesh_cmd("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"zmesh {zmesh.__version__}"


def test_an_unknown_command_says_so() -> None:
    done = zmesh_cmd("bogus")
    assert done.returncode == 2
    assert "unknown command 'bogus'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("name", COMMANDS)
def test_help_shows_no_markup(name: str) -> None:
    done = zmesh_cmd(name, "--help")
    assert done.returncode == 0 and "``" not in done.stdout, done.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_takes_json(name: str) -> None:
    done = zmesh_cmd(name, "--help")
    assert done.returncode == 0, done.stderr
    assert "--json" in done.stdout


@pytest.mark.parametrize("cmd", [["ps"], ["status"], ["top", "--once"], ["stack", "m"], ["http"]])
def test_a_bad_address_is_one_line_not_a_traceback(cmd: list[str]) -> None:
    done = zmesh_cmd(*cmd, "--agents", "node1")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "'node1' is not an agent address: give tcp://HOST:PORT, HOST:PORT" in done.stderr


def test_host_port_is_an_address_and_an_unreachable_agent_is_said() -> None:
    done = zmesh_cmd("ps", "--agents", "127.0.0.1:9", "--timeout", "0.5", "--json")
    assert done.returncode == 2, done.stderr
    assert "agent tcp://127.0.0.1:9 did not answer" in done.stderr
    assert "Traceback" not in done.stderr
    assert json.loads(done.stdout) == []
    status = zmesh_cmd("status", "--agents", "127.0.0.1:9", "--timeout", "0.5")
    assert status.returncode == 2 and "Traceback" not in status.stderr


def test_ctrl_c_quits_quietly() -> None:
    # As from a terminal: a run in the background (CI) starts children with
    # SIGINT ignored, and Python keeps it so; restore the handler first.
    ps = ["ps", "--agents", "127.0.0.1:9", "--timeout", "60"]
    start = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.argv = ['zmesh', *{ps!r}]; runpy.run_module('zmesh', run_name='__main__')"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", start], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        # Into the wait for the agent: zmq's I/O threads are up by then.
        wait_for(lambda: len(os.listdir(f"/proc/{p.pid}/task")) >= 3, 30, "zmq's threads")
        p.send_signal(signal.SIGINT)
        _out, err = p.communicate(timeout=20)  # well before --timeout 60 ends the wait
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()  # and its pipes closed: left open they warn in a later test
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


@pytest.mark.parametrize("cmd", [["--help"], ["ps", "--agents", "127.0.0.1:9", "--timeout", "0.3"]])
def test_a_closed_pipe_ends_it_silently(cmd: list[str]) -> None:
    # `zmesh ps | head`: the reader is gone before we write.
    r, wfd = os.pipe()
    os.close(r)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "zmesh", *cmd], stdout=wfd, stderr=subprocess.PIPE,
            text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(wfd)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
