"""Judging health: what is alive now, what is a problem, what is history.

Pure functions of a ``Snapshot`` (no clock, no sockets), shared by
``zmesh status`` (its exit code), ``zmesh ps`` and ``zmesh top`` (which rows
fold into the history count).

Each mesh an agent knows is one of:

* **live**: a rank is Running or Initializing. Its failed ranks are
  problems: nothing replaces a rank of a live mesh. (A service's replica is
  the exception: its service replaces the whole replica, and the service's
  own row says whether it is whole.)
* **history**: nothing in it runs and nothing is owed: it was stopped on
  request (by its owner, or for its owner, who exited or went silent); its
  service has replaced it and is whole again; or its owner runs a newer
  mesh of the same name (a dead generation superseded by a running one).
* **problem**: nothing in it runs, yet nobody stopped or replaced it: a
  failure its owner has not dealt with, or a replica its service is still
  replacing.

A service whose healthy replicas are fewer than desired is a problem while
that lasts; an agent that does not answer makes the whole judgement
``unreachable``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from zmesh._shared.state import Status
from zmesh._shared.stats import ServiceSummary
from zmesh._wire import messages as w
from zmesh.top._collect import Snapshot

LIVE = (Status.RUNNING, Status.INITIALIZING)
FAILURES = (Status.FAILED, Status.TIMEOUT, Status.UNKNOWN)
_SUFFIX = re.compile(r"-[0-9a-f]{8}$")  # the random part a spawn adds to the user's name
_REPLICA = re.compile(r"^(?P<service>.+)-r\d+$")  # a service's replica: <service>-r<index>

HEALTHY, DEGRADED, UNREACHABLE = "healthy", "degraded", "unreachable"
EXIT_CODES = {HEALTHY: 0, DEGRADED: 1, UNREACHABLE: 2}


def base_name(mesh: str) -> str:
    """The name the user gave: ``counter-1a2b3c4d`` -> ``counter``."""
    return _SUFFIX.sub("", mesh)


def means(name: str, full: str) -> bool:
    """Whether ``name`` (as a user gives it) means the mesh ``full``: its full
    name, the name given at spawn, or the name of the service it is a replica of."""
    if name == full:
        return True
    base = base_name(full)
    replica = _REPLICA.match(base)
    return base == name or (replica is not None and replica.group("service") == name)


def service_of(mesh: str, services: Iterable[str]) -> str | None:
    """The service ``mesh`` is a replica of, if one of ``services``."""
    m = _REPLICA.match(base_name(mesh))
    if m is None:
        return None
    name = m.group("service")
    return name if name in services else None


@dataclass(frozen=True)
class Health:
    """The judgement of one snapshot.

    Attributes:
        state: ``healthy``, ``degraded`` or ``unreachable``.
        problems: one line per problem, worst first.
        history: ``(agent label, mesh)`` of the meshes that are history.
        verdicts: ``(agent label, mesh)`` -> ``live`` / ``history`` / ``problem``.
    """

    state: str
    problems: list[str] = field(default_factory=list)
    history: set[tuple[str, str]] = field(default_factory=set)
    verdicts: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 healthy, 1 degraded, 2 unreachable."""
        return EXIT_CODES[self.state]


def services_of(snap: Snapshot) -> dict[str, ServiceSummary]:
    """Every service reported to a reachable agent, one per name."""
    return {
        s.name: s
        for a in snap.agents
        if a.stats is not None and a.state == "ok"
        for s in a.stats.services
    }


def judge(snap: Snapshot) -> Health:
    """What is alive now in ``snap``, and whether it is healthy (see the module doc)."""
    unreachable: list[str] = []
    problems: list[str] = []
    verdicts: dict[tuple[str, str], str] = {}
    services = services_of(snap)
    reachable = [a for a in snap.agents if a.stats is not None and a.state == "ok"]
    for a in snap.agents:
        if a not in reachable:
            state = a.state if a.stats is not None else "unreachable"
            unreachable.append(f"agent {a.label} ({a.address}) is {state}")
    # A family is every mesh one owner spawned under one name; one live
    # member supersedes its dead ones.
    live_families = {
        (m.owner, base_name(m.name))
        for a in reachable
        for m in _meshes(a.stats)
        if any(r.status in LIVE for r in m.ranks)
    }
    for a in reachable:
        assert a.stats is not None
        stopped = set(a.stopped)
        for m in _meshes(a.stats):
            key = (a.stats.agent, m.name)
            service = service_of(m.name, services)
            statuses = [r.status for r in m.ranks]
            failed = [r for r in m.ranks if r.status in FAILURES]
            if any(s in LIVE for s in statuses):
                verdicts[key] = "live"
                if service is None:
                    problems.extend(_rank_problem(m.name, r, a.stats.agent) for r in failed)
            elif m.name in stopped or any(s in ("Stopped", "Stopping") for s in statuses):
                verdicts[key] = "history"  # stopped on request
            elif service is not None:
                s = services[service]
                verdicts[key] = "history" if s.healthy >= s.desired else "problem"
            elif (m.owner, base_name(m.name)) in live_families:
                verdicts[key] = "history"  # a newer mesh of the same name runs
            else:
                verdicts[key] = "problem"
                problems.extend(_rank_problem(m.name, r, a.stats.agent) for r in failed)
    for s in sorted(services.values(), key=lambda s: s.name):
        if s.healthy < s.desired and s.state != "STOPPED":
            last = f"; last failure: {s.last_failure}" if s.last_failure else ""
            problems.append(
                f"service {s.name}: {s.healthy}/{s.desired} replicas healthy ({s.state}{last})"
            )
    history = {k for k, v in verdicts.items() if v == "history"}
    if unreachable:
        return Health(UNREACHABLE, unreachable + problems, history, verdicts)
    return Health(DEGRADED if problems else HEALTHY, problems, history, verdicts)


def _meshes(stats: w.Stats | None) -> list[w.MeshReport]:
    return stats.meshes if stats is not None else []


def _rank_problem(mesh: str, r: w.RankState, agent: str) -> str:
    detail = f": {r.reason}" if r.reason else ""
    return f"{mesh}[{r.rank}] on {agent} is {r.status}{detail}"


def find_meshes(snap: Snapshot, name: str) -> list[str]:
    """The full names of the meshes ``name`` means, live ones first.

    ``name`` is a full name as ``zmesh ps`` shows it, or the name the user
    gave (``name=`` or the class name; a service's name for its replicas).
    When several meshes were spawned under that name, only the live ones
    are meant, if any is.
    """
    meshes: dict[str, bool] = {}
    for a in snap.agents:
        for m in _meshes(a.stats):
            running = any(r.status in LIVE for r in m.ranks)
            meshes[m.name] = meshes.get(m.name, False) or running
    if name in meshes:
        return [name]
    found = sorted(n for n in meshes if means(name, n))
    live = [n for n in found if meshes[n]]
    return live or found
