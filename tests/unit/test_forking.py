"""``SiblingFork``: a fork whose child is the caller's parent's (``clone(CLONE_PARENT)``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from zmesh._host.agent.forking import SiblingFork

# Stands in for a forkserver: a single-threaded child of this test that
# forks two siblings, and reports what it saw. Each sibling reports what it
# sees of itself, then exits with code 7.
_FORKER = r"""
import json, os, random, sys, threading
from zmesh._host.agent.forking import SiblingFork

def say(obj):  # one write(2) each: the three writers share one pipe
    os.write(1, (json.dumps(obj) + "\n").encode())


hooked = []
os.register_at_fork(after_in_child=lambda: hooked.append(True))
sib = SiblingFork.load()
if sib is None:
    say({"loaded": False})
    sys.exit(0)
pids = []
for _ in range(2):
    pid = sib.fork()
    if pid == 0:
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
        say({
            "pid": os.getpid(), "ppid": os.getppid(), "hooked": hooked == [True],
            "native_id": threading.get_native_id(), "random": random.random(),
        })
        os._exit(7)
    pids.append(pid)
try:
    os.waitpid(pids[0], os.WNOHANG)
    mine = True
except ChildProcessError:
    mine = False
say({"loaded": True, "pids": pids, "mine": mine})
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="clone(2) is Linux's")
def test_a_sibling_fork_is_the_callers_parents_child() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    forker = subprocess.run(
        [sys.executable, "-c", _FORKER], capture_output=True, text=True, env=env, timeout=60
    )
    assert forker.returncode == 0, forker.stderr
    lines = [json.loads(x) for x in forker.stdout.splitlines()]
    summary = next(x for x in lines if "loaded" in x)
    if not summary["loaded"]:
        pytest.skip("no clone(CLONE_PARENT) here (architecture or C library)")
    assert summary["mine"] is False  # not the forker's children...
    # ...but ours: we reap them, and see their exit codes.
    codes: dict[int, int] = {}
    deadline = time.monotonic() + 30
    while len(codes) < 2 and time.monotonic() < deadline:
        for pid in summary["pids"]:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    assert codes == {pid: 7 for pid in summary["pids"]}
    children = [x for x in lines if "ppid" in x]
    assert len(children) == 2
    for c in children:
        assert c["ppid"] == os.getpid()
        assert c["hooked"]  # os.register_at_fork hooks ran, as after os.fork()
        assert c["native_id"] == c["pid"]  # the C library knows the child's own thread id
    assert children[0]["random"] != children[1]["random"]  # reseeded in each child


def test_it_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZMESH_SIBLING_FORK", "0")
    assert SiblingFork.load() is None
