"""An agent's proc table: spawning, reaping, judging and stopping its procs.

No sockets here. The agent (``agent.py``) decodes requests and hands them to
a ``ProcTable``, which starts procs, follows each rank through its statuses
(``zmesh._shared.state``) and tells the agent of every transition through
one callback, which the agent publishes as an ``Event``.

* Procs are started by a ``Spawner`` (``spawner.py``) without waiting: a
  rank is Initializing once its process exists, Running at its hello.
* A proc's death is seen by reaping it (``reaper.py``): a pidfd on the loop,
  so at once (or the tick's poll where there is no pidfd). Procs are forked by a warm
  forkserver (``forkserver.py``) and adopted by the agent, so it is their
  parent either way.
* A hung proc is judged on each tick from its missing heartbeats together
  with what the kernel says of it (``zmesh._shared.liveness``), and one
  that never gets ready is a Timeout after ``STARTUP_TIMEOUT``.
* Stopping a proc signals its whole tree at once: SIGTERM, then SIGKILL
  ``STOP_GRACE`` later. What a dead proc leaves behind is swept by
  ``Strays`` (``strays.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from zmesh._host.agent import ptree as _ptree
from zmesh._host.agent.reaper import Reaper
from zmesh._host.agent.spawner import Launch, Process, Spawner
from zmesh._host.agent.strays import STOP_GRACE, Strays
from zmesh._shared import liveness as _liveness
from zmesh._shared import ownership as _ownership
from zmesh._shared import paths as _paths
from zmesh._shared.ownership import same_secret as _same_secret
from zmesh._shared.state import MeshView, Rank, Status
from zmesh._wire import boundary as b
from zmesh._wire import messages as w

log = logging.getLogger("zmesh.agent")

STARTUP_TIMEOUT = float(os.environ.get("ZMESH_STARTUP_TIMEOUT", "120"))

__all__ = ["STOP_GRACE", "Mesh", "Proc", "ProcTable", "spec_error"]


@dataclass
class Proc:
    """One proc of a mesh: one rank in one generation."""

    mesh: str
    rank: int
    generation: int
    popen: Process
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
class Mesh:
    """The procs of one mesh on this host, and the agent's view of its ranks."""

    name: str
    spec: w.ProcSpec
    view: MeshView
    procs: dict[int, Proc] = field(default_factory=dict)
    stopped: bool = False
    failure: str = ""  # why it was stopped, if something broke
    generation: int = 1  # of its spec: one more for each update (and each reuse of its name)
    # Ranks it shrank away from: their last generation, which a regrowth goes on from.
    retired: dict[int, int] = field(default_factory=dict)
    detached: str = ""  # kept past its owner under this name (``detached.py``), if any
    # What its procs accept a spawn or a stop of their actors with (ownership.py):
    # derived from its creator's secret, kept when the mesh is adopted.
    key: str = field(default="", repr=False)


# What the table tells its agent of a rank transition: (mesh, rank, new state).
OnTransition = Callable[[Mesh, int, Rank], None]


class ProcTable:
    """The procs of one agent, by mesh and rank.

    Args:
        label: the host's name (in procs' specs and in errors).
        log_dir: where procs' stdout/stderr files go.
        epoch: the agent's incarnation; every proc carries it.
        on_transition: called with each rank state that changed.
        helpers: the pids of the agent's other children (its janitor), so
            they are not taken for orphans.
    """

    def __init__(
        self,
        label: str,
        log_dir: str,
        epoch: str,
        on_transition: OnTransition,
        helpers: Callable[[], set[int]] = set,
    ) -> None:
        self.label = label
        self.log_dir = log_dir
        self.epoch = epoch
        self.meshes: dict[str, Mesh] = {}
        self.forged = 0  # messages from procs without their mesh's key, ignored
        self._on_transition = on_transition
        self._helpers = helpers
        # Set by the agent once its sockets are bound (see ``configure``).
        self.control_addr = ""
        self._proc_bind = ""  # where procs bind: tcp://host:* or an ipc prefix
        self._keys_dir = ""
        self.spawner = Spawner(self._started, self._failed)
        # Launches not started yet, and the hellos that came before their pid.
        self._starting: dict[tuple[str, int, int], None] = {}
        self._early: dict[tuple[str, int, int], w.ProcHello] = {}
        self.reaper = Reaper(self._exited)
        self._count = 0  # procs started: a number for each one's ipc socket
        self.strays = Strays(epoch, self._proc_alive)

    def configure(self, control_addr: str, proc_bind: str, keys_dir: str) -> None:
        """Say where procs find the agent, where they bind, and the host's keys."""
        self.control_addr = control_addr
        self._proc_bind = proc_bind
        self._keys_dir = keys_dir

    # ------------------------------------------------------------ starting

    def spawn_or_fail(self, mesh: Mesh, rank: int) -> None:
        """Start the next generation of ``rank``, or make it Failed saying why."""
        try:
            self.spawn(mesh, rank)
        except Exception as exc:  # this rank failed; the others still start
            log.warning("cannot start %s[%d]: %r", mesh.name, rank, exc)
            gen = mesh.view.ranks[rank].generation + 1
            self.transition(mesh, rank, Rank(Status.FAILED, gen, reason=f"spawn failed: {exc}"))

    def retire(self, mesh: Mesh, rank: int) -> None:
        """A rank the mesh shrank away from is gone: no longer in its state."""
        last = mesh.view.ranks.pop(rank, None)
        if last is not None:
            mesh.retired[rank] = last.generation
        mesh.procs.pop(rank, None)

    def spawn(self, mesh: Mesh, rank: int) -> None:
        """Start the next generation of ``rank``: Initializing until its hello."""
        gen = mesh.view.ranks[rank].generation + 1
        log_path = os.path.join(self.log_dir, f"{mesh.name}.{rank}.g{gen}.log")
        self._count += 1
        bind = self._proc_bind
        if bind.startswith("ipc://"):
            bind += str(self._count)
        if os.path.dirname(os.path.abspath(log_path)) != os.path.abspath(self.log_dir):
            raise OSError(f"log path {log_path!r} leaves the log directory")  # names forbid it
        spec = b.ProcEnv(
            mesh=mesh.name, rank=rank, generation=gen, dims=mesh.spec.dims,
            agent=self.control_addr, agent_pid=os.getpid(), host=self.label, bind=bind,
            log_path=log_path, main=mesh.spec.main, keys=self._keys_dir, epoch=self.epoch,
        )  # fmt: skip
        env = {**mesh.spec.env, _ownership.MESH_KEY_VAR: mesh.key} if mesh.key else mesh.spec.env
        launch = Launch(spec, env, mesh.spec.main.dir or None)
        self._starting[launch.key] = None
        self.spawner.start(launch)

    def _started(self, launch: Launch, popen: Process) -> None:
        """A launch is a process now: Initializing (or stopping, if its mesh is)."""
        self._starting.pop(launch.key, None)
        hello = self._early.pop(launch.key, None)
        mesh = self.meshes.get(launch.spec.mesh)
        if mesh is None:  # pruned meanwhile: nobody wants it
            _ptree.kill_tree(popen.pid)
            popen.wait()
            return
        spec, now = launch.spec, time.monotonic()
        proc = Proc(mesh.name, spec.rank, spec.generation, popen, spec.log_path, now, now)
        proc.ipc = _paths.ipc_path(spec.bind)
        mesh.procs[spec.rank] = proc
        self.reaper.watch(proc)
        state = Rank(Status.INITIALIZING, spec.generation, pid=popen.pid, log_path=spec.log_path)
        self.transition(mesh, spec.rank, state)
        if mesh.stopped:  # stopped while it was being forked
            self.stop_proc(mesh, spec.rank, proc, mesh.failure, now)
        elif hello is not None:  # it said hello before the forkserver said its pid
            self.hello(hello)

    def _failed(self, launch: Launch, exc: Exception) -> None:
        self._starting.pop(launch.key, None)
        self._early.pop(launch.key, None)
        mesh = self.meshes.get(launch.spec.mesh)
        if mesh is not None:
            state = Rank(Status.FAILED, launch.spec.generation, reason=f"spawn failed: {exc}")
            self.transition(mesh, launch.spec.rank, state)

    def vouched(self, mesh: str, proof: str) -> bool:
        """Whether ``proof`` is the key of ``mesh`` (a message from one of its procs)."""
        m = self.meshes.get(mesh)
        if m is None or not m.key:
            return True  # nothing to check it against (and nothing to change)
        if _same_secret(m.key, proof):
            return True
        self.forged += 1
        if self.forged == 1 or self.forged % 1000 == 0:
            log.warning("ignored %d message(s) for mesh %s without its key", self.forged, mesh)
        return False

    def hello(self, msg: w.ProcHello) -> None:
        """A proc is ready: Running, at the address it gives."""
        if not self.vouched(msg.mesh, msg.proof):  # not to point its callers elsewhere
            return
        proc = self.find(msg.mesh, msg.rank, msg.generation)
        if proc is None:
            key = (msg.mesh, msg.rank, msg.generation)
            if key in self._starting:  # its fork's reply is still on its way
                self._early[key] = msg
            return
        if msg.pid != proc.popen.pid:
            # Not the process we started for this rank: a fork the forkserver
            # finished after we gave up on it and started a fresh one. It
            # must not serve as a second copy of the rank.
            log.warning("ignoring a hello from pid %d for %s[%d]", msg.pid, msg.mesh, msg.rank)
            _stop_stray(msg.pid)
            return
        proc.last_beat = time.monotonic()
        state = Rank(
            Status.RUNNING, msg.generation, pid=msg.pid, addr=msg.addr, log_path=proc.log_path
        )
        self.transition(self.meshes[msg.mesh], msg.rank, state)

    def heartbeat(self, msg: w.ProcHeartbeat) -> None:
        """A proc's loop is alive."""
        proc = self.find(msg.mesh, msg.rank, msg.generation)
        if proc is not None and self.vouched(msg.mesh, msg.proof):
            proc.last_beat = time.monotonic()

    def find(self, mesh: str, rank: int, generation: int) -> Proc | None:
        """The proc of ``mesh[rank]`` in ``generation``, if it is the current one."""
        m = self.meshes.get(mesh)
        proc = m.procs.get(rank) if m is not None else None
        return proc if proc is not None and proc.generation == generation else None

    def transition(self, mesh: Mesh, rank: int, new: Rank) -> None:
        """Apply ``new`` to a rank; tell the agent if its state changed."""
        state = mesh.view.apply(rank, new)
        if state is not None:
            self._on_transition(mesh, rank, state)

    # ------------------------------------------------------------ reaping

    def _exited(self, proc: Proc, reason: str) -> None:
        """``proc`` was reaped (the reaper's ``on_exit``): its rank's new state."""
        code = proc.popen.returncode
        mesh = self.meshes.get(proc.mesh)
        if mesh is None:
            return
        status = Status.STOPPED if proc.stop_at is not None else Status.FAILED
        if proc.fail_reason:
            status, reason = Status.FAILED, f"{proc.fail_reason}; {reason}"
        self.transition(
            mesh,
            proc.rank,
            Rank(status, proc.generation, reason=reason, log_path=proc.log_path, exit_code=code),
        )
        if mesh.procs.get(proc.rank) is proc and not mesh.stopped:  # an update stopped it
            if proc.rank not in mesh.spec.ranks:
                self.retire(mesh, proc.rank)
            elif proc.stop_at is not None:
                self.spawn_or_fail(mesh, proc.rank)  # rolled: its next generation

    def _poll_children(self) -> None:
        self.reaper.poll(p for m in self.meshes.values() for p in m.procs.values())

    # ------------------------------------------------------------ stopping

    def stop(self, mesh: Mesh, failure: str = "") -> None:
        """Stop a mesh's procs: a clean stop, or with ``failure`` a stop forced
        by something broken, which its owner will see as Failed(failure)."""
        mesh.stopped = True
        mesh.failure = failure
        now = time.monotonic()
        for rank, proc in mesh.procs.items():
            self.stop_proc(mesh, rank, proc, failure, now)

    def stop_proc(self, mesh: Mesh, rank: int, proc: Proc, failure: str, now: float) -> None:
        if proc.reaped or proc.stop_at is not None:
            return
        proc.stop_at = now
        proc.fail_reason = failure
        if not failure:
            current = mesh.view.ranks[rank]
            self.transition(mesh, rank, replace(current, status=Status.STOPPING, reason=""))
        # Its descendants, and its daemons we adopted, get their SIGTERM now
        # too (as a cgroup's would); what is left when it exits is swept.
        owner = (proc.mesh, proc.rank, proc.generation)
        for pid in _ptree.descendants(proc.popen.pid) + self.strays.daemons_of(owner):
            _ptree.signal_tree(pid, signal.SIGTERM)
        _signal(proc, signal.SIGTERM)

    async def shutdown(self) -> None:
        """Stop every proc and everything below them, and reap them all."""
        for mesh in self.meshes.values():
            self.stop(mesh)
        deadline = time.monotonic() + STOP_GRACE + 1.0
        while time.monotonic() < deadline and (self.alive() or self.strays.pending):
            now = time.monotonic()
            self.spawner.tick(now)
            self._poll_children()
            self._sweep(now)
            await asyncio.sleep(0.02)
        for mesh in self.meshes.values():
            for proc in mesh.procs.values():
                if not proc.reaped:
                    _ptree.kill_tree(proc.popen.pid)
                    proc.popen.wait()
                    self.reaper.reaped(proc)
        # Whatever is left below us has had its SIGTERM and its grace.
        self.strays.kill_all(self._ours)

    def alive(self) -> bool:
        """Whether any proc is being started or is not reaped yet."""
        procs = (p for m in self.meshes.values() for p in m.procs.values())
        return bool(self._starting) or any(not p.reaped for p in procs)

    # ------------------------------------------------------------ the tick

    def tick(self, now: float) -> None:
        """Reap, sweep strays, and judge every live proc: hung, late, or past its grace."""
        self.spawner.tick(now)
        self._poll_children()
        self._sweep(now)
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
        _prune(self.meshes)

    def _hung(self, mesh: Mesh, proc: Proc, reason: str) -> None:
        # Timeout is frozen for this generation; kill the proc so that a
        # SIGCONT cannot bring a declared-dead generation back.
        self.transition(
            mesh,
            proc.rank,
            Rank(Status.TIMEOUT, proc.generation, reason=reason, log_path=proc.log_path),
        )
        _signal(proc, signal.SIGKILL)

    def _sweep(self, now: float) -> None:
        # A proc forked and not reported yet is our child already, and not
        # ours to tell from an orphan (its environment is the forkserver's):
        # strays wait until every fork in flight is answered.
        if not self.spawner.pending:
            self.strays.sweep(now, self._ours())

    def _ours(self) -> set[int]:
        """Our children that are live procs or helpers: no strays."""
        ours = {p.popen.pid for m in self.meshes.values() for p in m.procs.values() if not p.reaped}
        if self.spawner.forkserver is not None:
            self.spawner.forkserver.check()  # reaps it if it died
            ours.add(self.spawner.forkserver.pid)
        return ours | self._helpers()

    def _proc_alive(self, mesh: object, rank: object, generation: object) -> bool:
        m = self.meshes.get(mesh) if isinstance(mesh, str) else None
        proc = m.procs.get(rank) if m is not None and isinstance(rank, int) else None
        return proc is not None and proc.generation == generation and not proc.reaped


def _prune(meshes: dict[str, Mesh]) -> None:
    # Keep stopped meshes for a while so late GetState calls can explain them.
    if len(meshes) < 256:
        return
    for name, mesh in list(meshes.items()):
        if mesh.stopped and not any(not p.reaped for p in mesh.procs.values()):
            del meshes[name]
            if len(meshes) < 128:
                return


def spec_error(spec: w.ProcSpec) -> str:
    """What is wrong with a spec that decoded (types and ranges are checked
    at decode; this is what relates its fields), or ``""``."""
    if len(set(spec.ranks)) != len(spec.ranks):
        return "a rank is given twice in `ranks`"
    size = math.prod(spec.dims.values())
    if max(spec.ranks) >= size:
        return f"rank {max(spec.ranks)} is outside the dims {spec.dims} ({size} ranks)"
    return ""


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


def signal_proc(proc: Proc, sig: int) -> None:
    """Send ``sig`` to one proc (not its tree); a proc already gone is no error."""
    try:
        proc.popen.send_signal(sig)
    except ProcessLookupError:
        pass


_signal = signal_proc
