"""An agent's detached names: meshes kept past their owner, found by name.

A script that spawns with ``.options(name="embedder", detached=True)`` files
its proc meshes here under ``embedder`` (``Detach``), with the handle
another script gets back from ``zmesh.lookup("embedder")`` (``Lookup``): a
pickled ``ActorMesh``, or for a service the orchestrator's mesh, which then
hands out the service itself. A detached mesh is not stopped when its owner
exits or falls silent (``HostAgent._stop_owner``); it lives until
``StopDetached`` (``zmesh stop NAME``, ``svc.stop()`` from any script) or
until its procs end.

Names are per *principal*: a token the client derives from its own CURVE
secret key (``zmesh._client.control.lookup.principal``), which the agent keeps and
never publishes. Another key pair (another user, or another team on the
same agents) neither finds nor stops the name, and its own ``embedder`` is
another one. The agent's own user, on its machine, may stop any name with
the operator secret from its registry entry (as ``zmesh stop`` does for
meshes). Used from the agent's loop.

A detached service files more here than its orchestrator's mesh: the
orchestrator adds each replica it spawns (``Detach(join=True)``), so a
replica outlives the orchestrator too; the creator files the frames that
start the orchestrator (``boot``), so the agent restarts it when its proc
dies (``zmesh._host.agent.restarter``); and the agent keeps the service's last
replica table (``ServiceReport``), which a restarted orchestrator gets back
when it takes the replicas over (``Adopt``: they are its meshes from then
on). So a ``kill -9`` of the orchestrator loses no replica and no call
(callers go straight to the replicas).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from zmesh._host.agent.owners import not_owner, not_proven
from zmesh._host.agent.proctable import Mesh
from zmesh._host.agent.restarter import Restarts
from zmesh._shared.ownership import same_secret as _same_secret
from zmesh._shared.state import Rank
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._host.agent.hostagent import HostAgent

log = logging.getLogger("zmesh.agent")

REQUESTS = (w.Detach, w.Lookup, w.StopDetached, w.Adopt)


@dataclass
class Record:
    """One name: whose it is, what it is, and the proc meshes it keeps here."""

    principal: str
    kind: str
    handle: bytes  # b"": replicas filed by their orchestrator only (lookup goes elsewhere)
    meshes: list[str] = field(default_factory=list)
    boot: dict[str, list[bytes]] = field(default_factory=dict)  # mesh -> its SpawnActor
    service: str = ""  # a service's id
    table: bytes = b""  # its last replica table (``ServiceReport``)


class DetachedBook:
    """The names one agent keeps, by (principal, name)."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], Record] = {}
        self.restarts = Restarts()

    def live(self, agent: HostAgent, principal: str) -> dict[str, Record]:
        """``principal``'s names whose meshes still run (the others are forgotten)."""
        out = {}
        for key, rec in list(self.records.items()):
            if not any(_running(agent, m) for m in rec.meshes):
                del self.records[key]
                continue
            if _same_secret(key[0], principal):
                out[key[1]] = rec
        return out


def answer(agent: HostAgent, ident: bytes, msg: Any) -> None:
    """Answer one of ``REQUESTS``."""
    book: DetachedBook = agent.detached
    if isinstance(msg, w.Detach):
        agent.reply(ident, _detach(agent, book, msg))
    elif isinstance(msg, w.Lookup):
        live = book.live(agent, msg.principal)
        names = {n: r for n, r in live.items() if r.handle}
        rec = names.get(msg.name)
        if rec is None:
            error = f"no detached service or mesh named {msg.name!r} of yours on {agent.label}"
            agent.reply(ident, w.LookupReply(
                msg.id, ok=False, names=sorted(names), error=error, replicas=msg.name in live
            ))  # fmt: skip
        else:
            down = [book.restarts.down[m] for m in rec.meshes if m in book.restarts.down]
            why, log_path = down[0] if down else ("", "")
            agent.reply(ident, w.LookupReply(
                msg.id, kind=rec.kind, handle=rec.handle, down=why, log_path=log_path
            ))  # fmt: skip
    elif isinstance(msg, w.StopDetached):
        agent.reply(ident, _stop(agent, book, msg))
    elif isinstance(msg, w.Adopt):
        agent.reply(ident, _adopt(agent, book, msg))


def transition(agent: HostAgent, mesh: Mesh, rank: int, state: Rank) -> None:
    """A rank of a detached mesh changed: an orchestrator's is restarted if it failed."""
    for rec in agent.detached.records.values():
        boot = rec.boot.get(mesh.name)
        if boot and mesh.name in rec.meshes:
            agent.detached.restarts.transition(agent, mesh, rank, state, boot)
            return


def reported(agent: HostAgent, msg: w.ServiceReport) -> None:
    """A service's orchestrator reported its table: keep it with the service's name.

    Only from the orchestrator: a restarted one adopts the replicas the table
    names, so a table from anyone else would send its callers elsewhere. It
    proves itself with its owner secret (it owns the replicas) or its own
    mesh's key (its proc is one of the name's meshes here).
    """
    summary = msg.summary
    if not summary.id or not summary.table:
        return
    for rec in agent.detached.records.values():
        if rec.service == summary.id:
            if _reported_by_owner(agent, rec, msg):
                rec.table = summary.table
            else:
                log.warning("ignored a table of service %s from a client that does not run it",
                            summary.name)  # fmt: skip


def _reported_by_owner(agent: HostAgent, rec: Record, msg: w.ServiceReport) -> bool:
    for name in rec.meshes:
        mesh = agent.procs.meshes.get(name)
        if mesh is None:
            continue
        if agent.owners.is_owner(mesh.spec.owner, msg.secret):
            return True
        if mesh.key and _same_secret(mesh.key, msg.proof):
            return True
    return False


def _detach(agent: HostAgent, book: DetachedBook, msg: w.Detach) -> w.Ack:
    if agent.parent_pid is not None:
        return w.Ack(msg.id, ok=False, error=(
            f"agent {agent.label} is the embedded agent of a script and ends with it: "
            "nothing detached can outlive that script (start 'zmesh agent' and point "
            "ZMESH_AGENTS at it)"
        ))  # fmt: skip
    meshes = []
    for name in msg.meshes:
        mesh = agent.procs.meshes.get(name)
        if mesh is None or mesh.stopped:
            return w.Ack(msg.id, ok=False, error=f"no running mesh {name!r} on {agent.label}")
        if not agent.owners.is_owner(mesh.spec.owner, msg.secret):
            why = not_owner(mesh.spec.owner, "keep it past its owner")
            error = f"mesh {name!r} on {agent.label}: {why}"
            return w.Ack(msg.id, ok=False, denied=True, error=error)
        meshes.append(mesh)
    key = (msg.principal, msg.name)
    taken = book.live(agent, msg.principal).get(msg.name)
    if msg.join:  # an orchestrator files a replica with its service's name
        rec = taken or Record(msg.principal, msg.kind, b"", service=msg.service)
        book.records[key] = rec
        for mesh in meshes:
            mesh.detached = msg.name
            if mesh.name not in rec.meshes:
                rec.meshes.append(mesh.name)
        return w.Ack(msg.id)
    # Replicas an orchestrator filed first (they have no handle) join the name.
    joined = taken.meshes if taken is not None and not taken.handle else []
    if taken is not None and taken.handle and set(taken.meshes) != set(msg.meshes):
        error = (
            f"{msg.name!r} on {agent.label} is a detached {taken.kind} already: "
            f"'zmesh stop {msg.name}' first, or choose another name"
        )
        return w.Ack(msg.id, ok=False, error=error)
    for mesh in meshes:
        mesh.detached = msg.name
    boot = {m: list(msg.boot) for m in msg.meshes} if msg.boot else {}
    meshes_kept = list(msg.meshes) + [m for m in joined if m not in msg.meshes]
    book.records[key] = Record(msg.principal, msg.kind, msg.handle, meshes_kept, boot, msg.service)
    log.info("keeping %s %s (meshes %s) past its owner", msg.kind, msg.name, msg.meshes)
    return w.Ack(msg.id)


def _stop(agent: HostAgent, book: DetachedBook, msg: w.StopDetached) -> w.Ack:
    operator = getattr(agent, "operator_secret", "")  # `zmesh stop`, as this agent's user
    as_operator = bool(operator) and _same_secret(operator, msg.secret)
    found = [
        (key, rec)
        for key, rec in book.records.items()
        if key[1] == msg.name and (as_operator or _same_secret(key[0], msg.principal))
    ]
    if not found:
        # Someone else's name looks like no name at all: it is not ours to confirm.
        error = f"no detached service or mesh named {msg.name!r} of yours on {agent.label}"
        return w.Ack(msg.id, ok=False, error=error)
    for key, rec in found:
        del book.records[key]
        for name in rec.meshes:
            book.restarts.down.pop(name, None)
            mesh = agent.procs.meshes.get(name)
            if mesh is not None and not mesh.stopped:
                log.info("stopping detached %s %s: mesh %s", rec.kind, msg.name, name)
                agent.procs.stop(mesh)
    return w.Ack(msg.id)


def _adopt(agent: HostAgent, book: DetachedBook, msg: w.Adopt) -> w.AdoptReply:
    rec = book.live(agent, msg.principal).get(msg.name)
    if rec is None:
        error = f"no detached service or mesh named {msg.name!r} of yours on {agent.label}"
        return w.AdoptReply(msg.id, ok=False, error=error)
    if not agent.owners.is_owner(msg.owner, msg.secret):
        return w.AdoptReply(msg.id, ok=False, error=not_proven(msg.owner))
    adopted, keys = [], []
    for name in rec.meshes:
        mesh = agent.procs.meshes.get(name)
        if name in rec.boot or mesh is None or mesh.stopped:
            continue  # the orchestrator's own mesh stays its creator's
        mesh.spec = msgspec.structs.replace(mesh.spec, owner=msg.owner)
        adopted.append(name)
        keys.append(mesh.key)  # its procs keep their key: the adopter acts with it
    agent.owners.track(msg.owner)
    log.info("%s adopts %s of %s", msg.owner, adopted, msg.name)
    return w.AdoptReply(msg.id, meshes=adopted, table=rec.table, keys=keys)


def _running(agent: HostAgent, name: str) -> bool:
    mesh = agent.procs.meshes.get(name)
    return mesh is not None and not mesh.stopped
