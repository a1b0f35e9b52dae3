"""Starting an agent's forkserver process, importing (almost) nothing.

``zmesh agent`` calls ``launch`` first thing, before it imports the rest of
the agent: the forkserver's imports (~0.2 s of CPU) then run on another core
while the agent's do, instead of after them, and a script's first spawn
waits for both. ``zmesh._host.agent.forkserver.ForkServer`` wraps the process.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

from zmesh._host.agent.ptree import EPOCH_VAR  # stdlib only, as this module

_PR_SET_CHILD_SUBREAPER = 36


def enabled() -> bool:
    """Whether agents fork procs from a forkserver (Linux only)."""
    return sys.platform.startswith("linux") and os.environ.get("ZMESH_FORKSERVER", "1") != "0"


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (the agent calls it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def launch(epoch: str) -> subprocess.Popen[bytes] | None:
    """Start the forkserver of the agent incarnation ``epoch`` (this process).

    Returns ``None`` when forkservers are off, or this process cannot be a
    subreaper (its procs could not be its own); raises ``OSError`` if the
    interpreter cannot be started.
    """
    if not enabled() or not become_subreaper():
        return None
    os.environ[EPOCH_VAR] = epoch  # its forks carry it (see zmesh._host.agent.ptree)
    return subprocess.Popen(
        [sys.executable, "-m", "zmesh._host.agent.forkserver", str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
