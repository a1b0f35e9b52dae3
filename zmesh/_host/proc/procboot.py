"""A proc's start, before it serves: what ``proc.main()`` does first.

``boot()`` reads the proc's spec from ``ZMESH_PROC``, asks Linux to kill the
proc with its agent (``PR_SET_PDEATHSIG``), sets up logging and stack dumps
(first, so even a hang while importing the user's code can be shown), the
keys and the default agent of meshes the proc's actors spawn, and the
client's ``sys.path``; then it freezes what is loaded for the collector.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys

from zmesh._client.control import controller as _controller
from zmesh._client.control import local as _local
from zmesh._host.proc import stacks as _stacks
from zmesh._shared.ownership import MESH_KEY_FD_VAR, MESH_KEY_VAR
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.boundary import PROC_ENV_VAR, ProcEnv, decode_proc_env


def boot() -> ProcEnv:
    """Set this process up as the proc its spec describes; the spec."""
    spec = decode_proc_env(os.environ[PROC_ENV_VAR])
    _die_with_parent()
    if spec.agent_pid and os.getppid() != spec.agent_pid:
        os._exit(70)  # the agent died before prctl took effect
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {spec.mesh}[{spec.rank}] %(levelname)s %(message)s",
    )

    try:  # first, so that even a hang while importing the user's code can be shown
        _stacks.install(spec.log_path)  # SIGUSR1 dumps every thread's stack (zmesh stack)
    except OSError as exc:
        logging.warning("no stack dumps for this proc: %s", exc)

    _controller.ESCALATE_UNHANDLED = True  # an unhandled child failure fails this proc
    # The agent's keys are this host's keys. The procs of an ipc agent bind
    # no TCP, so they keep the keys their owner passed on, for its TCP peers.
    inherited = os.environ.get("ZMESH_KEYS") if spec.bind.startswith("ipc://") else None
    _security.use(spec.keys or inherited or None)
    if not os.environ.get("ZMESH_AGENTS"):
        # Meshes spawned by an actor go to this proc's own agent by default,
        # never to a private embedded agent of the proc.

        _local.configure([spec.agent])
    _hold_mesh_key(spec.mesh)
    _use_client_path(spec.main)
    # What is loaded now lives as long as the proc: keep the collector off it.
    gc.freeze()
    return spec


def _hold_mesh_key(mesh: str) -> None:
    """Keep our mesh's key (``zmesh._shared.ownership``) out of our environment.

    Our actors act for the mesh with it (they may spawn into its procs and
    stop their actors); the processes they start do not inherit it.
    """

    key = os.environ.pop(MESH_KEY_VAR, "")
    fd = os.environ.pop(MESH_KEY_FD_VAR, "")
    if fd:  # a fresh interpreter: the key came on a pipe (zmesh._host.agent.spawner)
        with os.fdopen(int(fd), "rb") as pipe:
            key = pipe.read().decode()
    if key:
        _local.hold_key(mesh, key)


def _use_client_path(main: w.MainSpec) -> None:
    """Import the user's modules as the client does: its ``sys.path``.

    (The agent starts the proc in the client's working directory.) The
    client's script itself is not re-run: its classes come by value.
    """
    if main.sys_path:
        sys.path[:] = main.sys_path


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL us when the agent dies, so a proc is never orphaned."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
