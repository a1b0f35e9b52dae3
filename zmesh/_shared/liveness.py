"""Liveness judgements, with no sockets in them: busy or hung, here or not.

An application heartbeat needs the GIL: a process in one long C call (a
``sum`` over a big range, a numpy kernel that keeps the GIL) sends none, yet
it is alive and will answer. So silence alone is never taken for death.
What does not need the GIL is the kernel's view of a process, which a host
agent can read for any process on its machine:

* that it exists (a pidfd, which the agent polls with its loop: an exit or a
  signal is seen at once);
* whether it is stopped (``/proc/<pid>/stat`` state ``T``/``t``: SIGSTOP, a
  debugger): a stopped process makes no progress, so it is hung at once;
* whether it uses CPU (``utime + stime`` of all its threads): a silent
  process that computes is busy, not hung.

``ProcLiveness`` turns heartbeats and those samples into a verdict: plain
code that tests drive with made-up times and samples. ``watch_owner``
opens a pidfd on an owner when its heartbeat comes from a process the agent
can watch that way (same boot, same pid namespace, same process), so an
owner's death is seen at once instead of after the heartbeat grace.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

# Heartbeats this late make the agent look at /proc (procs beat every 0.2 s).
SUSPECT_AFTER = 0.3
# Whether a silent proc computes is judged over windows this long, and it
# counts as busy if it used at least this share of one CPU in the window.
CPU_WINDOW = 1.0
MIN_CPU_SHARE = 0.05
# A proc that shows no progress at all (no heartbeat, no CPU) this long is hung.
HANG_TIMEOUT = float(os.environ.get("ZMESH_PROC_HANG_TIMEOUT", "10"))

_STOPPED = frozenset("Tt")  # stopped by a signal, stopped by a tracer
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcSample:
    """What the kernel says of a process at one moment.

    Attributes:
        state: the ``/proc/<pid>/stat`` state letter (``R``, ``S``, ``D``, ``T``, ...).
        cpu: CPU seconds used so far, by all its threads.
        start: when it started, in clock ticks after boot (tells a reused pid apart).
    """

    state: str
    cpu: float
    start: int


def sample(pid: int) -> ProcSample | None:
    """Read ``/proc/<pid>/stat``; ``None`` if there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        # The command name may hold spaces and parentheses: split after the last ')'.
        fields = raw.rsplit(b")", 1)[1].split()
        return ProcSample(
            state=fields[0].decode(),
            cpu=(int(fields[11]) + int(fields[12])) / _CLOCK_TICKS,
            start=int(fields[19]),
        )
    except (OSError, ValueError, IndexError):
        return None


class ProcLiveness:
    """Whether one running proc is alive, busy or hung.

    The agent feeds it the time of the proc's last heartbeat on every tick;
    while heartbeats are late it also looks at the process (``sample``).

    * heartbeats on time: alive;
    * late, and the process is stopped (``T``/``t``): hung, at once;
    * late, and it used CPU in the last window: busy, never hung however long;
    * no heartbeat and no CPU for ``hang_timeout``: hung.

    Args:
        hang_timeout: how long a proc may show no progress at all.
        suspect_after: how late heartbeats must be before anything is judged.
        cpu_window: the span over which CPU use is measured.
        min_cpu_share: the share of one CPU that counts as progress.
    """

    __slots__ = ("_mark", "_progress", "cpu_window", "hang_timeout", "min_cpu_share",
                 "suspect_after")  # fmt: skip

    def __init__(
        self,
        hang_timeout: float = HANG_TIMEOUT,
        *,
        suspect_after: float = SUSPECT_AFTER,
        cpu_window: float = CPU_WINDOW,
        min_cpu_share: float = MIN_CPU_SHARE,
    ) -> None:
        self.hang_timeout = hang_timeout
        self.suspect_after = suspect_after
        self.cpu_window = cpu_window
        self.min_cpu_share = min_cpu_share
        self._mark: tuple[float, float] | None = None  # (when, cpu) the CPU window began
        self._progress = float("-inf")  # the end of the last window with CPU use

    def judge(
        self, now: float, last_beat: float, look: Callable[[], ProcSample | None]
    ) -> str | None:
        """Why the proc is hung, or ``None`` if it is alive or busy.

        Args:
            now: the current time (monotonic seconds).
            last_beat: when its last heartbeat (or hello) arrived.
            look: samples the process now; called only while heartbeats are
                late. ``None`` means it cannot be seen (then silence alone
                decides, after ``hang_timeout``).
        """
        silent = now - last_beat
        if silent < self.suspect_after:
            self._mark = None
            return None
        seen = look()
        if seen is None:
            if silent >= self.hang_timeout:
                return f"no heartbeat for {silent:.1f}s"
            return None
        if seen.state in _STOPPED:
            return f"no heartbeat for {silent:.1f}s: the process is stopped (state {seen.state})"
        if self._mark is None or self._mark[0] < last_beat:
            self._mark = (now, seen.cpu)  # a window starts when the silence is noticed
        began, cpu = self._mark
        if now - began >= self.cpu_window:
            if seen.cpu - cpu >= self.min_cpu_share * (now - began):
                self._progress = now
            self._mark = (now, seen.cpu)
        idle = now - max(last_beat, self._progress)
        if idle >= self.hang_timeout:
            return f"no heartbeat for {silent:.1f}s and no CPU used for {idle:.1f}s"
        return None


# ------------------------------------------------------------ owners


@functools.lru_cache(maxsize=1)
def machine() -> str:
    """Where a pid names the same process as here: this boot of this kernel, in
    this pid namespace (containers on one host have their own)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""  # no /proc: never take a pid here for one there


def owner_pid(owner: str) -> int | None:
    """The pid an owner id (``hostname:pid:token``) names, if it names one."""
    parts = owner.rsplit(":", 2)
    try:
        return int(parts[1]) if len(parts) == 3 else None
    except ValueError:
        return None


def watch_owner(owner_machine: str, pid: int, start: int) -> int | None:
    """A pidfd on the owner process ``pid``, or ``None`` if it cannot be watched from here.

    An owner is watchable when it runs on this machine, in this pid
    namespace (``owner_machine`` equals ``machine()``), and ``pid`` is still
    the process that sent the heartbeat (its start time is ``start``): a pid
    alone may have been reused, and a hostname alone may be a container's.
    The pidfd becomes readable when the process exits; the caller closes it.
    """
    if not owner_machine or owner_machine != machine() or pid <= 0:
        return None
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None  # gone already, or no pidfd here: the grace decides
    # Checked after opening, so that the pidfd is known to hold the right process.
    seen = sample(pid)
    if seen is None or seen.start != start:
        os.close(fd)
        return None
    return fd


def identity() -> tuple[str, int, int]:
    """This process as an owner heartbeat describes it: (machine, pid, start)."""
    pid = os.getpid()
    seen = sample(pid)
    return machine(), pid, seen.start if seen is not None else 0
