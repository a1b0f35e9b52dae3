"""What the client concludes of the ranks of an agent that fell silent, restarted or forgot them.

The controller (``zmesh._client.control.controller``) applies what agents report;
this is the other half of supervision, for what they cannot report: an
agent that is lost (its heartbeats stopped), a new incarnation of it (its
procs died with the old one), or a snapshot that no longer names a rank
we heard of. Each verdict goes through ``Controller.judge``, with the same
consequences as a report from the agent.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from zmesh._shared.state import Status

if TYPE_CHECKING:
    from zmesh._client.control.agentconn import AgentConn
    from zmesh._client.control.controller import Controller

log = logging.getLogger("zmesh")


class AgentFates:
    """The verdicts on the ranks of agents that cannot tell us of them."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    def forget_missing(self, agent: AgentConn, known: set[str], asked: set[str]) -> None:
        """Ranks the agent does not know of (it restarted, or our request was lost)
        are gone; ``asked`` are the meshes whose creation it was asked for first."""
        ctl = self.ctl
        for (mesh, rank), a in list(ctl.hosts.items()):
            if a is not agent or mesh in known:
                continue
            view = ctl.views.get(mesh)
            if view is None:
                continue  # released by an earlier rank of this loop
            cur = view.ranks.get(rank)
            if cur is None:
                continue
            if cur.generation > 0 or self._begun(mesh, agent):
                # The agent told us of it (or of another rank of its mesh on
                # it: it had the mesh) once, and no longer knows it.
                ctl.judge(agent, mesh, rank, Status.FAILED, "agent no longer knows it")
            elif mesh in asked:
                # (Others not heard of are being created: the request may not be sent yet.)
                ctl.judge(agent, mesh, rank, Status.FAILED, "agent lost the request to create it")

    def _begun(self, mesh: str, agent: AgentConn) -> bool:
        """Whether ``agent`` reported any rank of ``mesh`` (so it had the mesh).

        Only its own ranks count: other agents of a multi-host mesh may have
        started theirs while this one's snapshot was taken before our
        request to create its part reached it.
        """
        ctl = self.ctl
        view = ctl.views.get(mesh)
        return view is not None and any(
            r.generation > 0 and ctl.hosts.get((mesh, rank)) is agent
            for rank, r in view.ranks.items()
        )

    def agent_restarted(self, agent: AgentConn, epoch: str) -> None:
        """``agent`` is a new incarnation: what we knew of the old one is gone.

        Its procs died with it (they exit when their agent does), so every
        rank we heard of from the old one is Failed, before the new one's
        state is applied. (Ranks never heard of, generation 0, are left to
        the snapshot: we may have asked the new incarnation to create them.)
        """
        ctl = self.ctl
        reason = (
            f"agent restarted: {agent.label} is a new incarnation "
            f"(epoch {agent.epoch} -> {epoch}); the old one's procs died with it"
        )
        log.warning("%s", reason)
        for (mesh, rank), a in list(ctl.hosts.items()):
            cur = ctl.views[mesh].ranks.get(rank) if mesh in ctl.views else None
            if a is agent and cur is not None and cur.generation > 0:
                ctl.judge(agent, mesh, rank, Status.FAILED, reason)

    def agent_lost(self, agent: AgentConn, *, new_too: bool = False) -> None:
        """Make ``agent``'s ranks Unknown (once per loss): we cannot hear it.

        Ranks it never told us of (generation 0: being created) only with
        ``new_too``: a restarted agent may be creating them right now, and
        ``Describe`` says so before they are given up.
        """
        ctl = self.ctl
        todo = [
            (mesh, rank)
            for (mesh, rank), a in ctl.hosts.items()
            if a is agent
            and (mesh, rank) not in agent.judged
            and (new_too or self._generation(mesh, rank) > 0)
        ]
        if not todo:
            return
        silent = time.monotonic() - agent.last_heard
        reason = f"agent {agent.label} unreachable (no heartbeat for {silent:.1f}s)"
        log.warning("%s", reason)
        for mesh, rank in todo:
            agent.judged.add((mesh, rank))
            ctl.judge(agent, mesh, rank, Status.UNKNOWN, reason)

    def _generation(self, mesh: str, rank: int) -> int:
        ctl = self.ctl
        view = ctl.views.get(mesh)
        cur = view.ranks.get(rank) if view is not None else None
        return cur.generation if cur is not None else 0
