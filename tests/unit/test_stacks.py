"""Stack dumps on SIGUSR1 (``zmesh._host.proc.stacks``), against a real Python process."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from zmesh._host.proc import stacks as _stacks

# Two threads: one blocked in a sleep, the main one holding the GIL in pure Python.
SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    from zmesh._host.proc import stacks as _stacks

    parked = threading.Event()

    def parked_in_a_long_sleep():
        parked.set()
        time.sleep(600)

    def spinning_in_pure_python():
        print("ready", flush=True)  # from in here: any dump from now on shows this frame
        x = 0
        while True:
            x += 1

    if sys.argv[2] == "install":
        _stacks.install(sys.argv[1])
    threading.Thread(target=parked_in_a_long_sleep, daemon=True).start()
    parked.wait()
    spinning_in_pure_python()
    """
)


@pytest.fixture
def spinner(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    log = str(tmp_path / "m.0.g1.log")
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, log, request.param],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc, _stacks.stack_path(log)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize("spinner", ["install"], indirect=True)
def test_a_dump_names_a_spinning_and_a_sleeping_thread(
    spinner: tuple[subprocess.Popen[str], str],
) -> None:
    proc, path = spinner
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    for _ in range(2):  # the second dump replaces the first, from offset 0
        started = time.monotonic()
        text, cut = asyncio.run(
            _stacks.dump(path, lambda: os.kill(proc.pid, _stacks.SIGNAL), not_before=0)
        )
        assert time.monotonic() - started < _stacks.WAIT + 0.5
        assert not cut and text.startswith("Thread 0x")
        assert "in parked_in_a_long_sleep" in text and "in spinning_in_pure_python" in text
        assert "\0" not in text
    assert proc.poll() is None  # SIGUSR1 no longer kills it


@pytest.mark.parametrize("spinner", ["no-install"], indirect=True)
def test_a_proc_without_a_stack_file_is_never_signalled(
    spinner: tuple[subprocess.Popen[str], str],
) -> None:
    proc, path = spinner
    sent = []
    with pytest.raises(_stacks.StackUnavailable, match="has not set up stack dumps"):
        asyncio.run(_stacks.dump(path, lambda: sent.append(signal.SIGUSR1)))
    assert sent == [] and proc.poll() is None


@pytest.mark.parametrize("spinner", ["install"], indirect=True)
def test_a_stack_file_older_than_the_proc_is_not_trusted(
    spinner: tuple[subprocess.Popen[str], str],
) -> None:
    _proc, path = spinner
    sent = []
    with pytest.raises(_stacks.StackUnavailable):
        asyncio.run(_stacks.dump(path, lambda: sent.append(1), not_before=time.time() + 60))
    assert sent == []
