"""Where this user's agents on this machine say they are: ``runtime_dir()/agents/``.

Every agent (embedded, ``zmesh agent``, ``zmesh cluster``) writes one entry
as it starts serving, ``<pid>.json`` (mode 0600, written whole then renamed
into place), and removes it when it exits. ``zmesh top``, ``ps``, ``status``
and the other commands read them to find the agents with no ``--agents``:
``python long.py &`` then ``zmesh top`` shows its embedded agent.

The directory is the user's private runtime directory (0700, checked by
``paths.private_dir``), so another user can neither read our entries nor
plant one there; an entry that is not ours (a file someone else owns) is
ignored anyway. An agent killed with SIGKILL leaves its entry behind: an
entry whose process is gone, or whose pid now names another process (its
start time differs), is stale, ignored and removed.
"""

from __future__ import annotations

import contextlib
import os
import time

import msgspec

from zmesh._errors import SecurityError
from zmesh._shared import paths as _paths


class Entry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One agent, as it registered itself.

    Attributes:
        address: its control address.
        pid: the agent's pid; start: its start time in clock ticks after boot
            (a pid can be reused, a (pid, start) pair cannot).
        label: its host name in meshes and dashboards.
        keys: its keys directory ("" for an ipc:// agent without keys).
        owner: the pid it lives for (an embedded agent's client), else 0.
        started: wall clock when it started serving.
        log_dir: where its procs log.
        operator: what ``zmesh stop`` proves with that it runs as this
            agent's user (the entry is readable by that user only).
    """

    address: str
    pid: int
    label: str
    start: int = 0
    keys: str = ""
    owner: int = 0
    started: float = 0.0
    log_dir: str = ""
    operator: str = ""


def directory(create: bool = True) -> str:
    """The registry directory (private to this user).

    Raises:
        SecurityError: it, or the runtime directory, is not private to us.
    """
    return _paths.private_dir(os.path.join(_paths.runtime_dir(), "agents"), create=create)


def start_time(pid: int) -> int:
    """A process's start time (clock ticks after boot), 0 if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat.rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def register(
    address: str,
    label: str,
    *,
    keys: str = "",
    owner: int = 0,
    log_dir: str = "",
    operator: str = "",
) -> str:
    """Write this process's entry; return its path (for ``unregister``).

    Raises:
        SecurityError: the registry directory is not private to us.
    """
    pid = os.getpid()
    entry = Entry(
        address=address, pid=pid, label=label, start=start_time(pid),
        keys=os.path.abspath(keys) if keys else "", owner=owner or 0,
        started=time.time(), log_dir=log_dir, operator=operator,
    )  # fmt: skip
    base = directory()
    path = os.path.join(base, f"{pid}.json")
    tmp = os.path.join(base, f".{pid}.tmp")
    fd = _paths.open_private(tmp, append=False)
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.json.encode(entry))
    os.replace(tmp, path)
    return path


def unregister(path: str) -> None:
    """Remove an entry ``register`` wrote (gone already is fine)."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def live() -> list[Entry]:
    """The entries of this user's agents that run now, oldest first.

    Stale entries (their agent is gone) are removed on the way; unreadable
    ones and any not owned by us are skipped. No registry: none.
    """
    try:
        base = directory(create=False)
        names = os.listdir(base)
    except (SecurityError, OSError):
        return []
    found = []
    uid = os.getuid()
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
            if st.st_uid != uid or not os.path.isfile(path):
                continue  # not ours: never trusted
            with open(path, "rb") as f:
                entry = msgspec.json.decode(f.read(), type=Entry)
        except (OSError, msgspec.DecodeError):
            continue
        if not running(entry):
            unregister(path)
            continue
        found.append(entry)
    return sorted(found, key=lambda e: (e.started, e.pid))


def running(entry: Entry) -> bool:
    """Whether the agent of ``entry`` runs now (its pid, with the same start time)."""
    try:
        os.kill(entry.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process now has that pid
    return not entry.start or start_time(entry.pid) == entry.start
