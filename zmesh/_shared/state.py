"""The supervision state machine, with no sockets in it.

Each rank of a mesh has a ``(status, generation)``. The rules, which the
agent (the controller of its host) and the client's view both follow:

* an older generation never overwrites a newer one;
* a terminal status (Stopped, Failed, Timeout) is frozen for its generation:
  a proc that was declared hung and then wakes up (SIGCONT) stays Timeout;
* a mesh's status is never healthier than its worst rank;
* a failure (Failed, Timeout, Unknown) is reported once per
  ``(mesh, rank, generation)``, however many times it is heard.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace


class Status(str, enum.Enum):
    """The status of one rank (or, clamped, of a whole mesh)."""

    NOT_EXIST = "NotExist"
    INITIALIZING = "Initializing"
    RUNNING = "Running"
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    FAILED = "Failed"
    TIMEOUT = "Timeout"
    UNKNOWN = "Unknown"

    @property
    def terminal(self) -> bool:
        """Frozen for its generation."""
        return self in _TERMINAL

    @property
    def failure(self) -> bool:
        """It broke (as opposed to: someone stopped it)."""
        return self in _FAILURES

    def __str__(self) -> str:
        return self.value


class ReplicaState(str, enum.Enum):
    """The state of one replica of a service, as its orchestrator judges it."""

    HEALTHY = "HEALTHY"  # serving: requests are routed to it
    # Alive, but its __health__ check fails (or it answers nothing with work in
    # flight): out of routing, not killed; HEALTHY again once it passes.
    UNREADY = "UNREADY"
    RECOVERING = "RECOVERING"  # being (re)started
    UNHEALTHY = "UNHEALTHY"  # given up (restart intensity): out of routing for good
    STOPPED = "STOPPED"  # its service stopped

    def __str__(self) -> str:
        return self.value


class ServiceState(str, enum.Enum):
    """The state of a whole service: how many of its replicas serve."""

    OK = "OK"  # every replica healthy
    DEGRADED = "DEGRADED"  # some
    DOWN = "DOWN"  # none
    STOPPED = "STOPPED"  # stopped by its owner

    def __str__(self) -> str:
        return self.value


# How a rank's Failed reason starts when its agent stopped it because its
# owner (the client that made it) exited or went silent: nothing of that
# owner's, such as a service's supervisor, will replace it.
OWNER_GONE = "stopped by its agent"


def owner_gone(reason: str) -> bool:
    """Whether a rank failed with ``reason`` because its owner is gone."""
    return reason.startswith(OWNER_GONE + ":")


def service_state(healthy: int, replicas: int, stopped: bool) -> ServiceState:
    """A service's state from how many of its ``replicas`` are ``healthy``."""
    if stopped:
        return ServiceState.STOPPED
    if healthy == replicas:
        return ServiceState.OK
    return ServiceState.DEGRADED if healthy else ServiceState.DOWN


_TERMINAL = frozenset({Status.STOPPED, Status.FAILED, Status.TIMEOUT})
_FAILURES = frozenset({Status.FAILED, Status.TIMEOUT, Status.UNKNOWN})

# Worst first: a mesh takes the status of its worst rank.
_SEVERITY = {
    Status.FAILED: 0,
    Status.TIMEOUT: 1,
    Status.UNKNOWN: 2,
    Status.STOPPED: 3,
    Status.STOPPING: 4,
    Status.NOT_EXIST: 5,
    Status.INITIALIZING: 6,
    Status.RUNNING: 7,
}


def mesh_status(statuses: Iterable[Status]) -> Status:
    """The status of a mesh: that of its worst rank (NotExist when empty)."""
    worst = None
    for s in statuses:
        if worst is None or _SEVERITY[s] < _SEVERITY[worst]:
            worst = s
    return worst if worst is not None else Status.NOT_EXIST


@dataclass(frozen=True)
class Rank:
    """One rank's status in one generation, with what explains it."""

    status: Status = Status.NOT_EXIST
    generation: int = 0
    reason: str = ""
    pid: int = 0
    addr: str = ""
    log_path: str = ""
    exit_code: int | None = None


def advance(current: Rank, new: Rank) -> Rank | None:
    """Apply ``new`` to ``current``; return the next rank state, or ``None`` to ignore.

    Ignored: an older generation, any change to a frozen (terminal)
    generation, and a repeat of the current status.
    """
    if new.generation < current.generation:
        return None
    if new.generation > current.generation:
        return new
    if current.status.terminal:
        return None
    # Same generation: keep facts learned on the way (addr, pid, log path).
    # Unknown is a guess made from silence, so a real report replaces it.
    merged = _merge(current, new)
    return merged if merged != current else None


def _merge(current: Rank, new: Rank) -> Rank:
    return replace(
        new,
        pid=new.pid or current.pid,
        addr=new.addr or current.addr,
        log_path=new.log_path or current.log_path,
        reason=new.reason or (current.reason if new.status == current.status else ""),
    )


class FailureDedup:
    """Remembers which ``(mesh, rank, generation)`` failures were reported."""

    def __init__(self) -> None:
        self._seen: dict[str, set[tuple[int, int]]] = {}  # mesh -> (rank, generation)

    def first(self, mesh: str, rank: int, generation: int) -> bool:
        """True the first time a failure of this rank generation is heard."""
        seen = self._seen.get(mesh)
        if seen is None:
            seen = self._seen[mesh] = set()
        key = (rank, generation)
        if key in seen:
            return False
        seen.add(key)
        return True

    def forget(self, mesh: str) -> None:
        """Drop what is remembered of ``mesh`` (it is over)."""
        self._seen.pop(mesh, None)

    def __len__(self) -> int:
        """How many meshes are remembered."""
        return len(self._seen)


class MeshView:
    """The ranks of one mesh as one observer (agent or client) knows them."""

    def __init__(self, name: str, ranks: Iterable[int]) -> None:
        self.name = name
        self.ranks: dict[int, Rank] = {r: Rank() for r in ranks}

    def apply(self, rank: int, new: Rank) -> Rank | None:
        """Apply a report for ``rank``; return the new state if it changed."""
        nxt = advance(self.ranks.get(rank, Rank()), new)
        if nxt is not None:
            self.ranks[rank] = nxt
        return nxt

    @property
    def status(self) -> Status:
        return mesh_status(r.status for r in self.ranks.values())
