"""Code of ``__main__`` travels by value: scripts without a main guard, ``python -c``.

Each program runs as a real subprocess with the embedded default agent, as a
user would run it. A proc never re-runs the user's script, so a script that
spawns at module level spawns once, not once per proc.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _helpers import session_pids, wait_for

# No `if __name__ == "__main__":`: a proc that re-ran this would spawn again
# (and print again) from every proc.
UNGUARDED = """
import os

import zmesh

from helper import Doubler

SCALE = 3


def scale(x):
    return SCALE * x


class Point2:
    def __init__(self, x, y):
        self.x, self.y = x, y


class Worker(zmesh.Actor):
    def __init__(self, factor):
        self.factor = factor

    @zmesh.endpoint
    def apply(self, fn, x):
        return fn(x) * self.factor

    @zmesh.endpoint
    def move(self, p):
        return Point2(p.x + 1, p.y + 1)

    @zmesh.endpoint
    def pid(self):
        return os.getpid()


print("START", os.getpid(), flush=True)
mesh = Worker.options(procs=2).as_actor(10).get(timeout=60)
print("APPLY", mesh.apply.call(scale, 2).get(timeout=30).values(), flush=True)
print("LAMBDA", mesh.slice(procs=0).apply.call_one(lambda v: v - 1, 5).get(timeout=30), flush=True)
p = mesh.slice(procs=1).move.call_one(Point2(1, 2)).get(timeout=30)
print("POINT", type(p) is Point2, p.x, p.y, flush=True)
d = Doubler.options().as_actor().get(timeout=60)
print("DOUBLE", d.double.call_one(21).get(timeout=30), flush=True)
mesh.stop().get(timeout=10)
d.stop().get(timeout=10)
print("DONE", flush=True)
"""

HELPER = """
import zmesh

class Doubler(zmesh.Actor):
    @zmesh.endpoint
    def double(self, x):
        return 2 * x
"""


def _run(args: list[str], cwd: Path) -> dict[str, str]:
    before = session_pids()
    res = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    wait_for(lambda: session_pids() <= before, 10, "the program's agent and procs to exit")
    lines = [line.partition(" ")[::2] for line in res.stdout.splitlines()]
    starts = [rest for head, rest in lines if head == "START"]
    assert len(starts) <= 1, f"the script ran more than once: {res.stdout}"
    return dict(lines)


def test_a_script_without_a_main_guard_spawns_and_calls(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text(HELPER)  # an importable module: by reference
    (tmp_path / "unguarded.py").write_text(UNGUARDED)
    out = _run([sys.executable, "unguarded.py"], tmp_path)
    assert out["APPLY"] == "[60, 60]"  # a function of the script, by value
    assert out["LAMBDA"] == "40"
    assert out["POINT"] == "True 2 3"  # the script's own class came back as itself
    assert out["DOUBLE"] == "42"
    assert "DONE" in out


def test_a_class_defined_in_python_c(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text(HELPER)
    out = _run([sys.executable, "-c", UNGUARDED], tmp_path)
    assert out["APPLY"] == "[60, 60]"
    assert out["POINT"] == "True 2 3"
    assert "DONE" in out


def test_a_class_typed_into_the_repl(tmp_path: Path) -> None:
    # `python -i` reads stdin as an interactive session: no file, no module.
    (tmp_path / "helper.py").write_text(HELPER)
    session = (
        "import zmesh\n"
        "class Hi(zmesh.Actor):\n"
        "    @zmesh.endpoint\n"
        "    def hi(self, name):\n"
        "        return 'hi ' + name\n"
        "\n"
        "m = Hi.options().as_actor().get(timeout=60)\n"
        "print('HI', m.hi.call_one('repl').get(timeout=30))\n"
        "m.stop().get(timeout=10)\n"
    )
    before = session_pids()
    res = subprocess.run(
        [sys.executable, "-i", "-q"], input=session, cwd=tmp_path, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "HI hi repl" in res.stdout, res.stdout + res.stderr
    wait_for(lambda: session_pids() <= before, 10, "the session's agent and procs to exit")


RAISES = """
import zmesh


class Boom(zmesh.Actor):
    @zmesh.endpoint
    def boom(self):
        raise ValueError("kaboom")


mesh = Boom.options().as_actor().get(timeout=60)
try:
    mesh.boom.call_one().get(timeout=30)
except zmesh.ActorError as exc:
    print(exc)
"""


def test_a_remote_traceback_names_the_scripts_file_and_line(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text(RAISES)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120,
        cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f'File "{script}", line 8, in boom' in out, out  # was: File "<dynamic-code>"
    assert 'raise ValueError("kaboom")' in out and "<dynamic-code>" not in out, out
