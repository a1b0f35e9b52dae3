"""A client that forks (``os.fork``, multiprocessing's default on Linux) leaves a clean child.

Python's ``threading`` calls ``Thread._stop()`` on every thread of the parent
in a forked child. A zmesh thread that used ``_stop`` as its own flag made
that call raise: the child printed "Exception ignored in _after_fork" and
kept the parent's threads in its ``threading`` table (a ``join`` on them
would never return).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _helpers import own_runtime_dir

SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    import threading
    import zmesh

    class Talker(zmesh.Actor):
        @zmesh.endpoint
        def talk(self) -> int:
            print("said", flush=True)
            return 1

    if __name__ == "__main__":
        mesh = Talker.options().as_actor().get(timeout=60)
        assert mesh.talk.call_one().get(timeout=30) == 1
        names = sorted(t.name for t in threading.enumerate())
        assert "zmesh-logs" in names, names  # forwarding runs: its thread is there
        pid = os.fork()
        if pid == 0:
            left = [t.name for t in threading.enumerate()]
            os.write(1, ("CHILD " + ",".join(left) + "\\n").encode())
            os._exit(0 if left == [threading.current_thread().name] else 3)
        _, status = os.waitpid(pid, 0)
        print("CHILD-EXIT", os.waitstatus_to_exitcode(status), flush=True)
        mesh.stop().get(timeout=30)
    """
)


def test_a_forked_child_of_a_client_has_only_its_own_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with own_runtime_dir(monkeypatch, unset=("ZMESH_FORWARD_LOGS",)):
        path = tmp_path / "forker.py"
        path.write_text(SCRIPT)
        done = subprocess.run(
            [sys.executable, str(path)], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Exception ignored" not in done.stderr, done.stderr[-3000:]
    assert "CHILD-EXIT 0" in done.stdout, done.stdout + done.stderr[-2000:]
