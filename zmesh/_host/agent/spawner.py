"""How an agent starts a proc: forked by its forkserver, else a fresh interpreter.

A ``Spawner`` takes a ``Launch`` (what the proc is, in its ``ProcEnv``, and
where it logs) and reports the started process through ``on_started``, or
why it could not start through ``on_failed``; both from the agent's loop.
Requests to the forkserver are pipelined (``forkserver.ForkServer``): a
``CreateOrUpdate`` of 64 ranks writes 64 requests at once and returns, and
each proc is adopted as its reply arrives, so the agent's loop never waits
for a fork. Whatever the forkserver cannot fork is started with Popen.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from zmesh._host.agent import forkserver as _forkserver
from zmesh._host.agent import ptree as _ptree
from zmesh._shared import ownership as _ownership
from zmesh._shared import paths as _paths
from zmesh._wire import boundary as b

log = logging.getLogger("zmesh.agent")

Process = subprocess.Popen[bytes] | _forkserver.Child


@dataclass(frozen=True)
class Launch:
    """One proc to start: its spec, and what its environment adds to the agent's."""

    spec: b.ProcEnv
    env: dict[str, str]  # the mesh's own variables
    cwd: str | None

    @property
    def key(self) -> tuple[str, int, int]:
        """``(mesh, rank, generation)``."""
        return self.spec.mesh, self.spec.rank, self.spec.generation


class Spawner:
    """Starts procs for one agent.

    Args:
        on_started: called with each launch and its process.
        on_failed: called with a launch that could not start, and why.
    """

    def __init__(
        self,
        on_started: Callable[[Launch, Process], None],
        on_failed: Callable[[Launch, Exception], None],
    ) -> None:
        self._on_started = on_started
        self._on_failed = on_failed
        self.forkserver: _forkserver.ForkServer | None = None
        self._forking: dict[int, Launch] = {}  # forkserver request id -> launch

    def use(self, forkserver: _forkserver.ForkServer | None) -> None:
        """Fork procs from ``forkserver`` (``None``: start each with Popen)."""
        self.forkserver = forkserver
        if forkserver is not None:
            forkserver.on_fork = self._forked
            forkserver.attach(asyncio.get_running_loop())  # it says when it is warm

    @property
    def pending(self) -> int:
        """Launches asked of the forkserver and not answered yet."""
        return len(self._forking)

    def start(self, launch: Launch) -> None:
        """Start ``launch``; ``on_started`` or ``on_failed`` follows (maybe at once)."""
        env = _environment(launch)
        if self.forkserver is not None:
            rid = self.forkserver.request(launch.spec.log_path, env, launch.cwd)
            if rid is not None:
                self._forking[rid] = launch
                return
        self._popen(launch, env)

    def tick(self, now: float) -> None:
        """Give up on forks past their time (they are started with Popen)."""
        if self.forkserver is not None:
            self.forkserver.check_overdue(now)

    def _forked(self, rid: int, child: _forkserver.Child | None) -> None:
        launch = self._forking.pop(rid, None)
        if launch is None:
            return
        if child is not None:
            self._on_started(launch, child)
            return
        self._popen(launch, _environment(launch))

    def _popen(self, launch: Launch, env: dict[str, str]) -> None:
        key_fd = -1
        try:
            err_path = _paths.stderr_path(launch.spec.log_path)
            key = env.pop(_ownership.MESH_KEY_VAR, "")
            if key:  # on a pipe, not in the environment (see MESH_KEY_FD_VAR)
                key_fd = _key_pipe(key)
                env = {**env, _ownership.MESH_KEY_FD_VAR: str(key_fd)}
            with (
                os.fdopen(_paths.open_private(launch.spec.log_path), "ab") as out,
                os.fdopen(_paths.open_private(err_path), "ab") as err,
            ):
                popen = subprocess.Popen(
                    [sys.executable, "-m", "zmesh._host.proc.procserver"],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=env,
                    start_new_session=True,  # Ctrl+C at the client's terminal is the client's
                    cwd=launch.cwd,
                    pass_fds=(key_fd,) if key_fd >= 0 else (),
                )
        except Exception as exc:  # this rank fails; the others still start
            log.warning("cannot start %s[%d]: %r", launch.spec.mesh, launch.spec.rank, exc)
            self._on_failed(launch, exc)
            return
        finally:
            if key_fd >= 0:
                os.close(key_fd)  # (the child has its own copy)
        self._on_started(launch, popen)


def _key_pipe(key: str) -> int:
    """A pipe's read end holding ``key``, all of it written (a key is far below
    a pipe's buffer) and the write end closed."""
    r, w = os.pipe()
    try:
        os.write(w, key.encode())
    finally:
        os.close(w)
    return r


def _environment(launch: Launch) -> dict[str, str]:
    """The environment of a proc: the agent's, the mesh's, and who it is."""
    env = dict(os.environ)
    env.update(launch.env)
    env[b.PROC_ENV_VAR] = b.encode(launch.spec).decode()  # also says whose its descendants are
    env[_ptree.EPOCH_VAR] = launch.spec.epoch
    return env
