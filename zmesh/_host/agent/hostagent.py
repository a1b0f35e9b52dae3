"""The host agent: spawns, watches and reaps the procs of its host.

One agent per host. It is the controller of the meshes on its host (the
"meshes are resources" design): ``CreateOrUpdate`` starts procs and returns at
once, ``GetState`` answers at once from the agent's view, and every rank
transition is published on the agent's event stream with a per-agent
sequence number, next to a heartbeat every ~100 ms.

Liveness comes from three places (docs/supervision.md has every number):

* a proc's death is seen by reaping it (a pidfd on the loop, so at once);
  procs are forked by a warm forkserver (``forkserver.py``) and adopted by
  the agent, so it is their parent either way;
* a hung proc is seen by its missing application heartbeats (ZMTP heartbeats
  are answered by libzmq's I/O thread, so they say nothing of Python's loop),
  but only together with what the kernel says of it (``zmesh._shared.liveness``): a
  stopped proc is hung at once, one that computes with the GIL held is busy,
  and only one that shows no progress at all for a while is hung;
* a lost owner is seen by its pidfd when it runs on this machine (at once),
  else by its missing owner heartbeats: its procs are stopped after a
  generous grace, so nothing is ever orphaned and a busy owner is not
  taken for a dead one.

Everything a proc starts goes with it: stopping a proc signals its whole
tree, and what a dead proc leaves behind is swept (``strays.py``). For the
agent's own death, its janitor (``janitor.py``) kills whatever carries its
epoch.

This module is the protocol shell: sockets, requests and replies, events,
stats. The proc table (spawn, reap, hung, stop) is ``procs.py``; the owners
and their liveness are ``owners.py``; the read-only requests (state, stacks,
logs, stats, health) are answered by ``agentops.py``, the ones that change
meshes (create or update, stop) by ``meshorders.py``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import zmq

from zmesh._errors import AgentError, SecurityError
from zmesh._host.agent import agentops as _agentops
from zmesh._host.agent import detached as _detached
from zmesh._host.agent import forkserver as _forkserver
from zmesh._host.agent import janitor as _janitor
from zmesh._host.agent import logtail as _logtail
from zmesh._host.agent import meshorders as _orders
from zmesh._host.agent import ptree as _ptree
from zmesh._host.agent.owners import Owners, not_owner
from zmesh._host.agent.proctable import Mesh, ProcTable
from zmesh._host.agent.statsbook import StatsBook
from zmesh._shared import paths as _paths
from zmesh._shared.state import OWNER_GONE, Rank
from zmesh._wire import messages as w
from zmesh._wire.boundary import AgentReady
from zmesh._wire.codec import Codec, explain, request_of
from zmesh._wire.security import Gate, Keys, secure_server
from zmesh._wire.zsock import AsyncSocket, configure

log = logging.getLogger("zmesh.agent")

HEARTBEAT_INTERVAL = 0.1
STATS_EVERY = 10  # ticks: a Stats message about once a second


def default_log_dir(label: str) -> str:
    """Where an agent labelled ``label`` logs by default: ``log_root()/label``.

    Raises:
        SecurityError: the log root is not private to this user.
    """
    return os.path.join(_paths.log_root(), label)


class HostAgent:
    """The agent of one host. Run it with ``zmesh agent`` or ``HostAgent(...).run()``.

    Args:
        bind: the control address: ``ipc://`` (the default) for sockets in a
            directory private to this user, or ``tcp://ADDR:PORT`` (port 0:
            any), which needs ``keys`` or ``insecure``. The event and stats
            streams and the procs' sockets bind on the same transport.
        label: the host's name in meshes and dashboards.
        log_dir: where procs' stdout/stderr files go.
        parent_pid: for an embedded agent: exit when this process is gone.
        epoch: this incarnation's id (default: a new one).
        forkserver: a forkserver started for ``epoch`` already
            (``zmesh._host.agent.forklaunch``); default: one is started as it serves.
    """

    def __init__(
        self,
        bind: str = "ipc://",
        *,
        label: str | None = None,
        log_dir: str | None = None,
        parent_pid: int | None = None,
        keys: Keys | None = None,
        insecure: bool = False,
        epoch: str | None = None,
        forkserver: _forkserver.ForkServer | None = None,
    ) -> None:
        _check_bind(bind, keys, insecure, label)
        self.keys = keys
        self.bind = bind
        self.label = label or socket.gethostname()
        self._default_log_dir = not log_dir
        self.log_dir = log_dir or default_log_dir(self.label)
        self.parent_pid = parent_pid
        self.epoch = epoch or secrets.token_hex(6)
        self._forkserver = forkserver  # started already (ForkServer.prestart), or None
        self.seq = 0
        self._janitor: _janitor.Janitor | None = None
        self.procs = ProcTable(self.label, self.log_dir, self.epoch, self._published, self._helpers)
        self.owners = Owners()
        self.detached = _detached.DetachedBook()  # names kept past their owner (zmesh.lookup)
        self.dropped = 0
        self.control_addr = ""
        self.stream_addr = ""
        self.stats_addr = ""  # a stream of its own: supervision clients never pay for it
        self.stopping = asyncio.Event()
        self.statsbook = StatsBook()
        self._ticks = 0
        self._gate: Gate | None = None  # the ZAP handler of a keyed TCP agent
        self._socket_dir = ""  # an ipc agent's private directory of sockets
        self._proc_bind = ""  # where procs bind: tcp://host:* or an ipc prefix
        self.logs = _logtail.LogTail(self.procs.meshes, self.label)  # zmesh logs; forwarded prints

    # ------------------------------------------------------------ serving

    def run(self, ready: Callable[[AgentReady], None] | None = None) -> None:
        """Serve until SIGTERM/SIGINT or the parent is gone."""
        if os.environ.get("ZMESH_AGENT_COUNT"):
            with open(os.environ["ZMESH_AGENT_COUNT"], "a") as f:
                f.write(os.environ.get("PYTEST_CURRENT_TEST", "?") + "\n")
        asyncio.run(self.serve(ready))

    async def serve(self, ready: Callable[[AgentReady], None] | None = None) -> None:
        """Serve until stopped; call ``ready`` once every socket is bound."""
        loop = asyncio.get_running_loop()
        # Orphans below us come to us, and everything we start carries our epoch.
        _forkserver.become_subreaper()
        os.environ[_ptree.EPOCH_VAR] = self.epoch
        # First, so that its imports overlap with ours and the first spawn.
        self.procs.spawner.use(self._forkserver or _forkserver.ForkServer.start(self.epoch))
        self._janitor = _janitor.Janitor(self.epoch)
        # Its own default must be private; a directory the user named must be theirs.
        _paths.private_dir(self.log_dir, strict=self._default_log_dir)
        ctx: zmq.Context[Any] = zmq.Context.instance()
        control, stream, stats, self._proc_bind, self._socket_dir = _addresses(self.bind)
        if self.keys is not None and control.startswith("tcp://"):
            self._gate = Gate(ctx, self.keys)
        ctrl = secure_server(configure(ctx.socket(zmq.ROUTER), addr=control), self.keys, control)
        ctrl.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.control_addr = _bind(ctrl, control)
        self.procs.configure(
            self.control_addr, self._proc_bind, self.keys.dir if self.keys is not None else ""
        )
        pub = secure_server(configure(ctx.socket(zmq.XPUB), addr=stream), self.keys, stream)
        # The welcome tells a new subscriber that its subscription is live,
        # so it can take a snapshot without missing the events after it.
        welcome = w.Heartbeat(seq=-1, epoch=self.epoch, agent=self.label, time=0.0)
        pub.setsockopt(zmq.XPUB_WELCOME_MSG, Codec(w.STREAM).encode(welcome)[0])
        self.stream_addr = _bind(pub, stream)
        self._codec = Codec(w.AGENT_INBOX)
        self._ctrl = AsyncSocket(ctrl, loop, self._on_control, router=True)
        self._pub = AsyncSocket(pub, loop, None)  # subscriptions are read and ignored
        stats_pub = secure_server(configure(ctx.socket(zmq.PUB), addr=stats), self.keys, stats)
        self.stats_addr = _bind(stats_pub, stats)
        self._stats_pub = AsyncSocket(stats_pub, loop, None)
        self.logs.bind(ctx, loop, self.keys, stream)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        log.info("agent %s control=%s stream=%s", self.label, self.control_addr, self.stream_addr)
        if ready is not None:
            ready(self.ready_info())
        ticker = asyncio.ensure_future(self._tick_forever())
        try:
            await self.stopping.wait()
        finally:
            ticker.cancel()
            await self.procs.shutdown()
            if self.procs.spawner.forkserver is not None:
                self.procs.spawner.forkserver.close()
            if self._janitor is not None:  # all clear: it needs one look only
                self._janitor.close()
            self._ctrl.close()
            self._pub.close()
            self._stats_pub.close()
            self.logs.close()
            if self._gate is not None:
                self._gate.stop()
            if self._socket_dir:  # every socket file of ours and of our procs
                shutil.rmtree(self._socket_dir, ignore_errors=True)

    def ready_info(self) -> AgentReady:
        """What this agent says of itself once it serves (``zmesh agent``'s ready line)."""
        return AgentReady(
            label=self.label, control=self.control_addr, stream=self.stream_addr,
            epoch=self.epoch, pid=os.getpid(), log_dir=self.log_dir,
        )  # fmt: skip

    def stop(self) -> None:
        """Ask the agent to stop its procs and exit."""
        self.stopping.set()

    # --------------------------------------------------------- requests

    def _on_control(self, frames: list[Any]) -> None:
        if len(frames) < 2:
            self._drop("short message")
            return
        ident = frames[0]
        try:
            msg = self._codec.decode(frames[1:])
        except Exception as exc:  # bad input must never kill the agent
            self._drop(f"undecodable message: {exc!r}")
            req = request_of(frames[1], w.AGENT_REQUESTS)
            if req is not None:  # a request: its sender learns why, and waits for nothing
                self.reply(ident, w.Ack(req[1], ok=False, error=explain(req[0], exc)))
            return
        try:
            self._handle(ident, msg)
        except Exception as exc:  # a handler bug must not stop this socket's reader
            log.exception("handling %s failed", type(msg).__name__)
            req_id = getattr(msg, "id", None)
            if isinstance(req_id, int):
                error = f"{type(msg).__name__} failed on {self.label}: {exc!r}"
                self.reply(ident, w.Ack(req_id, ok=False, error=error))

    def _handle(self, ident: bytes, msg: Any) -> None:
        if isinstance(msg, w.ProcHeartbeat):
            self.procs.heartbeat(msg)
        elif isinstance(msg, w.OwnerHeartbeat):
            # A forged heartbeat must not keep a dead owner's procs alive.
            if self.owners.is_owner(msg.owner, msg.secret):
                self.owners.beat(msg)
        elif isinstance(msg, w.ProcHello):
            self.procs.hello(msg)
        elif isinstance(msg, w.CreateOrUpdate):
            self.reply(ident, _orders.create_or_update(self.procs, self.owners, self.label, msg))
        elif isinstance(msg, w.Stop):
            operator = getattr(self, "operator_secret", "")  # `zmesh stop`, as this agent's user
            self.reply(ident, _orders.stop(self.procs, self.owners, self.label, operator, msg))
        elif isinstance(msg, w.OwnerGone):
            if self.owners.is_owner(msg.owner, msg.secret):
                self._stop_owner(msg.owner, "owner exited")
            else:
                log.warning("refused an OwnerGone for %s from another client", msg.owner)
                error = not_owner(msg.owner, "say that it exited")
                self.reply(ident, w.Ack(0, ok=False, denied=True, error=error))
        elif isinstance(msg, w.ProcStats):
            st = msg.stats
            proc = self.procs.find(st.mesh, st.rank, st.generation)
            if proc is not None and not proc.reaped and self.procs.vouched(st.mesh, msg.proof):
                self.statsbook.record_proc(st)
        elif isinstance(msg, w.ServiceReport):
            self.statsbook.record_service(msg.summary)
            _detached.reported(self, msg)  # a detached service's table is kept
        elif isinstance(msg, _detached.REQUESTS):
            _detached.answer(self, ident, msg)  # detach, lookup, stop a detached name
        elif isinstance(msg, _agentops.REQUESTS):
            _agentops.answer(self, ident, msg)  # state, describe, stats, logs, health, stack

    def stats(self) -> w.Stats:
        """This agent's host, meshes and procs' latest statistics (``zmesh top``)."""
        meshes = self.procs.meshes.values()
        live = [(m.name, r) for m in meshes for r, p in m.procs.items() if not p.reaped]
        procs, services = self.statsbook.current(live)
        return w.Stats(
            agent=self.label, epoch=self.epoch, seq=self.seq, time=time.time(),
            interval=HEARTBEAT_INTERVAL * STATS_EVERY, host=self.statsbook.host(),
            control=self.control_addr, meshes=[_agentops.mesh_report(m) for m in meshes],
            procs=procs, services=services,
        )  # fmt: skip

    def _drop(self, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 1000 == 0:
            log.warning("dropped %d malformed message(s); latest: %s", self.dropped, why)

    def reply(self, ident: bytes, msg: Any) -> None:
        """Answer the client (or proc) ``ident`` on the control socket."""
        self._ctrl.send([ident, *self._codec.encode(msg)])

    # ------------------------------------------------------- transitions

    def _published(self, mesh: Mesh, rank: int, state: Rank) -> None:
        """Publish a rank transition the proc table made (its ``on_transition``)."""
        self.seq += 1
        event = w.Event(
            self.seq, self.epoch, self.label, mesh.name, mesh.spec.owner,
            state=_agentops.rank_report(rank, state), time=time.time(),
        )  # fmt: skip
        self._pub.send(self._codec.encode(event))
        if mesh.detached:  # a detached service's orchestrator is restarted
            _detached.transition(self, mesh, rank, state)
        if state.status.failure:
            log.warning(
                "mesh %s rank %d %s: %s (log: %s)",
                mesh.name, rank, state.status.value, state.reason, state.log_path,
            )  # fmt: skip

    # ------------------------------------------------------------ stopping

    def _stop_owner(self, owner: str, why: str, failure: bool = False) -> None:
        self.owners.forget(owner)
        for mesh in list(self.procs.meshes.values()):
            if mesh.spec.owner == owner and not mesh.stopped and not mesh.detached:
                log.info("stopping mesh %s: %s", mesh.name, why)
                self.procs.stop(mesh, why if failure else "")

    # ------------------------------------------------------------ the tick

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL)
            try:
                self._tick()
            except Exception:  # the tick must keep going whatever one pass hit
                log.exception("agent tick failed")

    def _tick(self) -> None:
        now = time.monotonic()
        self._ticks += 1
        if self._ticks % STATS_EVERY == 0:
            self.statsbook.sample_host()
            self._stats_pub.send(self._codec.encode(self.stats()))
        beat = w.Heartbeat(seq=self.seq, epoch=self.epoch, agent=self.label, time=time.time())
        self._pub.send(self._codec.encode(beat))
        self.procs.tick(now)
        self.logs.tick()
        if self._gate is not None:
            self._gate.refresh()  # keys added to or removed from authorized/
        for owner, why in self.owners.due(now):
            self._stop_owner(owner, f"{OWNER_GONE}: {why}", failure=True)
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            log.info("parent %d is gone; stopping", self.parent_pid)
            self.stopping.set()

    def _helpers(self) -> set[int]:
        """Children of ours that are no procs and no orphans: the janitor."""
        return self._janitor.pids() if self._janitor is not None else set()


def _check_bind(bind: str, keys: Keys | None, insecure: bool, label: str | None) -> None:
    """Refuse an address an agent must not serve on.

    Raises:
        SecurityError: neither ipc:// nor tcp://, or TCP without keys and
            without ``insecure``, or keys that a server cannot use.
    """
    if not bind.startswith(("ipc://", "tcp://")):
        raise SecurityError(f"cannot bind {bind!r}: use ipc:// or tcp://ADDR:PORT", host=label)
    if bind.startswith("tcp://") and keys is None and not insecure:
        # Loopback too: every local user can connect to 127.0.0.1.
        raise SecurityError(
            f"refusing to bind {bind}: an agent runs code for whoever reaches it, so a "
            "TCP address needs CURVE keys (zmesh keygen DIR; --keys DIR), "
            "or --insecure said out loud",
            host=label,
        )
    if keys is not None:
        keys.check_server()


def _addresses(bind: str) -> tuple[str, str, str, str, str]:
    """Where the control socket and the two streams bind, where procs bind
    and the directory of ipc sockets (``""``: none) of an agent bound at ``bind``.

    On ipc:// everything goes in a fresh directory private to this user
    (``_paths.agent_socket_dir``), with short names: a Unix socket path
    must fit in 108 bytes.
    """
    if bind.startswith("tcp://"):
        host = _bind_host(bind)
        return bind, f"tcp://{host}:0", f"tcp://{host}:0", f"tcp://{host}:*", ""
    socket_dir = _paths.agent_socket_dir()
    control = bind if bind != "ipc://" else f"ipc://{socket_dir}/c"
    # A socket is as private as the directory it is in.
    _paths.check_private(os.path.dirname(_paths.ipc_path(control)))
    proc_bind = f"ipc://{socket_dir}/p"  # + a number per proc
    return control, f"ipc://{socket_dir}/e", f"ipc://{socket_dir}/s", proc_bind, socket_dir


def _bind_host(addr: str) -> str:
    """``tcp://10.0.0.1:5555`` -> ``10.0.0.1``."""
    return addr.split("://", 1)[1].rsplit(":", 1)[0]


def _bind(sock: zmq.Socket, addr: str) -> str:
    """Bind ``sock`` to ``addr``; the address it got.

    Raises:
        AgentError: the address is taken or cannot be bound here.
    """
    if addr.startswith("tcp://") and addr.endswith(":0"):
        addr = addr[:-2] + ":*"
    try:
        sock.bind(addr)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        hint = (
            ": another program (or another agent) listens there; choose another port, "
            "or tcp://HOST:0 for a free one"
            if exc.errno == zmq.EADDRINUSE
            else ""
        )
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise AgentError(f"cannot bind {addr} ({why}){hint}") from exc
    path = _paths.ipc_path(addr)
    if path:  # the directory keeps others out; the file's mode says so too
        os.chmod(path, 0o600)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)
