"""An agent restarts the orchestrator of a detached service when its proc dies.

A detached service's orchestrator (``zmesh._service.orchestrator``) runs in
a one-proc mesh that the agent keeps past its creator, so once the creator
has exited nobody else could bring it back. Its creator files, with the
name, the frames of the ``SpawnActor`` that made it (``Detach.boot``). When
that proc fails (a crash, ``kill -9``, a hang), the agent starts the rank's
next generation after a short backoff and, once it runs, sends it those
frames itself, as the creator did: the new orchestrator then takes over the
replicas filed under the name (``Adopt``) and supervises them again.

Restart intensity as a service's replicas have it: at most
``MAX_RESTARTS`` within ``RESTART_WINDOW`` seconds, then the orchestrator
stays down (the replicas keep serving; ``zmesh stop NAME`` ends them).
The agent never unpickles what it sends: the frames are the creator's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import zmq

from zmesh._host.agent.proctable import Mesh, signal_proc
from zmesh._shared.state import Rank, Status
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec
from zmesh._wire.security import secure_client
from zmesh._wire.zsock import AsyncSocket, configure

if TYPE_CHECKING:
    from zmesh._host.agent.hostagent import HostAgent

log = logging.getLogger("zmesh.agent")

RESTART_DELAY = 0.1  # before the first restart; doubled per recent restart
RESTART_MAX_DELAY = 5.0
MAX_RESTARTS = int(os.environ.get("ZMESH_ORCHESTRATOR_MAX_RESTARTS", "5"))
RESTART_WINDOW = float(os.environ.get("ZMESH_ORCHESTRATOR_RESTART_WINDOW", "60"))
BOOT_TIMEOUT = 120.0  # for the orchestrator's __init__ to answer

_REPLIES: Any = w.Reply | w.Failure


class Restarts:
    """The restarts of one agent's orchestrators. Used from the agent's loop."""

    def __init__(self) -> None:
        self._times: dict[str, deque[float]] = {}  # restarts per mesh, recent ones
        self._booting: set[tuple[str, int, int]] = set()  # (mesh, rank, generation)
        self._tasks: set[asyncio.Task[None]] = set()
        # Orchestrators past their limit, by mesh: (why, log path), for ``zmesh.lookup``.
        self.down: dict[str, tuple[str, str]] = {}

    def transition(
        self, agent: HostAgent, mesh: Mesh, rank: int, state: Rank, boot: list[bytes]
    ) -> None:
        """A rank of an orchestrator's mesh changed: restart it, or boot its actor."""
        if mesh.stopped:
            return
        if state.status.failure:
            self._failed(agent, mesh, rank, state.generation)
        elif state.status is Status.RUNNING and state.generation > 1:
            key = (mesh.name, rank, state.generation)
            if key in self._booting:
                return
            self._booting.add(key)
            task = asyncio.get_running_loop().create_task(
                self._boot(agent, mesh, rank, state, boot)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _failed(self, agent: HostAgent, mesh: Mesh, rank: int, generation: int) -> None:
        times = self._times.setdefault(mesh.name, deque())
        now = time.monotonic()
        while times and now - times[0] > RESTART_WINDOW:
            times.popleft()
        if len(times) >= MAX_RESTARTS:
            why = (
                f"its orchestrator {mesh.name}[{rank}] stays down after {len(times)} restart(s) "
                f"within {RESTART_WINDOW:.0f}s (its replicas keep serving the handles that have "
                f"them; 'zmesh stop {mesh.detached}' ends them)"
            )
            proc = mesh.procs.get(rank)
            self.down[mesh.name] = (why, proc.log_path if proc is not None else "")
            log.error("service %s: %s", mesh.detached, why)
            return
        delay = min(RESTART_DELAY * 2 ** len(times), RESTART_MAX_DELAY)
        times.append(now)
        log.warning("orchestrator %s[%d] of %s failed: restarting it in %.1fs",
                    mesh.name, rank, mesh.detached, delay)  # fmt: skip
        asyncio.get_running_loop().call_later(delay, self._respawn, agent, mesh, rank, generation)

    def _respawn(self, agent: HostAgent, mesh: Mesh, rank: int, generation: int) -> None:
        if mesh.stopped or agent.procs.meshes.get(mesh.name) is not mesh:
            return  # stopped meanwhile (zmesh stop)
        state = mesh.view.ranks.get(rank)
        if state is None or state.generation != generation:
            return  # another generation runs already
        agent.procs.spawn_or_fail(mesh, rank)

    async def _boot(
        self, agent: HostAgent, mesh: Mesh, rank: int, state: Rank, boot: list[bytes]
    ) -> None:
        """Send the restarted proc its orchestrator (the creator's ``SpawnActor``)."""
        loop = asyncio.get_running_loop()
        sock = secure_client(
            configure(zmq.Context.instance().socket(zmq.DEALER), addr=state.addr),
            agent.keys,
            state.addr,
        )
        sock.connect(state.addr)
        got: asyncio.Future[list[Any]] = loop.create_future()
        conn = AsyncSocket(
            sock, loop, lambda frames: None if got.done() else got.set_result(frames)
        )
        why = ""
        try:
            conn.send(list(boot))
            replies = Codec(_REPLIES).decode_frames((await asyncio.wait_for(got, BOOT_TIMEOUT))[:1])
            failed = [r for r in replies if isinstance(r, w.Failure)]
            if failed:
                why = f"{failed[0].type}: {failed[0].message}"
        except Exception as exc:  # no answer, or one we cannot read: try again
            why = repr(exc)
        finally:
            conn.close()
        proc = mesh.procs.get(rank)
        if not why:
            log.info("orchestrator %s[%d] of %s restarted (generation %d)",
                     mesh.name, rank, mesh.detached, state.generation)  # fmt: skip
        elif proc is not None and proc.generation == state.generation and not proc.reaped:
            log.error("orchestrator %s[%d] did not start: %s", mesh.name, rank, why)
            signal_proc(
                proc, signal.SIGKILL
            )  # it fails, and the next restart (if any is left) tries again
