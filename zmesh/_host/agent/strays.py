"""What an agent's procs leave behind: their daemons, and orphans to stop.

The agent is a child subreaper, so a process whose parent dies below it is
handed to the agent, not to init: each tick it looks at its children, and
one that is no proc of its own (and no helper: forkserver, janitor) is a
stray. A stray whose environment names a proc that still runs (a daemon the
proc started) stays while that proc does; any other is an orphan: SIGTERM
with everything below it, then SIGKILL ``STOP_GRACE`` later.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zmesh._host.agent import ptree as _ptree
from zmesh._wire.boundary import proc_env_of

log = logging.getLogger("zmesh.agent")

STOP_GRACE = 1.5  # SIGTERM, then SIGKILL after this long

# Which proc a process says it belongs to: (mesh, rank, generation), as read
# from its environment (so of any type until checked).
Owner = tuple[Any, Any, Any]
_NOBODY: Owner = (None, None, None)


@dataclass
class _Orphan:
    """A process a dead proc left behind, being stopped."""

    start: int | None  # its start time: the pid may be reused once it is gone
    kill_at: float  # SIGTERM went out; SIGKILL then
    killed: bool = False


class Strays:
    """The agent's children that are no procs: daemons of live procs, and orphans.

    Args:
        epoch: the agent's incarnation: a stray tagged with another is nobody's.
        proc_alive: whether the proc ``(mesh, rank, generation)`` still runs.
    """

    def __init__(self, epoch: str, proc_alive: Callable[[Any, Any, Any], bool]) -> None:
        self.epoch = epoch
        self._proc_alive = proc_alive
        self._orphans: dict[int, _Orphan] = {}
        # pid -> its start time and the proc it names.
        self._daemons: dict[int, tuple[int | None, Owner]] = {}

    @property
    def pending(self) -> bool:
        """Whether orphans are being stopped."""
        return bool(self._orphans)

    def daemons_of(self, owner: Owner) -> list[int]:
        """The daemons we adopted from the proc ``(mesh, rank, generation)``."""
        return [pid for pid, (_, o) in self._daemons.items() if o == owner]

    def sweep(self, now: float, ours: set[int]) -> None:
        """Stop what dead procs left behind, and reap it (see the module docstring).

        Args:
            ours: our children that are live procs or helpers.
        """
        strays = _strays(ours)
        for pid in strays:
            if _ptree.is_zombie(pid):
                continue  # exited: reaped below
            start = _ptree.start_time(pid)
            orphan = self._orphans.get(pid)
            if orphan is not None and orphan.start == start:
                if now >= orphan.kill_at and not orphan.killed:
                    orphan.killed = True
                    _ptree.kill_tree(pid)
                continue
            daemon = self._daemons.get(pid)
            if daemon is None or daemon[0] != start:
                spec = proc_env_of(_ptree.tag(pid))
                mine = spec is not None and spec.epoch == self.epoch
                owner = (spec.mesh, spec.rank, spec.generation) if spec and mine else _NOBODY
                daemon = self._daemons[pid] = (start, owner)
            if self._proc_alive(*daemon[1]):
                continue
            del self._daemons[pid]
            log.info("stopping pid %d, left behind by proc %s", pid, daemon[1])
            _ptree.signal_tree(pid, signal.SIGTERM)
            self._orphans[pid] = _Orphan(start, now + STOP_GRACE)
        self._reap(strays)

    def kill_all(self, ours: Callable[[], set[int]]) -> None:
        """SIGKILL every stray and everything below it (the agent is exiting)."""
        for _ in range(10):
            left = _strays(ours())
            if not left:
                break
            for pid in left:
                _ptree.kill_tree(pid)
            time.sleep(0.01)
            self._reap(left)

    def _reap(self, strays: list[int]) -> None:
        for pid in strays:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._orphans.pop(pid, None)
                self._daemons.pop(pid, None)
        gone = set(strays)
        for table in (self._orphans, self._daemons):
            for pid in [p for p in table if p not in gone]:
                del table[pid]  # no child of ours any more


def _strays(ours: set[int]) -> list[int]:
    """Our children that are not in ``ours``."""
    return [pid for pid in _ptree.children(os.getpid()) if pid not in ours]
