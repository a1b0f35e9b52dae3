"""One agent as the client's controller sees it: its control socket and its stream.

``AgentConn`` follows one agent's event stream with the ZeroMQ "Clone"
pattern: on the welcome message (the subscription is live) and whenever it
sees a gap in sequence numbers or a new agent epoch, it re-reads the agent's
state with ``GetState`` and replays the events buffered meanwhile, handing
each transition to its ``Controller`` (``zmesh._client.control.controller``). While
the agent is lost, it asks it to ``Describe`` itself again and again, so it
sees a restart on the same control address (a new epoch and stream).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from zmesh._client.control.agents import AgentClient
from zmesh._errors import AgentError, AgentTimeoutError, SecurityError
from zmesh._shared.aio import forget_pending
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.codec import Codec
from zmesh._wire.security import secure_client
from zmesh._wire.zsock import AsyncSocket, configure

if TYPE_CHECKING:
    from zmesh._client.calls.runtime import Runtime
    from zmesh._client.control.controller import Controller

log = logging.getLogger("zmesh")

# While an agent is lost, it is asked to Describe itself (to see a restart),
# each time waiting this long for the answer, and this long between answers.
DESCRIBE_TIMEOUT = 2.0
REJOIN_INTERVAL = 0.5


class AgentConn:
    """One agent as this runtime sees it: control requests and its stream."""

    def __init__(self, ctl: Controller, addr: str) -> None:
        self.ctl = ctl
        self.addr = addr
        self.label = addr
        self.epoch = ""
        self.stream = ""
        self.seq = 0
        self.last_heard = time.monotonic()  # its stream
        self.lost = False
        self.judged: set[tuple[str, int]] = set()  # ranks made Unknown for this loss
        self.syncing = False
        self.buffered: list[w.Event] = []
        self.ready = asyncio.Event()  # described and subscribed
        loop = ctl.loop
        self.client = AgentClient(ctl.ctx, addr, loop)  # its control socket
        self.stream_codec = Codec(w.STREAM)
        self.sub: AsyncSocket | None = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self._rejoin_task: asyncio.Task[None] | None = None
        # Meshes we asked this agent to create and have not heard of since:
        # a snapshot that does not know one means the request was lost.
        self.creating: set[str] = set()
        self.task = loop.create_task(self._start())

    async def _start(self) -> None:
        while True:
            try:
                info = await self.request(lambda i: w.Describe(i), timeout=2.0)
                break
            except AgentError:
                if self.ctl.closed:
                    return
                continue  # not up yet, or lost: the watchdog reports it
        self.epoch = info.epoch
        self._subscribe(info)
        self.ready.set()

    def _subscribe(self, info: w.AgentInfo) -> None:
        """Follow the event stream the agent ``info`` describes (a new SUB)."""
        self.label = self.client.label = info.label
        self.stream = info.stream
        self.last_heard = time.monotonic()
        if self.sub is not None:
            self.sub.close()
            self.sub = None
        if self.ctl.closed:
            return  # closed meanwhile: a socket made now would never be closed
        sub = configure(self.ctl.ctx.socket(zmq.SUB), addr=info.stream)
        try:
            secure_client(sub, addr=info.stream)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(info.stream)
            self.syncing = True  # until the welcome, then the snapshot
            self.sub = AsyncSocket(sub, self.ctl.loop, self._on_stream)
        except BaseException:  # closed here, not collected unclosed later
            sub.close(linger=0)
            raise

    def rejoin(self) -> None:
        """The agent is lost: look for it, and for a new incarnation of it."""
        if self._rejoin_task is None or self._rejoin_task.done():
            self._rejoin_task = self.ctl.loop.create_task(self._rejoin())

    async def _rejoin(self) -> None:
        while self.lost and not self.ctl.closed:
            try:
                info = await self.request(lambda i: w.Describe(i), timeout=DESCRIBE_TIMEOUT)
            except AgentError:
                # Gone on its control socket too: the ranks being created there
                # will not be (a spawn waiting for them fails now).
                self.ctl.fates.agent_lost(self, new_too=True)
                continue
            if not self.lost:
                return  # heard again meanwhile
            if info.epoch != self.epoch or info.stream != self.stream:
                # Restarted: its old stream is gone. Listen to the new one; its
                # welcome starts the snapshot, which sees the new epoch.
                log.warning("agent %s restarted (new epoch %s): rejoining", self.label, info.epoch)
                self._subscribe(info)
                return
            # The same agent answers, but its stream is silent: we cannot see
            # its events, so its ranks are Unknown until we can again.
            self.ctl.fates.agent_lost(self, new_too=True)
            await asyncio.sleep(REJOIN_INTERVAL)

    @property
    def last_reply(self) -> float:
        """When its control socket last answered (``time.monotonic()``; 0: never)."""
        return self.client.last_reply

    async def request(self, make: Callable[[int], Any], timeout: float = 5.0) -> Any:
        """Send a control request and wait for its reply.

        Raises:
            AgentTimeoutError: no reply within ``timeout`` (an ``AgentError``).
            SecurityError: the agent refused: we may not do this.
            AgentError: the agent said no.
        """
        msg: Any = None

        def build(req_id: int) -> Any:
            nonlocal msg
            msg = make(req_id)
            if isinstance(msg, w.CreateOrUpdate):
                self.creating.add(msg.name)
            return msg

        try:
            return await self.client.request(build, timeout)
        except AgentTimeoutError:
            raise  # it may have it still: the next snapshot tells
        except (AgentError, SecurityError):
            if isinstance(msg, w.CreateOrUpdate):
                self.creating.discard(msg.name)  # it said no
            raise

    # ------------------------------------------------------------ stream

    def _on_stream(self, frames: list[Any]) -> None:
        try:
            msg = self.stream_codec.decode(frames)
        except Exception:
            return
        self.last_heard = time.monotonic()
        if self.lost:
            self.lost = False
            self.judged.clear()
            log.info("agent %s is reachable again", self.label)
            self._resync()
        if isinstance(msg, w.Heartbeat):
            if msg.seq < 0 or msg.epoch != self.epoch or msg.seq > self.seq:
                # Welcome, a restarted agent, or events we never saw.
                self._resync()
            return
        if self.syncing:
            self.buffered.append(msg)
        elif msg.epoch != self.epoch or msg.seq != self.seq + 1:
            if msg.seq > self.seq:
                self.buffered.append(msg)
                self._resync()
        else:
            self._apply(msg)

    def _apply(self, ev: w.Event) -> None:
        """Apply the next event in sequence."""
        self.seq = ev.seq
        self.creating.discard(ev.mesh)
        self.ctl.apply(self, ev.mesh, ev.state)

    def _resync(self) -> None:
        self.syncing = True
        if not getattr(self, "_resyncing", False):
            self._resyncing = True
            self._snapshot_task = self.ctl.loop.create_task(self._snapshot())

    async def _snapshot(self) -> None:
        try:
            while True:
                # Asked before the GetState goes, on the same socket: the agent
                # handles requests in order, so it must know each of these.
                asked = set(self.creating)
                try:
                    reply = await self.request(lambda i: w.GetState(i), timeout=2.0)
                    break
                except AgentError:
                    if self.ctl.closed:
                        return
        finally:
            self._resyncing = False
        if self.epoch and reply.epoch != self.epoch:
            self.ctl.fates.agent_restarted(self, reply.epoch)
        self.epoch = reply.epoch
        self.seq = reply.seq
        known = {m.name for m in reply.meshes}
        self.creating -= known | asked
        for mesh in reply.meshes:
            for r in mesh.ranks:
                self.ctl.apply(self, mesh.name, r)
        self.ctl.fates.forget_missing(self, known, asked)
        events, self.buffered = self.buffered, []
        self.syncing = False
        for i, ev in enumerate(events):
            if ev.epoch != self.epoch or ev.seq <= self.seq:
                continue  # in the snapshot already, or from another incarnation
            if ev.seq != self.seq + 1:
                # One was lost while we synced: replaying past it would skip
                # it for good (the next heartbeat's seq would match), so read
                # the state again.
                self.buffered = events[i:]
                self._resync()
                return
            self._apply(ev)

    def close(self) -> None:
        cancel_task(self.task)
        if self._snapshot_task is not None:
            cancel_task(self._snapshot_task)
        if self._rejoin_task is not None:
            cancel_task(self._rejoin_task)
        self.client.close()
        if self.sub is not None:
            self.sub.close()


def cancel_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task``; on a loop that has ended it can never run again, so
    asyncio must not complain at exit that it was destroyed while pending."""
    if task.done():
        return
    if task.get_loop().is_closed():
        forget_pending(task)
        coro = task.get_coro()
        if inspect.iscoroutine(coro) and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
            # Made just before its loop ended, never started: closed now, or
            # its collection warns that it "was never awaited".
            coro.close()
    else:
        task.cancel()


async def agent_ready(rt: Runtime, ready: asyncio.Event, addr: str) -> None:
    """Wait until we hear the agent at ``addr``; fail fast if it refuses our key.

    Raises:
        SecurityError: the CURVE handshake failed (the reason says which key).
        AgentError: no answer within 10 s.
    """
    if ready.is_set():
        return
    heard = asyncio.ensure_future(ready.wait())
    waits: set[asyncio.Future[Any]] = {heard}
    probe = None
    if addr.startswith("tcp://"):
        # A refused key (or none, to a keyed agent) is silence to the socket,
        # but a monitor hears it.
        probe = rt.loop.run_in_executor(None, _security.probe, addr, 10.0)
        waits.add(probe)
    deadline = rt.loop.time() + 10.0
    try:
        while not heard.done():
            done, _ = await asyncio.wait(
                waits, timeout=max(0.0, deadline - rt.loop.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )  # fmt: skip
            if not done:
                hint = " and whether your keys match its --keys" if probe is not None else ""
                raise AgentError(
                    f"agent at {addr} did not answer within 10s: check that it runs{hint}",
                    host=addr,
                )
            if probe is not None and probe in done:
                waits.discard(probe)
                if why := probe.result():
                    raise SecurityError(why, host=addr)
    finally:
        heard.cancel()
