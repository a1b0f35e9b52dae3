"""Actors' stdout reaches the owner's stdout, their stderr its stderr, both prefixed.

A proc's stderr is a file of its own, copied into its log marked
``[stderr]`` (so ``zmesh logs`` still shows one combined view) and forwarded
to the owning client's stderr; ``ZMESH_FORWARD_LOGS=0`` turns both off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from _helpers import end_child, own_runtime_dir, wait_for

SCRIPT = textwrap.dedent(
    """
    import sys
    import time
    from pathlib import Path
    import zmesh

    class Talker(zmesh.Actor):
        @zmesh.endpoint
        def talk(self) -> str:
            print("said-on-stdout", flush=True)
            print("said-on-stderr", file=sys.stderr, flush=True)
            return zmesh.current_rank().rank

    if __name__ == "__main__":
        mesh = Talker.options(name="talk").as_actor().get(timeout=60)
        mesh.talk.call_one().get(timeout=30)
        log = mesh._refs[0].log_path
        # Both lines are in the combined log once the agent copied stderr (the
        # tick that copies them also forwards them).
        while "[stderr] said-on-stderr" not in Path(log).read_text():
            time.sleep(0.01)
        print("LOG " + log, file=sys.stderr, flush=True)
        sys.stdin.read()  # until the test has seen what it waits for
    """
)


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    with own_runtime_dir(monkeypatch, unset=("ZMESH_FORWARD_LOGS",)):
        path = tmp_path / "talker.py"
        path.write_text(SCRIPT)
        yield path


def run(script: Path, tmp_path: Path, env: dict[str, str], until: str) -> tuple[str, str]:
    """Run ``script`` until its stderr shows ``until``; what it wrote to (stdout, stderr)."""
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "w") as o, open(err, "w") as e:
        p = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=o, stderr=e,
            env={**os.environ, **env},
        )  # fmt: skip
    try:
        wait_for(lambda: until in err.read_text() or p.poll() is not None, 60, repr(until))
    finally:
        end_child(p, 30)
    return out.read_text(), err.read_text()


def test_stderr_goes_to_the_clients_stderr_and_stdout_to_its_stdout(
    script: Path, tmp_path: Path
) -> None:
    out, err = run(script, tmp_path, {}, "local) said-on-stderr")
    assert [ln for ln in out.splitlines() if "said-on" in ln] == [
        next(ln for ln in out.splitlines() if ln.endswith(" local) said-on-stdout"))
    ]
    assert "said-on-stderr" not in out
    line = next(ln for ln in err.splitlines() if "said-on-stderr" in ln)
    assert line.startswith("(talk") and line.endswith(" 0 local) said-on-stderr"), line
    assert "said-on-stdout" not in err
    log = next(ln for ln in err.splitlines() if ln.startswith("LOG "))[4:]
    combined = Path(log).read_text().splitlines()  # what zmesh logs shows: both, marked
    assert "said-on-stdout" in combined and "[stderr] said-on-stderr" in combined


def test_forward_logs_0_turns_both_streams_off(script: Path, tmp_path: Path) -> None:
    out, err = run(script, tmp_path, {"ZMESH_FORWARD_LOGS": "0"}, "LOG ")
    assert "said-on" not in out and "said-on" not in err, (out, err)
