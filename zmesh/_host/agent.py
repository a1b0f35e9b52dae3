"""The host agent: spawns, watches and reaps the procs of its host.

One agent per host. It is the controller of the meshes on its host (the
"meshes are resources" design): ``CreateOrUpdate`` starts procs and returns at
once, ``GetState`` answers at once from the agent's view, and every rank
transition is published on the agent's event stream with a per-agent
sequence number, next to a heartbeat every ~100 ms.

Liveness comes from three places (docs/supervision.md has every number):

* a proc's death is seen by reaping it (a pidfd on the loop, so at once);
  procs are forked by a warm forkserver (``_forkserver.py``) and adopted by
  the agent, so it is their parent either way;
* a hung proc is seen by its missing application heartbeats (ZMTP heartbeats
  are answered by libzmq's I/O thread, so they say nothing of Python's loop),
  but only together with what the kernel says of it (``_liveness``): a
  stopped proc is hung at once, one that computes with the GIL held is busy,
  and only one that shows no progress at all for a while is hung;
* a lost owner is seen by its pidfd when it runs on this machine (at once),
  else by its missing owner heartbeats: its procs are stopped after a
  generous grace, so nothing is ever orphaned and a busy owner is not
  taken for a dead one.

Everything a proc starts goes with it. The agent is a child subreaper, so a
process whose parent dies below it is handed to the agent, not to init:
each tick it looks at its children, and one that is no proc of its own is
an orphan. An orphan whose environment names a proc that still runs (a
daemon the proc started) stays while that proc does; any other gets SIGTERM
with everything below it, then SIGKILL ``STOP_GRACE`` later (``_sweep``).
Stopping a proc signals its whole tree at once. For the agent's own death,
its janitor (``janitor.py``) kills whatever carries its epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import zmq

from zmesh._errors import SecurityError
from zmesh._host import forkserver as _forkserver
from zmesh._host import janitor as _janitor
from zmesh._host import ptree as _ptree
from zmesh._host import stacks as _stacks
from zmesh._shared import liveness as _liveness
from zmesh._shared import paths as _paths
from zmesh._shared import stats as _stats
from zmesh._shared.state import MeshView, Rank, Status
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec, explain, request_of
from zmesh._wire.security import Gate, Keys, secure_server
from zmesh._wire.zsock import AsyncSocket, configure

log = logging.getLogger("zmesh.agent")

HEARTBEAT_INTERVAL = 0.1
STATS_EVERY = 10  # ticks: a Stats message about once a second
# An owner silent this long loses its procs. Generous (as Monarch's 60 s): an
# owner in a long C call holds the GIL and cannot beat. A local owner's death
# is seen at once by its pidfd; the grace is for owners on other machines.
OWNER_GRACE = float(os.environ.get("ZMESH_OWNER_GRACE", "60"))
STARTUP_TIMEOUT = float(os.environ.get("ZMESH_STARTUP_TIMEOUT", "120"))
STOP_GRACE = 1.5  # SIGTERM, then SIGKILL after this long


@dataclass
class _Proc:
    mesh: str
    rank: int
    generation: int
    popen: subprocess.Popen[bytes] | _forkserver.Child
    log_path: str
    started: float
    last_beat: float
    pidfd: int | None = None
    stop_at: float | None = None  # when a stop was requested
    fail_reason: str = ""  # stopped because something broke (its owner went silent)
    reaped: bool = False
    liveness: _liveness.ProcLiveness = field(default_factory=_liveness.ProcLiveness)
    ipc: str = ""  # the path of its socket, if it binds ipc://


@dataclass
class _Orphan:
    """A process a dead proc left behind, being stopped."""

    start: int | None  # its start time: the pid may be reused once it is gone
    kill_at: float  # SIGTERM went out; SIGKILL then
    killed: bool = False


@dataclass
class _Mesh:
    name: str
    spec: w.ProcSpec
    view: MeshView
    procs: dict[int, _Proc] = field(default_factory=dict)
    stopped: bool = False


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
    ) -> None:
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
        self.keys = keys
        self.bind = bind
        self.label = label or socket.gethostname()
        self._default_log_dir = not log_dir
        self.log_dir = log_dir or default_log_dir(self.label)
        self.parent_pid = parent_pid
        self.epoch = secrets.token_hex(6)
        self.seq = 0
        self.meshes: dict[str, _Mesh] = {}
        self.owners: dict[str, float] = {}  # owner -> when it was last heard
        # Owners on this machine, watched by pidfd (None: cannot be watched);
        # and those whose process exited, to be stopped on the next tick.
        self._owner_fds: dict[str, int | None] = {}
        self._owners_dead: dict[str, str] = {}
        # Each owner's secret, bound by its first CreateOrUpdate (never published).
        self._proofs: dict[str, str] = {}
        self.dropped = 0
        self.control_addr = ""
        self.stream_addr = ""
        self.stats_addr = ""  # a stream of its own: supervision clients never pay for it
        self._stopping = asyncio.Event()
        self._by_pidfd: dict[int, _Proc] = {}
        # The latest statistics of each running proc, by (mesh, rank).
        self.proc_stats: dict[tuple[str, int], _stats.ProcStatistics] = {}
        # Services' replica tables, as their orchestrators report them.
        self.services: dict[str, tuple[_stats.ServiceSummary, float]] = {}
        self._host_sampler = _stats.HostSampler()
        self._host_stats: _stats.HostStatistics | None = None
        self._ticks = 0
        self._forkserver: _forkserver.ForkServer | None = None
        self._gate: Gate | None = None  # the ZAP handler of a keyed TCP agent
        self._socket_dir = ""  # an ipc agent's private directory of sockets
        self._proc_bind = ""  # where procs bind: tcp://host:* or an ipc prefix
        self._procs_started = 0
        self._janitor: tuple[subprocess.Popen[bytes], int] | None = None
        # Children that are no procs: orphans being stopped, and daemons of
        # live procs (pid -> start time and the (mesh, rank, generation) they name).
        self._orphans: dict[int, _Orphan] = {}
        self._daemons: dict[int, tuple[int | None, tuple[Any, Any, Any]]] = {}

    # ------------------------------------------------------------ serving

    def run(self, ready: Any = None) -> None:
        """Serve until SIGTERM/SIGINT or the parent is gone."""
        asyncio.run(self.serve(ready))

    async def serve(self, ready: Any = None) -> None:
        loop = asyncio.get_running_loop()
        # Orphans below us come to us, and everything we start carries our epoch.
        _forkserver.become_subreaper()
        os.environ[_ptree.EPOCH_VAR] = self.epoch
        # First, so that its imports overlap with ours and the first spawn.
        self._forkserver = _forkserver.ForkServer.start()
        self._janitor = _janitor.start(self.epoch)
        # Its own default must be private; a directory the user named must be theirs.
        _paths.private_dir(self.log_dir, strict=self._default_log_dir)
        ctx: zmq.Context[Any] = zmq.Context.instance()
        control, stream, stats = self._addresses()
        if self.keys is not None and control.startswith("tcp://"):
            self._gate = Gate(ctx, self.keys)
        ctrl = secure_server(configure(ctx.socket(zmq.ROUTER)), self.keys, control)
        ctrl.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.control_addr = _bind(ctrl, control)
        pub = secure_server(configure(ctx.socket(zmq.XPUB)), self.keys, stream)
        # The welcome tells a new subscriber that its subscription is live,
        # so it can take a snapshot without missing the events after it.
        welcome = w.Heartbeat(seq=-1, epoch=self.epoch, agent=self.label, time=0.0)
        pub.setsockopt(zmq.XPUB_WELCOME_MSG, Codec(w.STREAM).encode(welcome)[0])
        self.stream_addr = _bind(pub, stream)
        self._codec = Codec(w.AGENT_INBOX)
        self._ctrl = AsyncSocket(ctrl, loop, self._on_control, router=True)
        self._pub = AsyncSocket(pub, loop, None)  # subscriptions are read and ignored
        stats_pub = secure_server(configure(ctx.socket(zmq.PUB)), self.keys, stats)
        self.stats_addr = _bind(stats_pub, stats)
        self._stats_pub = AsyncSocket(stats_pub, loop, None)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        log.info("agent %s control=%s stream=%s", self.label, self.control_addr, self.stream_addr)
        if ready is not None:
            ready(self.info_dict())
        ticker = asyncio.ensure_future(self._tick_forever())
        try:
            await self._stopping.wait()
        finally:
            ticker.cancel()
            await self._shutdown()
            if self._forkserver is not None:
                self._forkserver.close()
            if self._janitor is not None:  # all clear: it needs one look only
                os.write(self._janitor[1], _janitor.CLEAN)
                os.close(self._janitor[1])
            self._ctrl.close()
            self._pub.close()
            self._stats_pub.close()
            if self._gate is not None:
                self._gate.stop()
            if self._socket_dir:  # every socket file of ours and of our procs
                shutil.rmtree(self._socket_dir, ignore_errors=True)

    def _addresses(self) -> tuple[str, str, str]:
        """Where the control socket and the two streams bind; set where procs bind.

        On ipc:// everything goes in a fresh directory private to this user
        (``_paths.agent_socket_dir``), with short names: a Unix socket path
        must fit in 108 bytes.
        """
        if self.bind.startswith("tcp://"):
            host = _bind_host(self.bind)
            self._proc_bind = f"tcp://{host}:*"
            return self.bind, f"tcp://{host}:0", f"tcp://{host}:0"
        self._socket_dir = _paths.agent_socket_dir()
        control = self.bind if self.bind != "ipc://" else f"ipc://{self._socket_dir}/c"
        # A socket is as private as the directory it is in.
        _paths.check_private(os.path.dirname(_paths.ipc_path(control)))
        self._proc_bind = f"ipc://{self._socket_dir}/p"  # + a number per proc
        return control, f"ipc://{self._socket_dir}/e", f"ipc://{self._socket_dir}/s"

    def info_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "control": self.control_addr,
            "stream": self.stream_addr,
            "epoch": self.epoch,
            "pid": os.getpid(),
            "log_dir": self.log_dir,
        }

    def stop(self) -> None:
        """Ask the agent to stop its procs and exit."""
        self._stopping.set()

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
                self._reply(ident, w.Ack(req[1], ok=False, error=explain(req[0], exc)))
            return
        try:
            self._handle(ident, msg)
        except Exception as exc:  # a handler bug must not stop this socket's reader
            log.exception("handling %s failed", type(msg).__name__)
            req_id = getattr(msg, "id", None)
            if isinstance(req_id, int):
                error = f"{type(msg).__name__} failed on {self.label}: {exc!r}"
                self._reply(ident, w.Ack(req_id, ok=False, error=error))

    def _handle(self, ident: bytes, msg: Any) -> None:
        if isinstance(msg, w.ProcHeartbeat):
            self._on_proc_heartbeat(msg)
        elif isinstance(msg, w.OwnerHeartbeat):
            # Before its first CreateOrUpdate an owner has no proof to check.
            if msg.owner not in self._proofs or self._is_owner(msg.owner, msg.secret):
                self._on_owner_heartbeat(msg)
        elif isinstance(msg, w.ProcHello):
            self._on_hello(msg)
        elif isinstance(msg, w.CreateOrUpdate):
            self._reply(ident, self._create(msg))
        elif isinstance(msg, w.GetState | w.ListMeshes):
            name = getattr(msg, "name", "")
            self._reply(ident, self._state_reply(msg.id, name))
        elif isinstance(msg, w.Stop):
            self._reply(ident, self._stop_mesh(msg.id, msg.name, msg.secret))
        elif isinstance(msg, w.Describe):
            info = self.info_dict()
            self._reply(
                ident,
                w.AgentInfo(
                    id=msg.id,
                    label=self.label,
                    control=self.control_addr,
                    stream=self.stream_addr,
                    epoch=self.epoch,
                    pid=info["pid"],
                    hostname=socket.gethostname(),
                ),
            )
        elif isinstance(msg, w.OwnerGone):
            if self._is_owner(msg.owner, msg.secret):
                self._stop_owner(msg.owner, "owner exited")
            elif msg.owner in self._proofs:
                log.warning("refused an OwnerGone for %s from another client", msg.owner)
                self._reply(ident, w.Ack(0, ok=False, denied=True, error=_not_owner(msg.owner)))
        elif isinstance(msg, w.ProcStats):
            st = msg.stats
            mesh = self.meshes.get(st.mesh)
            proc = mesh.procs.get(st.rank) if mesh else None
            if proc is not None and proc.generation == st.generation and not proc.reaped:
                self.proc_stats[(st.mesh, st.rank)] = st
        elif isinstance(msg, w.ServiceReport):
            self.services[msg.summary.name] = (msg.summary, time.monotonic())
        elif isinstance(msg, w.GetStats):
            self._reply(ident, w.StatsReply(msg.id, self.stats(), self.stats_addr))
        elif isinstance(msg, w.GetStack | w.GetHealth):
            self._on_ops_request(ident, msg)

    def stats(self) -> w.Stats:
        """This agent's host, meshes and procs' latest statistics (``zmesh top``)."""
        if self._host_stats is None:
            self._host_stats = self._host_sampler.sample(socket.gethostname())
        live = {
            (m.name, r) for m in self.meshes.values() for r, p in m.procs.items() if not p.reaped
        }
        for key in [k for k in self.proc_stats if k not in live]:
            del self.proc_stats[key]  # the proc is gone: its numbers are history
        now = time.monotonic()
        for name in [n for n, (_, seen) in self.services.items() if now - seen > 5.0]:
            del self.services[name]  # its orchestrator stopped reporting
        return w.Stats(
            agent=self.label, epoch=self.epoch, seq=self.seq, time=time.time(),
            interval=HEARTBEAT_INTERVAL * STATS_EVERY, host=self._host_stats,
            control=self.control_addr,
            meshes=[self._mesh_state(m) for m in self.meshes.values()],
            procs=list(self.proc_stats.values()),
            services=[s for s, _ in self.services.values()],
        )  # fmt: skip

    def _drop(self, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 1000 == 0:
            log.warning("dropped %d malformed message(s); latest: %s", self.dropped, why)

    def _reply(self, ident: bytes, msg: Any) -> None:
        self._ctrl.send([ident, *self._codec.encode(msg)])

    def _is_owner(self, owner: str, secret: str) -> bool:
        """Whether ``secret`` is the one ``owner`` created its first mesh here with."""
        known = self._proofs.get(owner)
        return known is not None and hmac.compare_digest(known, secret)

    def _create(self, msg: w.CreateOrUpdate) -> w.Ack:
        # The first CreateOrUpdate of an owner binds its id to its secret;
        # from then on only that secret may stop, or speak for, the owner.
        if not msg.secret:
            return w.Ack(msg.id, ok=False, denied=True, error="CreateOrUpdate needs a secret")
        known = self._proofs.setdefault(msg.spec.owner, msg.secret)
        if not hmac.compare_digest(known, msg.secret):
            return w.Ack(msg.id, ok=False, denied=True, error=_not_owner(msg.spec.owner))
        existing = self.meshes.get(msg.name)
        if existing is not None and not existing.stopped:
            if existing.spec == msg.spec:
                return w.Ack(msg.id)  # idempotent
            return w.Ack(msg.id, ok=False, error=f"mesh {msg.name!r} exists with another spec")
        error = _spec_error(msg.spec)
        if error:
            return w.Ack(msg.id, ok=False, error=f"bad CreateOrUpdate of {msg.name!r}: {error}")
        mesh = _Mesh(msg.name, msg.spec, MeshView(msg.name, msg.spec.ranks))
        self.meshes[msg.name] = mesh
        self.owners.setdefault(msg.spec.owner, time.monotonic())
        for rank in msg.spec.ranks:
            try:
                self._spawn(mesh, rank)
            except Exception as exc:  # this rank failed; the others still start
                log.warning("cannot start %s[%d]: %r", msg.name, rank, exc)
                self._transition(mesh, rank, Rank(Status.FAILED, 1, reason=f"spawn failed: {exc}"))
        return w.Ack(msg.id)

    def _spawn(self, mesh: _Mesh, rank: int) -> None:
        gen = mesh.view.ranks[rank].generation + 1
        log_path = os.path.join(self.log_dir, f"{mesh.name}.{rank}.g{gen}.log")
        self._procs_started += 1
        bind = self._proc_bind
        if bind.startswith("ipc://"):
            bind += str(self._procs_started)
        if os.path.dirname(os.path.abspath(log_path)) != os.path.abspath(self.log_dir):
            raise OSError(f"log path {log_path!r} leaves the log directory")  # names forbid it
        spec = {
            "mesh": mesh.name,
            "rank": rank,
            "generation": gen,
            "dims": mesh.spec.dims,
            "agent": self.control_addr,
            "agent_pid": os.getpid(),
            "host": self.label,
            "bind": bind,
            "log_path": log_path,
            "main": msgspec.to_builtins(mesh.spec.main),
            "keys": self.keys.dir if self.keys is not None else "",
            "epoch": self.epoch,
        }
        env = dict(os.environ)
        env.update(mesh.spec.env)
        env["ZMESH_PROC"] = json.dumps(spec)  # also says whose the proc's descendants are
        env[_ptree.EPOCH_VAR] = self.epoch
        cwd = mesh.spec.main.dir or None
        popen: subprocess.Popen[bytes] | _forkserver.Child | None = None
        if self._forkserver is not None:
            popen = self._forkserver.spawn(log_path, env, cwd)
        if popen is None:
            with os.fdopen(_paths.open_private(log_path), "ab") as out:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "zmesh._host.proc"],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # Ctrl+C at the client's terminal is the client's
                    cwd=cwd,
                )
        now = time.monotonic()
        proc = _Proc(mesh.name, rank, gen, popen, log_path, now, now, ipc=_paths.ipc_path(bind))
        mesh.procs[rank] = proc
        try:
            proc.pidfd = os.pidfd_open(popen.pid)
            self._by_pidfd[proc.pidfd] = proc
            asyncio.get_running_loop().add_reader(proc.pidfd, self._on_pidfd, proc.pidfd)
        except (AttributeError, OSError):
            proc.pidfd = None  # no pidfd here: the ticker polls instead
        self._transition(
            mesh,
            rank,
            Rank(Status.INITIALIZING, gen, pid=popen.pid, log_path=log_path),
        )

    def _on_hello(self, msg: w.ProcHello) -> None:
        mesh = self.meshes.get(msg.mesh)
        proc = mesh.procs.get(msg.rank) if mesh else None
        if mesh is None or proc is None or proc.generation != msg.generation:
            return
        if msg.pid != proc.popen.pid:
            # Not the process we started for this rank: a fork the forkserver
            # finished after we gave up on it and started a fresh one. It
            # must not serve as a second copy of the rank.
            log.warning("ignoring a hello from pid %d for %s[%d]", msg.pid, msg.mesh, msg.rank)
            _stop_stray(msg.pid)
            return
        proc.last_beat = time.monotonic()
        self._transition(
            mesh,
            msg.rank,
            Rank(
                Status.RUNNING, msg.generation, pid=msg.pid, addr=msg.addr, log_path=proc.log_path
            ),
        )

    def _on_proc_heartbeat(self, msg: w.ProcHeartbeat) -> None:
        mesh = self.meshes.get(msg.mesh)
        proc = mesh.procs.get(msg.rank) if mesh else None
        if proc is not None and proc.generation == msg.generation:
            proc.last_beat = time.monotonic()

    def _on_owner_heartbeat(self, msg: w.OwnerHeartbeat) -> None:
        self.owners[msg.owner] = time.monotonic()
        if msg.owner in self._owner_fds or msg.owner in self._owners_dead:
            return
        fd = None
        # Only the pid its owner id names (hostname:pid:token): a heartbeat
        # cannot tie someone else's meshes to a process it chose.
        if _liveness.owner_pid(msg.owner) == msg.pid:
            fd = _liveness.watch_owner(msg.machine, msg.pid, msg.start)
        self._owner_fds[msg.owner] = fd
        if fd is not None:
            asyncio.get_running_loop().add_reader(fd, self._on_owner_exit, msg.owner, msg.pid)

    def _on_owner_exit(self, owner: str, pid: int) -> None:
        # Stopped on the next tick, not now: an owner that exits normally
        # sends OwnerGone first, and that clean stop should win the race.
        self._unwatch_owner(owner)
        self._owners_dead[owner] = f"owner {owner} exited (pid {pid} is gone)"

    def _unwatch_owner(self, owner: str) -> None:
        fd = self._owner_fds.pop(owner, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def _state_reply(self, req_id: int, name: str) -> w.StateReply:
        if name:
            meshes = [self.meshes[name]] if name in self.meshes else []
        else:
            meshes = list(self.meshes.values())
        return w.StateReply(
            id=req_id, agent=self.label, epoch=self.epoch, seq=self.seq,
            meshes=[self._mesh_state(m) for m in meshes],
        )  # fmt: skip

    def _mesh_state(self, mesh: _Mesh) -> w.MeshState:
        return w.MeshState(
            name=mesh.name,
            owner=mesh.spec.owner,
            status=mesh.view.status.value,
            ranks=[_rank_state(r, s) for r, s in sorted(mesh.view.ranks.items())],
            dims=mesh.spec.dims,
        )

    # ------------------------------------------------------- transitions

    def _transition(self, mesh: _Mesh, rank: int, new: Rank) -> None:
        state = mesh.view.apply(rank, new)
        if state is None:
            return
        self.seq += 1
        event = w.Event(
            seq=self.seq,
            epoch=self.epoch,
            agent=self.label,
            mesh=mesh.name,
            owner=mesh.spec.owner,
            state=_rank_state(rank, state),
            time=time.time(),
        )
        self._pub.send(self._codec.encode(event))
        if state.status.failure:
            log.warning(
                "mesh %s rank %d %s: %s (log: %s)",
                mesh.name, rank, state.status.value, state.reason, state.log_path,
            )  # fmt: skip

    def _on_pidfd(self, fd: int) -> None:
        proc = self._by_pidfd.pop(fd, None)
        asyncio.get_running_loop().remove_reader(fd)
        os.close(fd)
        if proc is not None:
            proc.popen.wait()
            self._reaped(proc)

    def _reaped(self, proc: _Proc) -> None:
        if proc.reaped:
            return
        proc.reaped = True
        if proc.ipc:  # a proc that was killed leaves its socket file behind
            with contextlib.suppress(OSError):
                os.unlink(proc.ipc)
        code = proc.popen.returncode
        if code is not None and code < 0:
            try:
                reason = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                reason = f"killed by signal {-code}"
        else:
            reason = f"exited with code {code}"
        mesh = self.meshes.get(proc.mesh)
        if mesh is None:
            return
        status = Status.STOPPED if proc.stop_at is not None else Status.FAILED
        if proc.fail_reason:
            status, reason = Status.FAILED, f"{proc.fail_reason}; {reason}"
        self._transition(
            mesh,
            proc.rank,
            Rank(status, proc.generation, reason=reason, log_path=proc.log_path, exit_code=code),
        )

    # ------------------------------------------------------------ stopping

    def _stop_mesh(self, req_id: int, name: str, secret: str = "") -> w.Ack:
        mesh = self.meshes.get(name)
        if mesh is None:
            return w.Ack(req_id, ok=False, error=f"no mesh named {name!r} on {self.label}")
        if not self._is_owner(mesh.spec.owner, secret):
            log.warning("refused a Stop of mesh %s from a client that does not own it", name)
            error = f"mesh {name!r} on {self.label}: {_not_owner(mesh.spec.owner)}"
            return w.Ack(req_id, ok=False, denied=True, error=error)
        self._stop(mesh)
        return w.Ack(req_id)

    def _stop(self, mesh: _Mesh, failure: str = "") -> None:
        """Stop a mesh's procs: a clean stop, or with ``failure`` a stop forced
        by something broken, which its owner will see as Failed(failure)."""
        mesh.stopped = True
        now = time.monotonic()
        for rank, proc in mesh.procs.items():
            if proc.reaped or proc.stop_at is not None:
                continue
            proc.stop_at = now
            proc.fail_reason = failure
            if not failure:
                current = mesh.view.ranks[rank]
                self._transition(mesh, rank, replace(current, status=Status.STOPPING, reason=""))
            # Its descendants, and its daemons we adopted, get their SIGTERM now
            # too (as a cgroup's would); what is left when it exits is swept.
            for pid in _ptree.descendants(proc.popen.pid) + self._daemons_of(proc):
                _ptree.signal_tree(pid, signal.SIGTERM)
            _signal(proc, signal.SIGTERM)

    def _stop_owner(self, owner: str, why: str, failure: bool = False) -> None:
        self.owners.pop(owner, None)
        self._unwatch_owner(owner)
        self._owners_dead.pop(owner, None)
        for mesh in list(self.meshes.values()):
            if mesh.spec.owner == owner and not mesh.stopped:
                log.info("stopping mesh %s: %s", mesh.name, why)
                self._stop(mesh, why if failure else "")

    async def _shutdown(self) -> None:
        for mesh in self.meshes.values():
            self._stop(mesh)
        deadline = time.monotonic() + STOP_GRACE + 1.0
        while time.monotonic() < deadline and (self._alive() or self._orphans):
            now = time.monotonic()
            self._poll_children(now)
            self._sweep(now)
            await asyncio.sleep(0.02)
        for mesh in self.meshes.values():
            for proc in mesh.procs.values():
                if not proc.reaped:
                    _ptree.kill_tree(proc.popen.pid)
                    proc.popen.wait()
                    self._reaped(proc)
        # Whatever is left below us has had its SIGTERM and its grace.
        for _ in range(10):
            left = self._strays()
            if not left:
                break
            for pid in left:
                _ptree.kill_tree(pid)
            time.sleep(0.01)
            self._reap_strays(left)

    def _alive(self) -> bool:
        return any(not p.reaped for m in self.meshes.values() for p in m.procs.values())

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
            self._host_stats = self._host_sampler.sample(socket.gethostname())
            self._stats_pub.send(self._codec.encode(self.stats()))
        self._pub.send(
            self._codec.encode(
                w.Heartbeat(seq=self.seq, epoch=self.epoch, agent=self.label, time=time.time())
            )
        )
        self._poll_children(now)
        self._sweep(now)
        if self._gate is not None:
            self._gate.refresh()  # keys added to or removed from authorized/
        for mesh in self.meshes.values():
            for rank, proc in mesh.procs.items():
                if proc.reaped:
                    continue
                status = mesh.view.ranks[rank].status
                if proc.stop_at is not None:
                    if now - proc.stop_at > STOP_GRACE:
                        _signal(proc, signal.SIGKILL)
                elif status == Status.RUNNING:
                    look = functools.partial(_liveness.sample, proc.popen.pid)
                    why = proc.liveness.judge(now, proc.last_beat, look)
                    if why is not None:
                        self._hung(mesh, proc, why)
                elif status == Status.INITIALIZING and now - proc.started > STARTUP_TIMEOUT:
                    self._hung(mesh, proc, f"not ready after {STARTUP_TIMEOUT:.0f}s")
        for owner, why in list(self._owners_dead.items()):
            self._stop_owner(owner, f"stopped by its agent: {why}", failure=True)
        for owner, seen in list(self.owners.items()):
            if now - seen > OWNER_GRACE:
                self._stop_owner(
                    owner, f"stopped by its agent: owner {owner} silent for {now - seen:.1f}s",
                    failure=True,
                )  # fmt: skip
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            log.info("parent %d is gone; stopping", self.parent_pid)
            self._stopping.set()
        self._prune(now)

    def _hung(self, mesh: _Mesh, proc: _Proc, reason: str) -> None:
        # Timeout is frozen for this generation; kill the proc so that a
        # SIGCONT cannot bring a declared-dead generation back.
        self._transition(
            mesh,
            proc.rank,
            Rank(Status.TIMEOUT, proc.generation, reason=reason, log_path=proc.log_path),
        )
        _signal(proc, signal.SIGKILL)

    def _poll_children(self, now: float) -> None:
        for mesh in self.meshes.values():
            for proc in mesh.procs.values():
                if not proc.reaped and proc.popen.poll() is not None:
                    if proc.pidfd is not None:
                        self._on_pidfd(proc.pidfd)
                    else:
                        self._reaped(proc)

    def _helpers(self) -> set[int]:
        """Children of ours that are no procs and no orphans: forkserver, janitor."""
        pids = set()
        if self._forkserver is not None:
            self._forkserver.check()  # reaps it if it died
            pids.add(self._forkserver.pid)
        if self._janitor is not None:
            if self._janitor[0].poll() is not None:  # someone killed it: a new one
                log.warning("janitor exited with %s; starting another", self._janitor[0].returncode)
                os.close(self._janitor[1])
                self._janitor = _janitor.start(self.epoch)
            if self._janitor is not None:
                pids.add(self._janitor[0].pid)
        return pids

    def _strays(self) -> list[int]:
        """Our children that are neither a live proc nor a helper."""
        ours = {p.popen.pid for m in self.meshes.values() for p in m.procs.values() if not p.reaped}
        ours |= self._helpers()
        return [pid for pid in _ptree.children(os.getpid()) if pid not in ours]

    def _sweep(self, now: float) -> None:
        """Stop what dead procs left behind, and reap it (see the module docstring).

        A child of ours that is no proc was handed to us (we are a subreaper)
        when its parent died. If its environment names a proc that runs, it
        is that proc's daemon and stays; otherwise it is an orphan: SIGTERM
        to its tree now, SIGKILL ``STOP_GRACE`` later.
        """
        strays = self._strays()
        for pid in strays:
            if _ptree.is_zombie(pid):
                continue  # exited: reaped below
            start = _ptree.start_time(pid)
            orphan = self._orphans.get(pid)
            if orphan is not None and orphan.start == start:
                if now >= orphan.kill_at and not orphan.killed:
                    orphan.killed = True
                    _ptree.kill_tree(pid)
                continue
            daemon = self._daemons.get(pid)
            if daemon is None or daemon[0] != start:
                spec = _ptree.tag(pid) or {}
                mine = spec.get("epoch") == self.epoch
                owner = (spec.get("mesh"), spec.get("rank"), spec.get("generation"))
                daemon = self._daemons[pid] = (start, owner if mine else (None, None, None))
            if self._proc_alive(*daemon[1]):
                continue
            del self._daemons[pid]
            log.info("stopping pid %d, left behind by proc %s", pid, daemon[1])
            _ptree.signal_tree(pid, signal.SIGTERM)
            self._orphans[pid] = _Orphan(start, now + STOP_GRACE)
        self._reap_strays(strays)

    def _reap_strays(self, strays: list[int]) -> None:
        for pid in strays:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._orphans.pop(pid, None)
                self._daemons.pop(pid, None)
        gone = set(strays)
        for table in (self._orphans, self._daemons):
            for pid in [p for p in table if p not in gone]:
                del table[pid]  # no child of ours any more

    def _proc_alive(self, mesh: Any, rank: Any, generation: Any) -> bool:
        m = self.meshes.get(mesh) if isinstance(mesh, str) else None
        proc = m.procs.get(rank) if m is not None and isinstance(rank, int) else None
        return proc is not None and proc.generation == generation and not proc.reaped

    def _daemons_of(self, proc: _Proc) -> list[int]:
        owner = (proc.mesh, proc.rank, proc.generation)
        return [pid for pid, (_, o) in self._daemons.items() if o == owner]

    def _prune(self, now: float) -> None:
        # Keep stopped meshes for a while so late GetState calls can explain them.
        if len(self.meshes) < 256:
            return
        for name, mesh in list(self.meshes.items()):
            if mesh.stopped and not any(not p.reaped for p in mesh.procs.values()):
                del self.meshes[name]
                if len(self.meshes) < 128:
                    return

    # ------------------------------------------------------- operations

    def _on_ops_request(self, ident: bytes, msg: w.GetStack | w.GetHealth) -> None:
        """``zmesh status`` and ``zmesh stack``: answered without blocking the loop."""
        if isinstance(msg, w.GetHealth):
            stopped = [m.name for m in self.meshes.values() if m.stopped]
            self._reply(ident, w.HealthReply(msg.id, stopped))
            return
        mesh = self.meshes.get(msg.mesh)
        proc = mesh.procs.get(msg.rank) if mesh is not None else None
        where = f"{msg.mesh}[{msg.rank}] on {self.label}"
        if mesh is None or proc is None:
            error = f"no mesh named {msg.mesh!r} on {self.label}" if mesh is None else (
                f"no rank {msg.rank} in mesh {msg.mesh!r} on {self.label}"
            )  # fmt: skip
            self._reply(ident, w.StackReply(msg.id, ok=False, error=error))
            return
        status = mesh.view.ranks[msg.rank].status
        if proc.reaped or status.terminal:
            error = f"{where} is {status.value}: no live proc (log: {proc.log_path})"
            self._reply(ident, w.StackReply(msg.id, ok=False, error=error))
            return
        # A stack file older than the proc is a stale one: its proc cannot
        # have registered the handler yet, so it must not be signalled.
        started = time.time() - (time.monotonic() - proc.started)
        pid = proc.popen.pid

        async def answer() -> None:
            path = _stacks.stack_path(proc.log_path)
            try:
                text, cut = await _stacks.dump(
                    path, lambda: _signal(proc, _stacks.SIGNAL), not_before=started
                )
                reply = w.StackReply(msg.id, text=text, pid=pid, truncated=cut)
            except _stacks.StackUnavailable as exc:
                error = f"{where} (pid {pid}): {exc} (log: {proc.log_path})"
                reply = w.StackReply(msg.id, ok=False, error=error, pid=pid)
            if not self._stopping.is_set():
                self._reply(ident, reply)

        _stacks.background(answer())


def _spec_error(spec: w.ProcSpec) -> str:
    """What is wrong with a spec that decoded (types and ranges are checked
    at decode; this is what relates its fields), or ``""``."""
    if len(set(spec.ranks)) != len(spec.ranks):
        return "a rank is given twice in `ranks`"
    size = math.prod(spec.dims.values())
    if max(spec.ranks) >= size:
        return f"rank {max(spec.ranks)} is outside the dims {spec.dims} ({size} ranks)"
    return ""


def _rank_state(rank: int, s: Rank) -> w.RankState:
    return w.RankState(
        rank=rank,
        status=s.status.value,
        generation=s.generation,
        reason=s.reason,
        pid=s.pid,
        addr=s.addr,
        log_path=s.log_path,
        exit_code=s.exit_code,
    )


def _not_owner(owner: str) -> str:
    return f"not the owner: only {owner}, which created it, may stop it"


def _stop_stray(pid: int) -> None:
    """SIGKILL ``pid`` if it is this agent's own child (never anyone else's)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return
    if ppid == os.getpid():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _signal(proc: _Proc, sig: int) -> None:
    try:
        proc.popen.send_signal(sig)
    except ProcessLookupError:
        pass


def _bind_host(addr: str) -> str:
    """``tcp://10.0.0.1:5555`` -> ``10.0.0.1``."""
    return addr.split("://", 1)[1].rsplit(":", 1)[0]


def _bind(sock: zmq.Socket, addr: str) -> str:
    if addr.startswith("tcp://") and addr.endswith(":0"):
        addr = addr[:-2] + ":*"
    sock.bind(addr)
    path = _paths.ipc_path(addr)
    if path:  # the directory keeps others out; the file's mode says so too
        os.chmod(path, 0o600)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)
