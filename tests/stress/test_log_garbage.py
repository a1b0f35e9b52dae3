"""Nasty output from actors: half lines, binary garbage and very long lines.

What a proc writes to stderr is copied into its log (marked ``[stderr]``)
between what it writes to stdout (``zmesh._host.agent.logtail``), then forwarded
to the owner's stdout or stderr by that mark. A proc that left a stdout line
unfinished (a progress message, ``print(..., end="")``) must not get its next
stderr line glued onto it: that line would reach the owner's *stdout*, with
the mark in it, and ``zmesh logs`` would show one mangled line. Binary bytes
and a 200 kB line reach the owner's stderr (replaced, in pieces), and the log
keeps all of it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from _helpers import end_child, own_runtime_dir, wait_for

pytestmark = pytest.mark.stress

LONG = 200_000

SCRIPT = textwrap.dedent(
    f"""
    import os, sys, time
    from pathlib import Path
    import zmesh

    class Messy(zmesh.Actor):
        @zmesh.endpoint
        def mess(self) -> None:
            print("loading model...", end="", flush=True)  # a line left open on stdout
            print("warning: slow disk", file=sys.stderr, flush=True)
            time.sleep(0.4)  # a few of the agent's ticks
            print(" done", flush=True)
            os.write(2, b"\\xff\\xfe\\x00bin\\x1b[31mred\\r\\n")
            os.write(2, b"L" * {LONG} + b"\\n")
            print("END", file=sys.stderr, flush=True)

    mesh = Messy.options(name="messy").as_actor().get(timeout=60)
    mesh.mess.call_one().get(timeout=30)
    log = mesh._refs[0].log_path
    while "[stderr] END" not in Path(log).read_text(errors="replace"):
        time.sleep(0.01)
    print("LOG " + log, file=sys.stderr, flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    with own_runtime_dir(monkeypatch, unset=("ZMESH_FORWARD_LOGS",)):
        path = tmp_path / "messy.py"
        path.write_text(SCRIPT)
        yield path


def test_half_lines_binary_and_long_lines_keep_their_stream(script: Path, tmp_path: Path) -> None:
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with open(out_path, "w") as o, open(err_path, "w") as e:
        p = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=o, stderr=e
        )
    try:
        wait_for(lambda: "local) END" in err_path.read_text(errors="replace")
                 or p.poll() is not None, 60, "the owner's stderr to show END")  # fmt: skip
    finally:
        end_child(p, 30)
    out = out_path.read_text(errors="replace")
    err = err_path.read_text(errors="replace")
    assert "local) END" in err, err[-3000:]
    # The stderr line is on stderr, alone; stdout has its own two pieces and no mark.
    assert "[stderr]" not in out and "warning" not in out, out
    assert any(ln.endswith(" local) warning: slow disk") for ln in err.splitlines()), err[:3000]
    assert any(ln.endswith(" local) loading model...") for ln in out.splitlines()), out
    # Garbage and a long line: forwarded (replaced, in pieces), nothing lost.
    assert "bin\x1b[31mred" in err
    assert err.count("L") >= LONG
    log = next(ln for ln in err.splitlines() if ln.startswith("LOG "))[4:]
    lines = Path(log).read_bytes().split(b"\n")
    assert b"loading model..." in lines and b"[stderr] warning: slow disk" in lines, lines[:6]
    assert sum(ln.count(b"L") for ln in lines if ln.startswith(b"[stderr] L")) == LONG
