"""A warm interpreter that forks an agent's procs (a forkserver).

A proc started as a fresh ``python -m zmesh._host.proc.procserver`` spends ~0.2 s of CPU
importing asyncio, pyzmq and msgspec before it can serve. On 2 cores that put
cold start (4 procs) at ~1 s and 64 procs at ~10 s. So an agent starts one
forkserver next to itself: an interpreter that has imported all of that, has
no threads and no ZeroMQ context (so it may fork), and forks a proc on
request in a few milliseconds.

The proc must still belong to the agent, not to the forkserver: the agent
reaps it (its exit code says how it died), and a proc dies with its agent,
never with a helper. So the forkserver forks it as the agent's child
(``clone(CLONE_PARENT)``), or where that cannot be done, through a
short-lived middle child that exits and so hands the procs to the agent, a
*child subreaper* (``zmesh._host.agent.forking``). When the forkserver reports a
proc's pid, it is the agent's child already.

The protocol is one JSON object per line (``zmesh._wire.boundary``): the
forkserver says ``ForkReady`` once warm; the agent writes a ``ForkRequest``
to its stdin and reads ``Forked`` (the pid) or ``ForkFailed`` from its
stdout. The forkserver exits when its stdin closes, and dies with the agent.

``ZMESH_FORKSERVER=0`` turns it off (procs are then started with Popen). If
the forkserver is not ready, or dies, the agent starts procs with Popen.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import fcntl
import gc
import logging
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

import msgspec

from zmesh._host.agent import forking as _forking
from zmesh._host.agent import forklaunch as _forklaunch
from zmesh._shared.paths import stderr_path
from zmesh._wire import boundary as b

log = logging.getLogger("zmesh.agent")

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, named in Python 3.10+ on Linux only
PROC_NAME = b"zmesh-proc"  # a forked proc's name (/proc/PID/comm), for ps and tests
# Past these a spawn falls back to Popen. Nothing waits on the agent's loop
# meanwhile (requests are held or in flight), so the first spawns wait for
# the warm forkserver rather than pay for fresh interpreters (~0.25 s of CPU
# each) on a machine too loaded for it to be warm in a second.
READY_TIMEOUT = 5.0  # from its start: how long spawns wait, in all, for its imports
REPLY_TIMEOUT = 0.5  # one fork takes milliseconds; silent this long, it counts as broken
# Procs forked (and answered) at once, then let run. Forked as a tree, 64
# take ~6 rounds of forks, run on every core: a spawn of 64 procs on 2
# loaded cores took 0.55x the time of 16 at a time, one fork after another.
BATCH = 64
# ZMESH_FORK_TREE=0: every fork from the forkserver itself, one after another.
TREE = os.environ.get("ZMESH_FORK_TREE", "1") != "0"
FORK_TIME = 0.1  # more time per request in a batch before a silence counts


enabled = _forklaunch.enabled
become_subreaper = _forklaunch.become_subreaper


def _prctl(option: int, arg: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _set_name(name: bytes) -> None:
    """Name this process in ``ps``/``top`` (its command line is the forkserver's)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass


# ------------------------------------------------------------ agent side


class Child:
    """A proc the forkserver forked: this agent's child, with Popen's interface.

    Only what the agent uses: ``pid``, ``returncode``, ``poll``, ``wait`` and
    ``send_signal``. ``returncode`` is negative for a signal, as in Popen.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:  # not ours to reap: say so, do not hang
                self.returncode = -int(signal.SIGKILL)
                break
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)


# What a ForkServer tells its agent of a request: its id, and the proc it
# forked, or None when it could not (the agent starts that proc with Popen).
OnFork = Callable[[int, Child | None], None]


class ForkServer:
    """The agent's handle on its forkserver. Used from the agent's loop thread.

    Requests are pipelined: ``request`` writes one and returns at once, and
    ``on_fork`` is called from the loop as each reply arrives (in order: the
    forkserver forks one request at a time). A request written before the
    forkserver is warm waits in the agent until it is, for ``READY_TIMEOUT``
    from its start at most; past that it is started with Popen instead (it
    was never sent, so it cannot be forked twice). A forkserver that stops
    answering for ``REPLY_TIMEOUT`` while requests are out is killed, and
    every request still out is started with Popen.
    """

    def __init__(self, popen: subprocess.Popen[bytes], on_fork: OnFork | None = None) -> None:
        self.popen = popen
        self.on_fork: OnFork = on_fork or (lambda rid, child: None)
        self.ready = False
        self.broken = False
        self._ready_by = time.monotonic() + READY_TIMEOUT
        self._ids = 0
        self._held: list[b.ForkRequest] = []  # until it is ready
        self._out: dict[int, float] = {}  # written, not answered: id -> when written
        self._answered = 0.0  # when it last answered
        self._rbuf = b""
        self._wbuf = bytearray()
        self._flush_soon = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def start(cls, epoch: str) -> ForkServer | None:
        """Start a forkserver for this process (the agent incarnation ``epoch``),
        or ``None`` if off (see ``zmesh._host.agent.forklaunch``)."""
        try:
            popen = _forklaunch.launch(epoch)
        except OSError as exc:
            log.warning("no forkserver (%s): procs start as fresh interpreters", exc)
            return None
        return cls(popen) if popen is not None else None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def pending(self) -> int:
        """Requests not answered yet."""
        return len(self._held) + len(self._out)

    def request(self, log_path: str, env: dict[str, str], cwd: str | None) -> int | None:
        """Ask for a proc; return the request's id (``on_fork`` gets the proc),
        or ``None`` if the forkserver cannot take it (start it with Popen)."""
        if self._loop is None and not self.broken:
            self.attach(asyncio.get_running_loop())
        if not self.ready and not self.broken:
            self._on_readable()  # a look without waiting: it may have said it is warm
        if self.broken:
            return None
        if not self.ready and time.monotonic() > self._ready_by:
            return None  # still importing (or gone): Popen this time
        self._ids += 1
        req = b.ForkRequest(self._ids, log_path, env, cwd, os.getpid())
        if self.ready:
            self._send(req)
        else:
            self._held.append(req)
        return req.id

    def check_overdue(self, now: float) -> None:
        """Give up on requests past their time (called on the agent's tick)."""
        if self._held and not self.ready and now > self._ready_by:
            held, self._held = self._held, []
            for req in held:  # never sent: Popen cannot make a second copy
                self.on_fork(req.id, None)
        allowed = REPLY_TIMEOUT + FORK_TIME * min(len(self._out), BATCH)
        if self._out and now - max(self._answered, min(self._out.values())) > allowed:
            # It may still fork what it has read: kill it first, so the only
            # late fork possible is the one in flight (the agent refuses its
            # hello: see ProcTable.hello).
            self.popen.kill()
            self._break("did not answer")

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read its replies on ``loop`` (the agent's), from now on."""
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self._loop = loop
        os.set_blocking(self.popen.stdin.fileno(), False)
        os.set_blocking(self.popen.stdout.fileno(), False)
        with contextlib.suppress(OSError):  # room for a burst of requests, if allowed
            fcntl.fcntl(self.popen.stdin.fileno(), _F_SETPIPE_SZ, 1 << 20)
        loop.add_reader(self.popen.stdout.fileno(), self._on_readable)

    def _send(self, req: b.ForkRequest) -> None:
        self._out[req.id] = time.monotonic()
        self._wbuf += b.encode(req) + b"\n"
        if not self._flush_soon and self._loop is not None:
            # After this loop pass: every request of one CreateOrUpdate goes
            # in one write, and the forkserver forks them in full batches.
            self._flush_soon = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        if self._loop is None or self.broken or not self._wbuf:
            return
        assert self.popen.stdin is not None
        fd = self.popen.stdin.fileno()
        try:
            n = os.write(fd, self._wbuf)
        except BlockingIOError:
            n = 0
        except OSError as exc:
            self._break(f"cannot talk to it: {exc}")
            return
        del self._wbuf[:n]
        self._loop.remove_writer(fd)
        if self._wbuf:  # a full pipe: the rest when it has read some
            self._loop.add_writer(fd, self._flush)

    def _on_readable(self) -> None:
        assert self.popen.stdout is not None
        try:
            chunk = os.read(self.popen.stdout.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._break("exited")
            return
        self._rbuf += chunk
        while b"\n" in self._rbuf and not self.broken:
            line, self._rbuf = self._rbuf.split(b"\n", 1)
            self._on_line(line)

    def _on_line(self, line: bytes) -> None:
        try:
            reply = b.decode_fork_reply(line)
        except msgspec.DecodeError as exc:
            self.popen.kill()
            self._break(f"answered what is no reply ({exc})")
            return
        self._answered = time.monotonic()
        if isinstance(reply, b.ForkReady):
            self.ready = True
            held, self._held = self._held, []
            for req in held:
                self._send(req)
        elif self._out.pop(reply.id, None) is not None:
            if isinstance(reply, b.Forked):
                self.on_fork(reply.id, Child(reply.pid))
            else:
                log.warning("forkserver could not fork: %s", reply.error)
                self.on_fork(reply.id, None)

    def _break(self, why: str) -> None:
        if not self.broken:
            log.warning("forkserver %s: procs start as fresh interpreters from now on", why)
        self.broken = True
        self._detach()
        left = [r.id for r in self._held] + list(self._out)
        self._held, self._out = [], {}
        for rid in left:  # what it did not answer is started another way
            self.on_fork(rid, None)

    def _detach(self) -> None:
        """Stop watching its pipes (before they close)."""
        if self._loop is None:
            return
        for pipe, remove in ((self.popen.stdout, self._loop.remove_reader),
                             (self.popen.stdin, self._loop.remove_writer)):  # fmt: skip
            if pipe is not None and not pipe.closed:
                remove(pipe.fileno())
        self._loop = None

    def check(self) -> None:
        """Reap the forkserver if it died (so it is no zombie), and stop using it."""
        if self.popen.poll() is not None:
            self._break(f"exited with {self.popen.returncode}")

    def close(self) -> None:
        """Stop the forkserver (it exits when its stdin closes)."""
        self._detach()
        self.broken = True  # no more requests
        try:
            if self.popen.stdin is not None:
                self.popen.stdin.close()
            self.popen.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            self.popen.kill()
            self.popen.wait()


# ------------------------------------------------------------ server side


def serve(agent_pid: int) -> None:
    """The forkserver's loop: fork a proc for each request line on stdin."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))  # never outlive the agent
    if os.getppid() != agent_pid:
        os._exit(70)
    _set_name(b"zmesh-fork")
    # Warm up: everything a proc imports before it runs the user's code
    # (~30 ms of CPU each proc would spend again). None of these modules
    # starts a thread at import; the few settings read at import
    # (ZMESH_MAX_MSG_SIZE, ZMESH_PROC_MAX_BACKLOG, ZMESH_MAX_IN_FLIGHT...) come
    # from the agent's environment, which an embedded agent has from its client.
    import zmesh._client.calls.runtime
    import zmesh._client.control.controller
    import zmesh._client.control.local
    import zmesh._host.proc.procserver
    import zmesh._host.proc.stacks
    import zmesh._wire.pickling  # noqa: F401

    _warm_first_use()

    # Freeze what is loaded: a proc's collector then never walks (and so
    # never copies, page by page) the objects it shares with us.
    gc.freeze()
    sibling = _forking.SiblingFork.load()
    os.write(1, b.encode(b.ForkReady()) + b"\n")
    buf = b""
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            os._exit(0)  # the agent closed our stdin
        buf += chunk
        # Take what else is written already: one middle child forks it all.
        while chunk and select.select([0], [], [], 0)[0]:
            chunk = os.read(0, 1 << 20)
            buf += chunk
        *lines, buf = buf.split(b"\n")
        reqs = [b.decode_fork_request(line) for line in lines if line]
        for i in range(0, len(reqs), BATCH):  # replies flow while a burst is forked
            batch = reqs[i : i + BATCH]
            if sibling is not None and TREE:
                replies = _forking.fork_tree(sibling, batch, _become_proc)
                if not any(isinstance(r, b.Forked) for r in replies):  # the kernel refused
                    sibling, replies = None, []
            elif sibling is not None:
                replies = _forking.fork_siblings(sibling, batch, _become_proc)
                if len(replies) < len(batch):  # the kernel refused: a middle child from now on
                    sibling = None
            else:
                replies = []
            replies += _forking.fork_through_middle(batch[len(replies) :], _become_proc)
            _write_all(1, b"".join(b.encode(reply) + b"\n" for reply in replies))
        if not chunk:
            os._exit(0)


def _warm_first_use() -> None:
    """Do once here what every proc would do first after its fork.

    A proc's CPU after its fork is what a burst of spawns waits for (64 procs
    on 2 cores): these were ~8 ms of it, each measured in a forked child.
    """
    # A class from __main__ arrives by value: unpickling it imports
    # cloudpickle (3.5 ms).
    import cloudpickle  # noqa: F401

    from zmesh._wire import messages as w
    from zmesh._wire.codec import Codec

    # msgspec works out a decoder's types once per Struct class and keeps
    # that on the class: a proc's first Codec then costs 0.4 ms, not 3.4.
    Codec(w.PROC_INBOX)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _become_proc(req: b.ForkRequest, gate: int, adopted: bool) -> NoReturn:
    """In the forked proc: set up what Popen would have, then run the proc.

    Args:
        gate: closed once the forks of this proc's batch are done.
        adopted: whether the agent is this process's parent already
            (``zmesh._host.agent.forking``).
    """
    code = 1
    try:
        if os.getsid(0) != os.getpid():  # (a proc of a fork tree has its session already)
            os.setsid()  # Ctrl+C at the client's terminal is the client's
        _set_name(PROC_NAME)
        # Asleep until the forks of our batch are done: they have the CPU
        # meanwhile (see zmesh._host.agent.forking).
        os.read(gate, 1)
        os.close(gate)
        fd = os.open(req.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # logs are private
        os.dup2(fd, 1)
        os.close(fd)
        # stderr apart, so the owner sees it on its stderr (zmesh._host.agent.logtail)
        fd = os.open(stderr_path(req.log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(req.env)
        if req.cwd:
            os.chdir(req.cwd)
        from zmesh._host.proc import procserver as _proc

        sys.argv = [_proc.__file__ or "zmesh._host.proc.procserver"]
        sys.path[0] = os.getcwd()  # as `python -m` sets it
        if not adopted:
            # Through a middle child: wait for the agent to adopt us, so
            # the proc's parent checks see the agent. (The gate closed as
            # the middle child exited, a moment before we are handed over.)
            deadline = time.monotonic() + 5.0
            while os.getppid() != req.agent_pid and time.monotonic() < deadline:
                time.sleep(0.001)
        _proc.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        # What interpreter exit would do: atexit handlers, then flush.
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
