"""A thread's lane (``zmesh._client.calls.lanes``) does not follow it into a forked child."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Run in a fresh interpreter: forking the test process (with its threads)
# is not what is tested. The lane's runtime is only a key here (with a loop).
_CHILD = r"""
import json, os, types
from zmesh._client.calls import lanes

rt = types.SimpleNamespace(loop=None)
ln = lanes.lane(rt)
parent_sock = object()
ln.socks["ipc://parent"] = parent_sock
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    seen = {
        "existing": lanes.existing(rt) is None,
        "new": lanes.lane(rt) is not ln,
        "parent_socks_left": list(ln.socks),
    }
    os.write(w, json.dumps(seen).encode())
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 4096))
child["parent_keeps"] = lanes.existing(rt) is ln and ln.socks == {"ipc://parent": parent_sock}
print(json.dumps(child))
"""


def test_a_forked_child_starts_a_lane_of_its_own() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["existing"]  # the parent's lane is not the child's...
    assert seen["new"]  # ...it gets a fresh one on first use
    assert seen["parent_socks_left"] == []  # the parent's sockets are never touched there
    assert seen["parent_keeps"]  # the parent's lane is as it was
