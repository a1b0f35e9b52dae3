"""Forking procs that are the agent's children, not the forkserver's.

The forkserver forks procs that must be its parent's (the agent's)
children: the agent reaps them, reads their exit codes and watches them by
pidfd, a proc dies with its agent (``PR_SET_PDEATHSIG``), and it checks at
boot that its parent is its agent. Two ways, the first where it works:

* ``fork_siblings``: ``clone(2)`` with ``CLONE_PARENT`` (``SiblingFork``)
  makes each proc the agent's child from its first instruction. No process
  is in between, and nothing waits for an adoption.
* ``fork_through_middle``: a short-lived middle child forks the batch and
  exits, which hands the procs to the agent (a child subreaper); they wait
  until the agent is their parent.

Either way the procs of a batch sleep on a gate (a pipe whose write end
closes) until the whole batch is forked: 16 procs running at once would
take the CPU their siblings' forks need (the scheduler shares it fairly), so
on 2 cores the last of a burst of 64 would be forked a second late.

``fork_tree`` forks a burst with ``CLONE_PARENT`` as a doubling tree: the
forkserver forks a proc and hands it half of the burst, which it forks the
same way before it becomes its proc, and so on. Every process of the tree
is still the agent's child (``CLONE_PARENT`` from a child of the agent),
64 procs are forked in 6 rounds instead of 64 forks one after another,
and the forks run on every core. Each fork is reported on a pipe the
forkserver reads until the last forker has closed it; a forker killed
half-way leaves its part of the burst unforked (the agent starts those
with Popen) and nothing waiting (pipes close with their holders).

Python has no ``os.clone``, so ``SiblingFork`` does what ``os.fork()`` does
around the system call, with the same public C API: ``PyOS_BeforeFork``, the
call, then ``PyOS_AfterFork_Child`` (which re-creates the GIL and runs the
``os.register_at_fork`` hooks) or ``PyOS_AfterFork_Parent``, with the GIL
held across the call (``ctypes.PyDLL``), as in ``os.fork``. The C library's
``fork()`` does three more things, which hold here because the forkserver
has a single thread: it records the child's thread id in the thread's
descriptor (the kernel does it: ``CLONE_CHILD_SETTID`` at that field, whose
place is checked first), resets locks other threads may hold (there are
none), and runs ``pthread_atfork`` handlers (none that a proc needs).
``SiblingFork.load()`` returns ``None`` where any of this cannot be checked
(another architecture or C library, or ``ZMESH_SIBLING_FORK=0``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from zmesh._wire import boundary as b

_SYS_CLONE = 56  # x86_64
_CLONE_PARENT = 0x00008000
_CLONE_CHILD_CLEARTID = 0x00200000
_CLONE_CHILD_SETTID = 0x01000000
_SIGCHLD = 17
# What glibc's fork() passes, plus CLONE_PARENT; the exit signal (SIGCHLD)
# then goes to the new parent, the agent.
_FLAGS = _CLONE_PARENT | _CLONE_CHILD_SETTID | _CLONE_CHILD_CLEARTID | _SIGCHLD
# Where glibc (2.28 and later, x86_64) keeps a thread's id in its ``struct
# pthread``; checked against the real id before it is used.
_TID_OFFSET = 720


class SiblingFork:
    """Forks children of this process's parent. Use from a single-threaded process."""

    def __init__(self, libc: ctypes.PyDLL, tid_addr: int) -> None:
        self._tid_addr = ctypes.c_void_p(tid_addr)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._syscall.argtypes = [ctypes.c_long, ctypes.c_ulong, ctypes.c_void_p,
                                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
        api = ctypes.pythonapi
        self._before, self._child, self._parent = (
            api.PyOS_BeforeFork, api.PyOS_AfterFork_Child, api.PyOS_AfterFork_Parent,
        )  # fmt: skip
        for fn in (self._before, self._child, self._parent):
            fn.restype = None
            fn.argtypes = []

    @classmethod
    def load(cls) -> SiblingFork | None:
        """A ``SiblingFork`` for this process, or ``None`` where it cannot be used."""
        if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
            return None
        if os.environ.get("ZMESH_SIBLING_FORK", "1") == "0" or threading.active_count() != 1:
            return None
        try:
            libc = ctypes.PyDLL(None, use_errno=True)
            libc.pthread_self.restype = ctypes.c_void_p
            me = libc.pthread_self()
            tid_addr = int(me) + _TID_OFFSET
            if ctypes.c_int.from_address(tid_addr).value != threading.get_native_id():
                return None  # another layout: not ours to write
            return cls(libc, tid_addr)
        except (OSError, AttributeError, TypeError):
            return None

    def fork(self) -> int:
        """Like ``os.fork()``: 0 in the child, its pid in the caller.

        Raises:
            OSError: the system call failed (e.g. ``EINVAL`` for a namespace's init).
        """
        self._before()
        pid = int(self._syscall(_SYS_CLONE, _FLAGS, None, None, self._tid_addr, None))
        if pid == 0:
            self._child()
            return 0
        err = ctypes.get_errno()
        self._parent()
        if pid < 0:
            raise OSError(err, f"clone(CLONE_PARENT): {os.strerror(err)}")
        return pid


# Runs a forked proc: (its request, the gate to wait on, whether the agent
# is its parent already). Never returns.
Become = Callable[[b.ForkRequest, int, bool], NoReturn]


def fork_siblings(
    sibling: SiblingFork, reqs: list[b.ForkRequest], become: Become
) -> list[b.Forked | b.ForkFailed]:
    """Fork a proc for each request as the agent's child; its replies.

    Fewer replies than requests: ``clone`` failed for the next one (the
    caller forks the rest another way).
    """
    gate_r, gate_w = os.pipe()
    replies: list[b.Forked | b.ForkFailed] = []
    try:
        for req in reqs:
            try:
                pid = sibling.fork()
            except OSError as exc:
                print(f"zmesh forkserver: {exc}; forking through a middle child",
                      file=sys.stderr, flush=True)  # fmt: skip
                break
            if pid == 0:
                os.close(gate_w)
                become(req, gate_r, True)
            replies.append(b.Forked(req.id, pid))
    finally:
        os.close(gate_r)
        os.close(gate_w)  # the batch runs
    return replies


def fork_tree(
    sibling: SiblingFork, reqs: list[b.ForkRequest], become: Become
) -> list[b.Forked | b.ForkFailed]:
    """Fork a proc for each request as the agent's child, as a doubling tree; its replies.

    A request no forker reported (a fork refused, a forker killed) is a
    ``ForkFailed``: the agent starts that proc another way.
    """
    gate_r, gate_w = os.pipe()
    report_r, report_w = os.pipe()
    try:
        _spread(sibling, reqs, become, (gate_r, gate_w, report_r, report_w))
    finally:
        os.close(gate_w)
        os.close(report_w)
    data = b""
    try:
        while chunk := os.read(report_r, 65536):  # until the last forker has closed it
            data += chunk
    finally:
        os.close(report_r)
        os.close(gate_r)
    pids = {}
    for line in data.split(b"\n"):
        if line:
            rid, pid = line.split()
            pids[int(rid)] = int(pid)
    return [
        b.Forked(q.id, pids[q.id]) if q.id in pids else b.ForkFailed(q.id, "not forked")
        for q in reqs
    ]


def _spread(
    sibling: SiblingFork,
    reqs: list[b.ForkRequest],
    become: Become,
    fds: tuple[int, int, int, int],
) -> None:
    """Fork ``reqs``: each fork takes the back half of what is left, forks it
    the same way, then becomes its own proc. The caller keeps the front half."""
    gate_r, gate_w, report_r, report_w = fds
    while reqs:
        cut = len(reqs) // 2
        theirs, reqs = reqs[cut:], reqs[:cut]
        try:
            pid = sibling.fork()
        except OSError as exc:
            print(f"zmesh forkserver: {exc}", file=sys.stderr, flush=True)
            return  # what is left is not reported: the agent starts it with Popen
        if pid == 0:
            try:
                if report_r >= 0:
                    os.close(report_r)  # (only the forkserver reads the reports)
                # Its own session now (as a proc's), so the forks below it
                # run in it rather than in the forkserver's: with the
                # kernel's autogroups each session has its share of CPU.
                os.setsid()
                _spread(sibling, theirs[1:], become, (gate_r, gate_w, -1, report_w))
                os.close(report_w)
                os.close(gate_w)
                become(theirs[0], gate_r, True)
            finally:
                os._exit(70)  # (become never returns; nothing here may unwind into the forkserver)
        try:
            os.write(report_w, b"%d %d\n" % (theirs[0].id, pid))  # one write: atomic
        except OSError:  # the forkserver is gone: the agent gave up on this burst
            pass


def fork_through_middle(reqs: list[b.ForkRequest], become: Become) -> list[b.Forked | b.ForkFailed]:
    """Fork a proc for each request, through one short-lived middle child.

    The middle child forks every proc and exits, which hands them all to
    the agent (our subreaper) at once: two forks per proc would make the
    forkserver wait on a middle child per proc, and a burst of requests
    wait on all of them in turn.
    """
    if not reqs:
        return []
    r, w = os.pipe()
    # The procs wait on this pipe until the middle child, its only writer
    # left, exits: asleep, not polling, while their siblings are forked.
    gate_r, gate_w = os.pipe()
    try:
        middle = os.fork()
    except OSError as exc:
        for fd in (r, w, gate_r, gate_w):
            os.close(fd)
        return [b.ForkFailed(req.id, f"fork: {exc}") for req in reqs]
    if middle == 0:  # the middle child: fork the procs, report them, exit
        os.close(r)
        for req in reqs:
            try:
                pid = os.fork()
            except OSError:
                os._exit(1)
            if pid == 0:
                os.close(w)
                os.close(gate_w)
                become(req, gate_r, False)
            os.write(w, b"%d\n" % pid)
        os._exit(0)  # orphans the procs: they go to the agent, our subreaper
    os.close(w)
    os.close(gate_r)
    os.close(gate_w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(middle, 0)  # once reaped, the procs' parent is the agent
    pids = [int(p) for p in data.split()]
    out: list[b.Forked | b.ForkFailed] = [b.Forked(q.id, p) for q, p in zip(reqs, pids)]  # noqa: B905
    failed = reqs[len(pids) :]  # the middle child could fork no more
    return out + [b.ForkFailed(q.id, "fork failed in the middle child") for q in failed]
