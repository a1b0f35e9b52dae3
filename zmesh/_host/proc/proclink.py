"""A proc's sockets: the ROUTER callers reach (and when it stops reading), its hello and heartbeats.

A part of ``ProcServer`` (``proc.py``): ``serve`` binds the socket callers
reach the proc on, says hello to the agent (the rank is Running from then),
and beats from the event loop so a hung loop is noticed; about once a
second the beat carries the proc's statistics. ``took`` and ``started``
keep the backlog of calls bounded: past it the proc stops reading.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import zmq

from zmesh._actor import set_own_proc
from zmesh._client.calls import runtime as _runtime
from zmesh._client.control import faults as _faults
from zmesh._host.proc import actordeath as _actordeath
from zmesh._host.proc import bounds as _bounds
from zmesh._host.proc import loopwatch as _loopwatch
from zmesh._shared import stats as _stats
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.zsock import AsyncSocket, configure

if TYPE_CHECKING:
    from zmesh._host.proc.mailbox import Mailbox
    from zmesh._host.proc.relay import RelayServer
    from zmesh._wire.boundary import ProcEnv
    from zmesh._wire.codec import Codec

log = logging.getLogger("zmesh.proc")

PROC_HEARTBEAT_INTERVAL = 0.2
STATS_EVERY = 5  # heartbeats: statistics go to the agent about once a second
# Calls received and not started (queued in mailboxes, plus running
# ``concurrent`` ones), at most: past this the proc stops reading its socket
# until half have gone, so callers meet TCP backpressure instead of this
# process's memory growing without bound. Each caller also keeps at most
# zmesh._client.calls.runtime.MAX_IN_FLIGHT calls in flight to one proc.
MAX_BACKLOG = _bounds.MAX_BACKLOG  # (and MAX_BACKLOG_BYTES: zmesh._host.proc.bounds)


class ProcLink:
    """Serving: the sockets, the backlog, and what the proc tells its agent."""

    if TYPE_CHECKING:  # the ProcServer's, which this is a part of
        spec: ProcEnv
        key: str
        mesh: str
        rank: int
        generation: int
        host: str
        codec: Codec
        dropped: int
        late: int
        initializing: int
        backlog: int
        backlog_bytes: int
        actors: dict[str, Mailbox]
        relay: RelayServer | None
        sampler: _stats.ProcSampler

        def _on_message(self, frames: list[Any]) -> int | None: ...

    def statistics(self) -> _stats.ProcStatistics:
        """This proc (pid, CPU %, RSS, uptime) and its actors, as a frozen record."""
        cpu, rss, uptime = self.sampler.sample()
        return _stats.ProcStatistics(
            self.mesh, self.rank, self.generation, os.getpid(), time.time(), cpu, rss, uptime,
            self.dropped, self.late, [box.statistics() for box in list(self.actors.values())],
            **(self.relay.counts() if self.relay is not None else {}), **_bounds.counts(self),
            initializing=self.initializing,
        )  # fmt: skip

    def _report_statistics(self) -> None:
        try:
            self.agent.send(self.codec.encode(w.ProcStats(self.statistics(), self.key)))
        except Exception:  # statistics must never stop the heartbeats
            log.exception("cannot report statistics")

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        # Handles passed to our actors call out through this loop.
        _runtime.set_home_loop(loop)
        # A failure an actor of ours does not handle kills that actor alone.
        _faults.kill_owner = functools.partial(_actordeath.kill_owner, self)  # type: ignore[arg-type]
        _loopwatch.start(loop)  # warns when an async endpoint blocks the loop
        ctx: zmq.Context[Any] = zmq.Context.instance()
        # Where our agent tells us: an ipc:// path in its private directory,
        # or tcp://ADDR:* (CURVE and an allow-list when it has keys).
        bind = self.spec.bind
        keys = _security.active()
        gate = None
        if keys is not None and bind.startswith("tcp://"):
            gate = _security.Gate(ctx, keys)
        router = _security.secure_server(configure(ctx.socket(zmq.ROUTER), data=True), keys, bind)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.bind(bind)
        if bind.startswith("ipc://"):
            os.chmod(bind[len("ipc://") :], 0o600)
        self.addr = router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = AsyncSocket(router, loop, self._on_message, router=True, batch=True)
        set_own_proc(
            _runtime.ProcRef(
                self.mesh, self.rank, self.generation, self.addr, self.spec.agent, self.host,
                self.spec.log_path,
            )
        )  # fmt: skip
        agent = _security.secure_client(
            configure(ctx.socket(zmq.DEALER), addr=self.spec.agent), keys, self.spec.agent
        )
        agent.connect(self.spec.agent)
        self.agent = AsyncSocket(agent, loop, None)
        self.agent.send(
            self.codec.encode(
                w.ProcHello(self.mesh, self.rank, self.generation, self.addr, os.getpid(), self.key)
            )
        )
        beat = self.codec.encode(w.ProcHeartbeat(self.mesh, self.rank, self.generation, self.key))
        agent_pid = self.spec.agent_pid
        beats = 0
        while True:
            await asyncio.sleep(PROC_HEARTBEAT_INTERVAL)
            beats += 1
            if beats % STATS_EVERY == 1:
                self._report_statistics()
                if gate is not None:
                    gate.refresh()  # keys added to or removed from authorized/
            if agent_pid and os.getppid() != agent_pid:
                log.error("agent %s is gone; exiting", agent_pid)
                os._exit(70)
            self.agent.send(beat)

    def took(self, nbytes: int = 0) -> None:
        """A call (of ``nbytes``) joins the backlog; past ``MAX_BACKLOG`` calls
        or ``MAX_BACKLOG_BYTES`` bytes reading stops (``zmesh._host.proc.bounds``)."""
        self.backlog += 1
        self.backlog_bytes += nbytes
        if (
            self.backlog >= MAX_BACKLOG or self.backlog_bytes >= _bounds.MAX_BACKLOG_BYTES
        ) and not self.router.paused:
            log.log(
                logging.WARNING if _bounds.first_pause(self) else logging.DEBUG,
                "%d calls (%d bytes) waiting: reading stops until half have started",
                self.backlog, self.backlog_bytes,
            )  # fmt: skip
            self.router.pause()

    def started(self, nbytes: int = 0) -> None:
        """A call leaves the backlog; reading resumes at half of both bounds."""
        self.backlog -= 1
        self.backlog_bytes -= nbytes
        if (
            self.router.paused
            and self.backlog <= MAX_BACKLOG // 2
            and self.backlog_bytes <= _bounds.MAX_BACKLOG_BYTES // 2
        ):
            self.router.resume()
