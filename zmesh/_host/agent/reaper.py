"""Seeing an agent's procs exit: a pidfd on the loop for each (a poll where there is none).

The proc table (``procs.py``) hands each proc it started to its ``Reaper``;
when the proc exits, the reaper reaps it (so no zombie is left), removes
the socket file a killed proc leaves behind, and tells the table how it
ended ("exited with code 1", "killed by SIGKILL"), once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zmesh._host.agent.proctable import Proc


class Reaper:
    """Reaps procs as they exit, and tells ``on_exit(proc, reason)`` of each once."""

    def __init__(self, on_exit: Callable[[Proc, str], None]) -> None:
        self._on_exit = on_exit
        self._by_pidfd: dict[int, Proc] = {}

    def watch(self, proc: Proc) -> None:
        """Follow ``proc``: its exit is seen at once where the kernel has pidfds."""
        try:
            proc.pidfd = os.pidfd_open(proc.popen.pid)
            self._by_pidfd[proc.pidfd] = proc
            asyncio.get_running_loop().add_reader(proc.pidfd, self._on_pidfd, proc.pidfd)
        except (AttributeError, OSError):
            proc.pidfd = None  # no pidfd here: the ticker polls instead

    def _on_pidfd(self, fd: int) -> None:
        proc = self._by_pidfd.pop(fd, None)
        asyncio.get_running_loop().remove_reader(fd)
        os.close(fd)
        if proc is not None:
            proc.popen.wait()
            self.reaped(proc)

    def poll(self, procs: Iterable[Proc]) -> None:
        """Reap those of ``procs`` that exited (the tick's look, for procs with no pidfd)."""
        for proc in procs:
            if not proc.reaped and proc.popen.poll() is not None:
                if proc.pidfd is not None:
                    self._on_pidfd(proc.pidfd)
                else:
                    self.reaped(proc)

    def reaped(self, proc: Proc) -> None:
        """``proc`` was waited for: say how it ended (once)."""
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
        self._on_exit(proc, reason)
