"""Process trees through ``/proc``: children, descendants, tags, and killing a tree.

What an agent (and its janitor) uses to stop everything a proc started:
cgroups would do it in one write, but they are not usable everywhere (a
container on cgroup v1, an unprivileged user), so zmesh follows the tree.

* ``children(pid)`` reads ``/proc/PID/task/*/children`` (every thread's), or
  scans ``/proc`` for parent links where that file does not exist.
* ``tag(pid)`` is the ``ZMESH_PROC`` value in a process's environment: a
  program a proc runs inherits it (unless it is given an empty environment),
  so it tells whose a process is even after its parent died.
  ``tagged(epoch)`` finds every process of an agent incarnation by
  ``ZMESH_AGENT_EPOCH``, which forks that never exec also carry (a forked
  process's ``/proc/PID/environ`` is its exec-time block, its parent's).
* ``kill_tree(root)`` stops a tree, freezing it first (``SIGSTOP``) so that
  no process of it can fork a child that escapes between the scan and the
  kill.

Everything here is best effort by nature (a process may exit at any time):
no function raises for a process that is gone or not ours to read.
Stdlib only, so that the janitor stays small.
"""

from __future__ import annotations

import os
import signal

_TAG = b"ZMESH_PROC="
# Set by an agent in its own environment (so its forkserver and every proc
# forked from it carry it) and in each proc's: the agent incarnation.
EPOCH_VAR = "ZMESH_AGENT_EPOCH"
# Linux with CONFIG_PROC_CHILDREN (most distributions); else parent links.
_HAS_CHILDREN_FILE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def children(pid: int) -> list[int]:
    """The children of ``pid`` (zombies included: they still need reaping)."""
    if not _HAS_CHILDREN_FILE:
        return _children_by_scan(pid)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:  # each thread lists the children it forked or adopted
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue  # the thread ended
    return out


def _children_by_scan(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and parent(int(entry)) == pid:
            out.append(int(entry))
    return out


def _stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, an identity
    that survives pid reuse."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def is_zombie(pid: int) -> bool:
    fields = _stat(pid)
    return fields is None or fields[0] == b"Z"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children."""
    out: list[int] = []
    todo = children(pid)
    seen = set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        todo.extend(children(p))
    return out


def _environ(pid: int) -> list[bytes]:
    """The environment ``pid`` was started with (``/proc/PID/environ``).

    That is the block its program was exec'd with, which a fork inherits:
    a variable a process sets later is not in it.
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def tag(pid: int) -> bytes | None:
    """The ``ZMESH_PROC`` value in ``pid``'s environment (which proc's it is:
    ``zmesh._wire.boundary.proc_env_of`` reads it), or ``None``."""
    for entry in _environ(pid):
        if entry.startswith(_TAG):
            return entry[len(_TAG) :]
    return None


def tagged(epoch: str) -> list[int]:
    """Every live process whose environment names the agent incarnation ``epoch``."""
    needle = EPOCH_VAR.encode() + b"=" + epoch.encode()
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me and needle in _environ(int(entry)):
            if not is_zombie(int(entry)):
                out.append(int(entry))
    return out


def signal_tree(root: int, sig: int) -> list[int]:
    """Send ``sig`` to ``root`` and every process below it; return who got it."""
    tree = [root, *descendants(root)]
    for p in tree:
        _kill(p, sig)
    return tree


def kill_tree(root: int, passes: int = 5) -> None:
    """SIGKILL ``root`` and everything below it, leaving no time to fork away.

    The tree is frozen with SIGSTOP and scanned again until no new process
    shows up (a fork in flight finishes stopped), then killed.
    """
    frozen: list[int] = []
    seen: set[int] = set()
    for _ in range(passes):
        new = [p for p in [root, *descendants(root)] if p not in seen]
        if not new:
            break
        for p in new:
            _kill(p, signal.SIGSTOP)
        seen.update(new)
        frozen.extend(new)
    for p in frozen:
        _kill(p, signal.SIGKILL)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
