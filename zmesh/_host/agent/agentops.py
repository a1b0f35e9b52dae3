"""The agent's read-only requests: what it says of its meshes, stacks, logs and stats.

``answer`` takes each of ``REQUESTS`` off the agent's control socket: the
meshes (``GetState``, ``ListMeshes``), the agent itself (``Describe``), its
statistics (``GetStats``, ``zmesh top``), its logs (``GetLogs``, ``zmesh
logs``; ``FlushLogs``), which meshes stopped (``GetHealth``, ``zmesh status``) and a proc's
stacks (``GetStack``, ``zmesh stack``, answered in the background so the
loop never blocks). ``mesh_report`` and ``rank_report`` are the wire form
of a mesh and a rank, in these replies and in the agent's events.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from zmesh._host.agent.proctable import Mesh, Proc, ProcTable, signal_proc
from zmesh._host.proc import stacks as _stacks
from zmesh._shared.state import Rank
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._host.agent.hostagent import HostAgent

REQUESTS = (
    w.GetState, w.ListMeshes, w.Describe, w.GetStats, w.GetLogs, w.FlushLogs, w.GetHealth,
    w.GetStack,
)  # fmt: skip


def answer(agent: HostAgent, ident: bytes, msg: Any) -> None:
    """Answer ``msg``, one of ``REQUESTS``, to ``ident``."""
    if isinstance(msg, w.GetState | w.ListMeshes):
        name = getattr(msg, "name", "")
        agent.reply(ident, state_reply(agent, msg.id, name))
    elif isinstance(msg, w.Describe):
        me = (agent.label, agent.control_addr, agent.stream_addr, agent.epoch, os.getpid())
        agent.reply(
            ident,
            w.AgentInfo(msg.id, *me, hostname=socket.gethostname(), logs=agent.logs.address),
        )
    elif isinstance(msg, w.GetStats):
        agent.reply(ident, w.StatsReply(msg.id, agent.stats(), agent.stats_addr))
    elif isinstance(msg, w.GetLogs):
        agent.reply(ident, agent.logs.answer(msg))
    elif isinstance(msg, w.FlushLogs):
        agent.reply(ident, w.Ack(msg.id, ok=agent.logs.flush(msg.owner, msg.id)))
    elif isinstance(msg, w.GetHealth):
        stopped = [m.name for m in agent.procs.meshes.values() if m.stopped]
        agent.reply(ident, w.HealthReply(msg.id, stopped))
    else:
        _stack(agent, ident, msg)


def state_reply(agent: HostAgent, req_id: int, name: str) -> w.StateReply:
    """The agent's view of mesh ``name`` (``""``: of every mesh)."""
    table = agent.procs.meshes
    meshes = ([table[name]] if name in table else []) if name else list(table.values())
    return w.StateReply(
        id=req_id, agent=agent.label, epoch=agent.epoch, seq=agent.seq,
        meshes=[mesh_report(m) for m in meshes],
    )  # fmt: skip


def _stack(agent: HostAgent, ident: bytes, msg: w.GetStack) -> None:
    """``zmesh stack``: answered without blocking the loop."""
    proc, error = _live_proc(agent.procs, agent.label, msg.mesh, msg.rank)
    if proc is None:
        agent.reply(ident, w.StackReply(msg.id, ok=False, error=error))
        return
    where = f"{msg.mesh}[{msg.rank}] on {agent.label}"
    # A stack file older than the proc is a stale one: its proc cannot
    # have registered the handler yet, so it must not be signalled.
    started = time.time() - (time.monotonic() - proc.started)
    send = functools.partial(signal_proc, proc, _stacks.SIGNAL)

    async def answer() -> None:
        reply = await _stacks.reply(msg.id, where, proc.popen.pid, proc.log_path, send, started)
        if not agent.stopping.is_set():
            agent.reply(ident, reply)

    _stacks.background(answer())


def _live_proc(table: ProcTable, label: str, mesh: str, rank: int) -> tuple[Proc | None, str]:
    """The live proc of ``mesh[rank]``, or ``None`` and why there is none."""
    m = table.meshes.get(mesh)
    proc = m.procs.get(rank) if m is not None else None
    if m is None or proc is None:
        if m is None:
            return None, f"no mesh named {mesh!r} on {label}"
        return None, f"no rank {rank} in mesh {mesh!r} on {label}"
    status = m.view.ranks[rank].status
    if proc.reaped or status.terminal:
        where = f"{mesh}[{rank}] on {label}"
        return None, f"{where} is {status.value}: no live proc (log: {proc.log_path})"
    return proc, ""


def mesh_report(mesh: Mesh) -> w.MeshReport:
    """A mesh as the agent reports it."""
    return w.MeshReport(
        name=mesh.name,
        owner=mesh.spec.owner,
        status=mesh.view.status,
        ranks=[rank_report(r, s) for r, s in sorted(mesh.view.ranks.items())],
        dims=mesh.spec.dims,
        generation=mesh.generation,
        detached=mesh.detached,
    )


def rank_report(rank: int, s: Rank) -> w.RankState:
    """A rank as the agent reports it."""
    return w.RankState(
        rank=rank,
        status=s.status,
        generation=s.generation,
        reason=s.reason,
        pid=s.pid,
        addr=s.addr,
        log_path=s.log_path,
        exit_code=s.exit_code,
    )
