"""The control plane: agents, their owners, their procs and their observers.

Spawn and stop (``CreateOrUpdate``, ``Stop``), state, owners' heartbeats,
procs' hello and heartbeats, the agent's event and stats streams, logs,
stacks, health, and detached names.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from zmesh._shared.state import Status
from zmesh._shared.stats import HostStatistics, ProcStatistics, ServiceSummary
from zmesh._wire.base import Message
from zmesh._wire.names import (
    MAX_RANKS_PER_HOST,
    Count,
    Dims,
    EnvName,
    EnvValue,
    Id,
    Name,
    NameOrAll,
    RankNo,
    Text,
)

# ------------------------------------------------------ client <-> agent


class MainSpec(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """Where a proc finds the user's modules: the client's ``sys.path`` and cwd.

    (Classes of the client's ``__main__`` travel by value, see
    ``zmesh._wire.pickling``: the script itself never runs in a proc.)
    """

    sys_path: Annotated[list[Text], msgspec.Meta(max_length=4096)] = []
    dir: Text = ""  # the client's cwd: the proc's cwd


class ProcSpec(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """What an agent needs to start the procs of one host slice of a mesh."""

    owner: Id
    # Global ranks of this slice, one proc each (distinct: checked by the agent).
    ranks: Annotated[list[RankNo], msgspec.Meta(min_length=1, max_length=MAX_RANKS_PER_HOST)]
    dims: Dims
    host_index: Count = 0
    main: MainSpec = MainSpec()
    env: Annotated[dict[EnvName, EnvValue], msgspec.Meta(max_length=4096)] = {}


class CreateOrUpdate(Message, frozen=True):
    id: int
    name: Name
    spec: ProcSpec
    secret: Text = ""  # the owner's proof: ``spec.owner`` is made from it; never published


class GetState(Message, frozen=True):
    id: int
    name: NameOrAll = ""  # "" = every mesh


class Stop(Message, frozen=True):
    id: int
    name: Name
    secret: Text = ""  # only the mesh's owner may stop it


class ListMeshes(Message, frozen=True):
    id: int


class Describe(Message, frozen=True):
    """Ask an agent who it is and where its event stream is."""

    id: int


class AgentInfo(Message, frozen=True):
    id: int
    label: str
    control: str
    stream: str
    epoch: str
    pid: int
    hostname: str
    logs: str = ""  # where the agent publishes ``LogLines`` (topic: the owner id)


class OwnerHeartbeat(Message, frozen=True):
    """The owner is alive. ``machine``/``pid``/``start`` let an agent on the
    same machine watch the owner process itself (see ``_liveness.watch_owner``)."""

    owner: Id
    machine: Text = ""  # boot id and pid namespace; "" = not watchable
    pid: Count = 0
    start: Count = 0  # the process's start time, in clock ticks after boot
    secret: Text = ""  # the owner's proof (see zmesh._shared.ownership)


class OwnerGone(Message, frozen=True):
    """The owner is exiting: stop everything it owns now."""

    owner: Id
    secret: Text = ""


class RankState(msgspec.Struct, frozen=True, omit_defaults=True):
    """One rank's state as an agent publishes it (``zmesh._shared.state.Rank``)."""

    rank: int
    status: Status
    generation: int
    reason: str = ""
    pid: int = 0
    addr: str = ""
    log_path: str = ""
    exit_code: int | None = None


class MeshReport(msgspec.Struct, frozen=True, omit_defaults=True):
    """What an agent reports of one mesh: its ranks on that agent's host.

    (The client's ``zmesh.MeshState`` is the whole mesh, across hosts.)
    """

    name: str
    owner: str
    status: Status  # the worst of its ranks'
    ranks: list[RankState]
    dims: dict[str, int] = {}
    generation: int = 0  # of its spec: one more for each update in place
    detached: str = ""  # the name it is kept under past its owner (zmesh.lookup), if any


class Ack(Message, frozen=True):
    id: int
    ok: bool = True
    error: str = ""
    denied: bool = False  # refused because the sender may not do it (not the owner)


class StateReply(Message, frozen=True):
    id: int
    agent: str
    epoch: str
    seq: int
    meshes: list[MeshReport]


class GetStack(Message, frozen=True):
    """Ask an agent for the Python stack of every thread of one of its procs
    (``zmesh stack``); the agent answers within about a second."""

    id: int
    mesh: str
    rank: int


class StackReply(Message, frozen=True):
    id: int
    ok: bool = True
    text: str = ""  # faulthandler's dump, cut at a bound
    error: str = ""
    pid: int = 0
    truncated: bool = False


class GetHealth(Message, frozen=True):
    """Ask an agent what ``GetState`` does not say about its meshes (``zmesh status``)."""

    id: int


class HealthReply(Message, frozen=True):
    id: int
    # Meshes stopped on request: by their owner, or for their owner (it
    # exited, or went silent). A failed rank of such a mesh is history.
    stopped: list[str] = []


class GetLogs(Message, frozen=True):
    """Ask an agent for a piece of a proc's log (``zmesh logs``, top's logs view).

    From byte ``offset`` (``-1``: from where the log stood ``since`` seconds
    ago, or its last ``limit`` bytes when ``since`` is 0), at most ``limit``
    bytes. ``generation`` 0 is the rank's latest.
    """

    id: int
    mesh: str
    rank: RankNo
    offset: int = -1
    since: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    limit: Annotated[int, msgspec.Meta(ge=0, le=1 << 20)] = 64 << 10
    generation: Count = 0


class LogsReply(Message, frozen=True):
    id: int
    ok: bool = True
    text: str = ""  # the bytes read, decoded with replacement
    offset: int = 0  # where the next read starts (the end of ``text``)
    size: int = 0  # the log's size now
    path: str = ""
    live: bool = True  # the proc still runs: more may come
    error: str = ""


class FlushLogs(Message, frozen=True):
    """Forward ``owner``'s new log lines now, then a ``LogLines`` marker (``flushed=id``).

    A client sends it before it stops (``zmesh.shutdown()``, exit), so what
    its actors printed last reaches its terminal. The ``Ack`` says whether
    the owner was subscribed (``ok``): if not yet, nothing could be sent.
    """

    id: int
    owner: Text


class LogLines(Message, frozen=True):
    """Lines a proc wrote to its log, published for the mesh's owner (topic: its id).

    ``skipped`` counts bytes not sent (the proc wrote faster than the
    forwarding rate); they are in the log at ``path``. ``stream`` says which
    of the proc's streams the lines were written to. ``flushed``, when set,
    marks the end of what a ``FlushLogs`` of that id sent (no lines).
    """

    mesh: str
    rank: int
    agent: str
    lines: list[str]
    skipped: int = 0
    path: str = ""
    stream: int = 1  # 1: the proc's stdout, 2: its stderr
    flushed: int = 0


# -------------------------------------------------------- proc -> agent


class ProcHello(Message, frozen=True):
    mesh: Name
    rank: RankNo
    generation: Count
    addr: Text
    pid: Count
    proof: Text = ""  # the mesh's key (zmesh._shared.ownership): only its procs say hello


class ProcHeartbeat(Message, frozen=True):
    mesh: str  # looked up, never used in a path: no pattern on this frequent message
    rank: RankNo
    generation: Count
    proof: str = ""  # the mesh's key, as in ``ProcHello``


# ------------------------------------------------------- agent PUB stream


class Event(Message, frozen=True):
    """A rank transition, published on the agent's stream."""

    seq: int
    epoch: str
    agent: str
    mesh: str
    owner: str
    state: RankState
    time: float


class Heartbeat(Message, frozen=True):
    seq: int  # the last event sequence number, so a subscriber sees gaps
    epoch: str
    agent: str
    time: float


# ------------------------------------------------------------ statistics


class ProcStats(Message, frozen=True):
    """A proc's statistics, sent to its agent about once a second."""

    stats: ProcStatistics
    proof: str = ""  # the mesh's key, as in ``ProcHello``


class ServiceReport(Message, frozen=True):
    """A service's replica table, sent by its orchestrator to its agents
    about once a second, so that ``zmesh top`` can show it, and a restarted
    orchestrator adopt the replicas the table names (``Adopt``)."""

    summary: ServiceSummary
    # What a detached service's agents keep the table on: the orchestrator's
    # owner secret (it owns the replicas) and its own mesh's key.
    secret: str = ""
    proof: str = ""


class GetStats(Message, frozen=True):
    """Ask an agent for its latest ``Stats`` at once (a fresh observer)."""

    id: int


class Stats(Message, frozen=True):
    """An agent's host and procs, published about once a second.

    It goes on a stats stream of its own (its address is in ``StatsReply``),
    next to the event stream, so supervision subscribers never receive it.
    ``meshes`` is the agent's view (as ``GetState`` gives it), so one message
    is enough to draw the agent's part of a dashboard.
    """

    agent: str
    epoch: str
    seq: int
    time: float
    interval: float
    host: HostStatistics
    control: str = ""
    meshes: list[MeshReport] = []
    procs: list[ProcStatistics] = []
    services: list[ServiceSummary] = []


class StatsReply(Message, frozen=True):
    id: int
    stats: Stats
    stream: str = ""  # where the agent publishes ``Stats`` about once a second


# ------------------------------------------- detached meshes and services


class Detach(Message, frozen=True):
    """Keep ``meshes`` (proc meshes on this agent) past their owner's exit,
    filed under ``name`` for ``principal`` (``zmesh._client.control.lookup``)."""

    id: int
    name: Name
    meshes: Annotated[list[Name], msgspec.Meta(min_length=1, max_length=64)]
    principal: Text  # whose name it is; only the same principal finds or stops it
    kind: Text  # "service" or "mesh"
    handle: Annotated[bytes, msgspec.Meta(max_length=1 << 20)]  # what lookup gives back
    secret: Text = ""  # the meshes' owner's proof
    # Add ``meshes`` to the name, which stays as it is (a detached service's
    # replicas, filed by its orchestrator), instead of filing a new one.
    join: bool = False
    # The frames of a ``SpawnActor`` that restarts a failed rank of ``meshes``
    # (a detached service's orchestrator: zmesh._host.agent.restarter).
    boot: Annotated[list[bytes], msgspec.Meta(max_length=64)] = []
    service: Text = ""  # the service's id: the agent keeps its last replica table


class Adopt(Message, frozen=True):
    """A restarted orchestrator takes over the meshes filed under ``name``
    (but the ones it runs in): ``owner`` owns them from now on."""

    id: int
    name: Name
    principal: Text
    owner: Text
    secret: Text  # the new owner's proof: ``owner`` is made from it (zmesh._shared.ownership)


class AdoptReply(Message, frozen=True):
    id: int
    ok: bool = True
    meshes: list[str] = []  # the meshes ``owner`` owns now
    table: bytes = b""  # the service's last replica table this agent heard
    error: str = ""
    keys: list[str] = []  # each of ``meshes``' key, which its procs check (never published)


class Lookup(Message, frozen=True):
    """Ask for the handle filed under ``name`` for ``principal``."""

    id: int
    name: Text
    principal: Text


class LookupReply(Message, frozen=True):
    id: int
    ok: bool = True
    kind: str = ""
    handle: bytes = b""
    names: list[str] = []  # the names this principal has here (when ``name`` is not one)
    error: str = ""
    down: str = ""  # why a service's orchestrator stays down (its agent no longer restarts it)
    log_path: str = ""  # that orchestrator's log
    replicas: bool = False  # not here, but this agent keeps replicas filed under ``name``


class StopDetached(Message, frozen=True):
    """Stop what is filed under ``name``: its principal, or this agent's user
    (``secret``: the operator's, from the registry), may."""

    id: int
    name: Text
    principal: Text = ""
    secret: Text = ""
