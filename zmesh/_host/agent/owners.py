"""An agent's owners: who may speak for a mesh, and whether its owner lives.

An owner is the client that created a mesh. Its id is made from its secret
(``zmesh._shared.ownership``), so only that secret may create or stop its
meshes or speak for it (``OwnerGone``, heartbeats): an id read from an event
gives nothing. A lost owner is seen by its pidfd when it runs on this
machine (at once), else by its missing heartbeats after a generous grace,
so nothing is ever orphaned and a busy owner is not taken for a dead one.
The agent asks ``due`` on each tick whom to stop.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict

from zmesh._shared import liveness as _liveness
from zmesh._shared import ownership as _ownership
from zmesh._wire import messages as w

EARLY = 256  # heartbeats of owners with no mesh here kept, at most
# An owner silent this long loses its procs. Generous (as Monarch's 60 s): an
# owner in a long C call holds the GIL and cannot beat. A local owner's death
# is seen at once by its pidfd; the grace is for owners on other machines.
OWNER_GRACE = float(os.environ.get("ZMESH_OWNER_GRACE", "60"))


def not_owner(owner: str, action: str = "stop it") -> str:
    """Why a request to ``action`` from another client than ``owner`` is refused."""
    return f"not the owner: only {owner}, which created it, may {action}"


def not_proven(owner: str) -> str:
    """Why a request that names ``owner`` without its secret is refused."""
    return (
        f"the owner id {owner} is not proven by the secret sent with it: an owner id "
        "is made from its owner's secret, so no other client may act under it"
    )


class Owners:
    """The owners with meshes on one agent: when each was last heard, and a
    pidfd on each that runs on this machine (no secrets: an owner id proves
    itself, ``zmesh._shared.ownership``). Used from the agent's loop."""

    def __init__(self) -> None:
        self.heard: dict[str, float] = {}  # owner -> when it was last heard
        # Owners on this machine, watched by pidfd (None: cannot be watched);
        # and those whose process exited, to be stopped on the next tick.
        self._fds: dict[str, int | None] = {}
        self._dead: dict[str, str] = {}
        # Heartbeats of owners with no mesh here yet, newest last (see beat).
        self._early: OrderedDict[str, w.OwnerHeartbeat] = OrderedDict()

    @staticmethod
    def is_owner(owner: str, secret: str) -> bool:
        """Whether ``secret`` is the one the owner id ``owner`` was made from."""
        return _ownership.proves(owner, secret)

    def track(self, owner: str) -> None:
        """Start the grace of a new owner of a mesh."""
        self.heard.setdefault(owner, time.monotonic())
        early = self._early.pop(owner, None)
        if early is not None:
            self.beat(early)

    def beat(self, msg: w.OwnerHeartbeat) -> None:
        """An owner is alive; watch its process if it runs on this machine.

        Only owners with meshes here (``track``) are followed, so the table
        holds one entry (and at most one pidfd) per owner with meshes here,
        whatever a client sends. The last heartbeats of others wait in a
        small queue (``EARLY``): a client's first beat may come just before
        its first spawn, and it is what lets the agent watch its process.
        """
        if msg.owner not in self.heard:
            self._early[msg.owner] = msg
            self._early.move_to_end(msg.owner)
            while len(self._early) > EARLY:
                self._early.popitem(last=False)
            return
        self.heard[msg.owner] = time.monotonic()
        if msg.owner in self._fds or msg.owner in self._dead:
            return
        fd = None
        # Only the pid its owner id names (hostname:pid:token): a heartbeat
        # cannot tie someone else's meshes to a process it chose.
        if _liveness.owner_pid(msg.owner) == msg.pid:
            fd = _liveness.watch_owner(msg.machine, msg.pid, msg.start)
        self._fds[msg.owner] = fd
        if fd is not None:
            asyncio.get_running_loop().add_reader(fd, self._on_exit, msg.owner, msg.pid)

    def _on_exit(self, owner: str, pid: int) -> None:
        # Stopped on the next tick, not now: an owner that exits normally
        # sends OwnerGone first, and that clean stop should win the race.
        self._unwatch(owner)
        self._dead[owner] = f"owner {owner} exited (pid {pid} is gone)"

    def forget(self, owner: str) -> None:
        """Stop following ``owner`` (its meshes are being stopped)."""
        self.heard.pop(owner, None)
        self._unwatch(owner)
        self._dead.pop(owner, None)

    def due(self, now: float) -> list[tuple[str, str]]:
        """The owners to stop now, with why: those whose process exited, then
        those silent for longer than ``OWNER_GRACE``."""
        out = list(self._dead.items())
        for owner, seen in self.heard.items():
            if owner not in self._dead and now - seen > OWNER_GRACE:
                out.append((owner, f"owner {owner} silent for {now - seen:.1f}s"))
        return out

    def _unwatch(self, owner: str) -> None:
        fd = self._fds.pop(owner, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
