"""Monarch-style programs run on zmesh with only their import lines changed.

``tests/monarch_examples/`` holds programs written the way Monarch's own
examples are (``ping_pong.py``: async, meshes handed between actors;
``getting_started.py``: a module-level script with ``.get()``, ``this_proc()``,
slices, ``context()``, meshes passed while spawning, supervision hooks).
Each runs here as a real subprocess with the embedded default agent.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from _helpers import session_pids, wait_for

EXAMPLES = Path(__file__).resolve().parent.parent / "monarch_examples"


FORWARDED = re.compile(r"\(\S+ \d+ \S+\) ")


def _run(name: str, tmp_path: Path) -> list[str]:
    before = session_pids()
    res = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], cwd=tmp_path, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    wait_for(lambda: session_pids() <= before, 10, f"{name}'s agent and procs to exit")
    # Not what actors print, forwarded to our stdout as "(mesh rank host) ...". The
    # forwarder's thread may write between a print's text and its newline, so a
    # forwarded line can start in the middle of one of the script's: cut it off there.
    lines = (FORWARDED.split(line, maxsplit=1)[0] for line in res.stdout.splitlines())
    return [line for line in lines if line]


def test_ping_pong(tmp_path: Path) -> None:
    out = _run("ping_pong.py", tmp_path)
    assert "ranks [0, 1, 2, 3]" in out
    assert "left inbox [['right:0 says pong'], ['right:1 says pong']]" in out
    assert "right inbox [['left:0 says ping'], ['left:1 says ping']]" in out
    assert out[-1] == "ping pong done"


def test_getting_started(tmp_path: Path) -> None:
    out = _run("getting_started.py", tmp_path)
    assert out[0] == "local tally 0"
    assert "tallies ValueMesh({'hosts': 1, 'gpus': 4}, [2, 2, 1, 1])" in out
    assert "extent Extent({'hosts': 1, 'gpus': 4})" in out
    steps = next(line for line in out if line.startswith("steps "))
    # A point prints as Monarch prints it.
    assert all(f"learner {{'hosts': 0/1, 'gpus': {r}/4}} stepped" in steps for r in range(4))
    fed = next(line for line in out if line.startswith("fed steps "))
    assert fed.count("step on <batch 1> (None)") == 4  # each learner its own feeder
    assert "grumpy said no" in out
    assert out[-1] == "tour done"
