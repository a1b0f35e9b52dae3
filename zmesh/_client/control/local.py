"""This process as an owner: which agents it uses, its heartbeats, its exit.

* Agents come from ``zmesh.connect([...])``, else ``ZMESH_AGENTS``, else the
  *embedded default*: private agent processes this client starts on loopback
  (one per host asked for) and stops when it exits.
* An owner heartbeat thread tells every agent we use that we are alive; an
  agent that stops hearing it stops our procs after a generous grace
  (``ZMESH_OWNER_GRACE``, 60 s), so a client killed with SIGKILL leaves
  nothing behind. An agent on our machine also watches this process itself
  (a pidfd), so our death is seen there at once, while a long C call that
  holds the GIL (and so stops the thread) is not taken for one.
* At a normal exit (or Ctrl+C) everything we own is stopped at once.
"""

from __future__ import annotations

import atexit
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import msgspec

from zmesh._client.calls import runtime as _runtime
from zmesh._client.control import logforward
from zmesh._client.control.agents import AgentLink
from zmesh._errors import AgentError
from zmesh._shared import liveness as _liveness
from zmesh._shared import ownership as _ownership
from zmesh._shared import paths as _paths
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.boundary import AgentReady, parse_ready_line

OWNER_HEARTBEAT_INTERVAL = 0.5
AGENT_START_TIMEOUT = 30.0

_lock = threading.Lock()
_configured: list[str] | None = None
_embedded: list[tuple[subprocess.Popen[bytes], str]] = []
_used: set[str] = set()
_heart: _OwnerHeart | None = None
_heart_lock = threading.Lock()

_secret = (os.getpid(), secrets.token_hex(16))
# Keys of meshes this process acts for without owning them from its own
# secret: its own proc's mesh (a proc), and meshes it adopted (a restarted
# orchestrator). Every other mesh's key is derived from our secret.
_keys: dict[str, str] = {}
# Grants of meshes handed to us by their owner (zmesh._client.control.grants).
_grants: dict[str, str] = {}


def owner_secret() -> str:
    """What this process proves it owns its meshes with (fork-safe).

    The owner id is public (events and states carry it); this is not: it
    goes only to our agents, with ``CreateOrUpdate``, ``Stop``, ``OwnerGone``
    and our heartbeats, so that no other client can stop what we own.
    """
    global _secret
    if _secret[0] != os.getpid():
        _secret = (os.getpid(), secrets.token_hex(16))
        _keys.clear()
        _grants.clear()
    return _secret[1]


def owner_id() -> str:
    """This process's identity as an owner of meshes (fork-safe).

    Made from our secret (``zmesh._shared.ownership``): an agent accepts it
    only with that secret, so no other client can speak under it.
    """
    return _ownership.owner_id(socket.gethostname(), os.getpid(), owner_secret())


def mesh_proof(mesh: str) -> str:
    """The key that lets us spawn into, or stop actors of, mesh ``mesh``'s procs."""
    secret = owner_secret()  # (first: a fork forgets its parent's keys)
    return _keys.get(mesh) or _grants.get(mesh) or _ownership.mesh_key(secret, mesh)


def mesh_grant(mesh: str) -> str:
    """The grant we may hand on with mesh ``mesh`` (ours, or one handed to us)."""
    return _grants.get(mesh) or _ownership.grant_of(mesh_proof(mesh))


def hold_grant(mesh: str, grant: str) -> None:
    """Spawn into ``mesh`` with ``grant``, handed to us with it, unless we hold
    its key (we own it, or are one of its procs)."""
    secret = owner_secret()
    if mesh in _keys or _ownership.grant_of(_ownership.mesh_key(secret, mesh)) == grant:
        return
    _grants[mesh] = grant


def hold_key(mesh: str, key: str) -> None:
    """Act for ``mesh`` with ``key`` (our proc's own mesh, or one we adopted)."""
    owner_secret()
    _keys[mesh] = key


def configure(addresses: list[str] | None) -> None:
    """Use these agents (``None``: back to ``ZMESH_AGENTS`` or the embedded default)."""
    global _configured
    with _lock:
        _configured = list(addresses) if addresses is not None else None


def configured_agents() -> list[str] | None:
    """Every agent given by ``zmesh.connect``, ``ZMESH_AGENTS`` or ``ZMESH_HOSTFILE``.

    ``None`` means none is configured: the embedded default applies.
    """
    if _configured is not None:
        return list(_configured)
    env = os.environ.get("ZMESH_AGENTS", "").strip()
    if env:
        return [a.strip() for a in env.split(",") if a.strip()]
    hostfile = os.environ.get("ZMESH_HOSTFILE")
    return read_hostfile(hostfile) if hostfile else None


def read_hostfile(path: str) -> list[str]:
    """Agent addresses from a file: one per line; blank lines and ``#`` comments skipped.

    Raises:
        AgentError: the file cannot be read or lists no agent.
    """
    try:
        with open(path) as f:
            lines = [ln.split("#", 1)[0].strip() for ln in f]
    except OSError as exc:
        raise AgentError(f"cannot read the host file {path!r}: {exc}") from exc
    agents = [ln for ln in lines if ln]
    if not agents:
        raise AgentError(f"the host file {path!r} lists no agent")
    return agents


def agents(hosts: int) -> list[str]:
    """Control addresses of at least ``hosts`` agents, starting local ones if need be.

    Raises:
        AgentError: more hosts than configured agents, or a local agent
            failed to start.
    """
    configured = configured_agents()
    if configured is not None:
        if hosts > len(configured):
            raise AgentError(
                f"asked for {hosts} hosts but only {len(configured)} agent(s) are configured "
                f"({', '.join(configured)})"
            )
        return configured[:hosts]
    with _lock:
        for popen, addr in _embedded:
            if popen.poll() is not None:  # died: another takes its place
                logforward.forget(addr)
        _embedded[:] = [(p, a) for p, a in _embedded if p.poll() is None]
        missing = hosts - len(_embedded)
        if missing > 0:
            starting = [_start_agent(len(_embedded) + i) for i in range(missing)]
            for popen, label in starting:
                _embedded.append((popen, _await_ready(popen, label)))
        return [addr for _, addr in _embedded[:hosts]]


def _start_agent(index: int) -> tuple[subprocess.Popen[bytes], str]:
    label = f"local{index}" if index else "local"
    log_dir = _paths.new_run_dir(f"{label}-{os.getpid()}")
    transport = os.environ.get("ZMESH_TRANSPORT", "ipc")
    if transport == "ipc":  # sockets in a directory only this user can enter
        return launch_agent(label, log_dir, parent_pid=os.getpid())
    if transport == "tcp":  # loopback TCP: CURVE, with our keys or throwaway ones
        keys = _embedded_keys()
        return launch_agent(
            label, log_dir, parent_pid=os.getpid(), bind="tcp://127.0.0.1:0", keys=keys
        )
    raise AgentError(f"ZMESH_TRANSPORT must be 'ipc' or 'tcp', not {transport!r}")


_throwaway: str | None = None


def _embedded_keys() -> str:
    """Agents' keys for embedded TCP agents: ours if we hold them, else made for this run."""
    global _throwaway
    keys = _security.active()
    if keys is not None and keys.can_serve:
        return keys.dir
    if _throwaway is None:
        import shutil

        made = _security.throwaway_keys(f"k{os.getpid()}")
        _security.use(made.dir)
        _throwaway = made.dir
        atexit.register(shutil.rmtree, made.dir, True)
    return _throwaway


def launch_agent(
    label: str,
    log_dir: str,
    *,
    parent_pid: int | None = None,
    bind: str | None = None,
    keys: str | None = None,
    insecure: bool = False,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``zmesh agent``; return it and its log path (see ``await_ready``).

    Args:
        label: the agent's host name in meshes and dashboards.
        log_dir: its log directory (created 0700 if missing; it must be ours).
        parent_pid: the agent exits when this process is gone.
        bind: its control address (default: ipc://, private to this user).
        keys: an agents' key directory (needed for a tcp:// ``bind``).
        insecure: allow a tcp:// ``bind`` without keys (loudly).

    Raises:
        SecurityError: ``log_dir`` belongs to another user.
    """

    _paths.private_dir(log_dir, strict=False)
    log_path = os.path.join(log_dir, "agent.log")
    cmd = [sys.executable, "-m", "zmesh", "agent", "--label", label, "--log-dir", log_dir]
    if bind is not None:
        cmd += ["--bind", bind]
    if parent_pid is not None:
        cmd += ["--parent-pid", str(parent_pid)]
    if keys is not None:
        cmd += ["--keys", keys]
    if insecure:
        cmd += ["--insecure"]
    with os.fdopen(_paths.open_private(log_path), "ab") as err:
        popen = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,  # Ctrl+C is the owner's to handle, then it stops us
        )
    return popen, log_path


def await_ready(
    popen: subprocess.Popen[bytes], log_path: str, timeout: float = AGENT_START_TIMEOUT
) -> AgentReady:
    """Wait for a launched agent's ready line; return what it says of itself.

    Raises:
        AgentError: it exited or stayed silent for ``timeout`` (it is killed).
    """
    assert popen.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([popen.stdout], [], [], 0.1)
        if ready:
            line = popen.stdout.readline()
            break
        if popen.poll() is not None:
            break
    popen.stdout.close()
    try:
        info = parse_ready_line(line)
    except msgspec.DecodeError as exc:
        popen.kill()
        popen.wait()
        raise AgentError(f"the agent said what is no ready line: {exc}", log_path=log_path) from exc
    if info is None:
        popen.kill()
        popen.wait()
        raise AgentError("the agent did not start", log_path=log_path)
    return info


def _await_ready(popen: subprocess.Popen[bytes], log_path: str) -> str:
    info = await_ready(popen, log_path)
    _ensure_heart()
    return info.control


def note_used(addr: str) -> None:
    """We own something on ``addr``: heartbeat to it from now on."""
    with _lock:
        new = addr not in _used
        _used.add(addr)
    heart = _ensure_heart()
    if new:
        heart.wake.set()  # beat now: the agent learns at once whom to watch

        logforward.watch(addr, owner_id())  # actors' prints on our stdout


class _OwnerHeart(threading.Thread):
    """Sends ``OwnerHeartbeat`` to every agent we use, from its own thread and sockets.

    A thread, not a task: a client whose loop is busy (or that has no loop)
    must not look dead to its agents.
    """

    def __init__(self) -> None:
        super().__init__(name="zmesh-owner-heartbeat", daemon=True)
        self.stopping = threading.Event()
        self.wake = threading.Event()  # beat now, without waiting for the interval

    def run(self) -> None:
        links: dict[str, AgentLink] = {}
        try:
            while True:
                self.wake.wait(OWNER_HEARTBEAT_INTERVAL)
                self.wake.clear()
                if self.stopping.is_set():
                    return
                machine, pid, start = _liveness.identity()
                beat = w.OwnerHeartbeat(owner_id(), machine, pid, start, owner_secret())
                with _lock:
                    addrs = list(_used)
                for addr in addrs:
                    link = links.get(addr)
                    if link is None:
                        # A backlog of beats means nothing: a full queue drops them.
                        link = links[addr] = AgentLink(addr, sndhwm=4)
                    link.send(beat)
        finally:
            for link in links.values():
                link.close()


def _ensure_heart() -> _OwnerHeart:
    global _heart
    with _heart_lock:  # not _lock: agents() holds that one while it calls us
        if _heart is None or not _heart.is_alive() or _heart.stopping.is_set():
            _heart = _OwnerHeart()
            _heart.start()
        return _heart


def release_all() -> None:
    """Stop everything this process owns: tell agents, stop embedded ones."""

    with _lock:
        used = list(_used)
        _used.clear()
        embedded = list(_embedded)
        _embedded.clear()
    dead = {addr for popen, addr in embedded if popen.poll() is not None}
    for addr in dead:  # no line of theirs can come
        logforward.forget(addr)
    # The actors' last lines, before they stop with their procs (a second
    # Ctrl+C meanwhile skips them: what follows must still run).
    try:
        logforward.flush([addr for addr in used if addr not in dead])
    except BaseException:
        pass
    if _heart is not None:
        _heart.stopping.set()
        _heart.wake.set()
    embedded_addrs = {a for _, a in embedded}
    for addr in used:
        if addr in embedded_addrs:
            continue  # stopping the agent stops its procs
        link = AgentLink(addr)
        link.send(w.OwnerGone(owner_id(), owner_secret()))
        link.close(linger_ms=500)  # bounded: a dead agent must not hang our exit
    for popen, addr in embedded:
        logforward.forget(addr)
        if popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 4.0
    for popen, _ in embedded:
        try:
            popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
    _runtime.shutdown_io_thread()
    _runtime.close_finished()


atexit.register(release_all)
