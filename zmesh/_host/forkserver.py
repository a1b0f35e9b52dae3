"""A warm interpreter that forks an agent's procs (a forkserver).

A proc started as a fresh ``python -m zmesh._host.proc`` spends ~0.2 s of CPU
importing asyncio, pyzmq and msgspec before it can serve. On 2 cores that put
cold start (4 procs) at ~1 s and 64 procs at ~10 s. So an agent starts one
forkserver next to itself: an interpreter that has imported all of that, has
no threads and no ZeroMQ context (so it may fork), and forks a proc on
request in a few milliseconds.

The proc must still belong to the agent, not to the forkserver: the agent
reaps it (its exit code says how it died), and a proc dies with its agent,
never with a helper. So the agent is a *child subreaper*, and the forkserver
forks twice: a short-lived middle child forks the proc and exits at once,
which hands the orphaned proc to the agent. When the forkserver reports the
proc's pid, the proc is the agent's child already.

The protocol is one JSON object per line (``zmesh._wire.boundary``): the
forkserver says ``ForkReady`` once warm; the agent writes a ``ForkRequest``
to its stdin and reads ``Forked`` (the pid) or ``ForkFailed`` from its
stdout. The forkserver exits when its stdin closes, and dies with the agent.

``ZMESH_FORKSERVER=0`` turns it off (procs are then started with Popen). If
the forkserver is not ready, or dies, the agent starts procs with Popen.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from typing import NoReturn

import msgspec

from zmesh._wire import boundary as b

log = logging.getLogger("zmesh.agent")

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_SET_CHILD_SUBREAPER = 36
PROC_NAME = b"zmesh-proc"  # a forked proc's name (/proc/PID/comm), for ps and tests
# These block the agent's loop, so they stay well under a client's 1.2 s
# agent timeout: past them the spawn falls back to Popen.
READY_TIMEOUT = 1.0  # from its start: how long spawns wait, in all, for its imports
REPLY_TIMEOUT = 0.5  # one fork takes milliseconds; past this it counts as broken


def enabled() -> bool:
    """Whether agents fork procs from a forkserver (Linux only)."""
    return sys.platform.startswith("linux") and os.environ.get("ZMESH_FORKSERVER", "1") != "0"


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


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (the agent calls it)."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


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


class ForkServer:
    """The agent's handle on its forkserver. Used from the agent's loop thread."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.ready = False
        self.broken = False
        self._ready_by = time.monotonic() + READY_TIMEOUT
        self._buf = b""
        self._ids = 0

    @classmethod
    def start(cls) -> ForkServer | None:
        """Start a forkserver for this process (an agent), or ``None`` if off."""
        if not enabled() or not become_subreaper():
            return None
        try:
            popen = subprocess.Popen(
                [sys.executable, "-m", "zmesh._host.forkserver", str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            log.warning("no forkserver (%s): procs start as fresh interpreters", exc)
            return None
        return cls(popen)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def spawn(self, log_path: str, env: dict[str, str], cwd: str | None) -> Child | None:
        """Fork a proc; ``None`` if the forkserver cannot (start it with Popen)."""
        if self.broken:
            return None
        if not self.ready:
            # Bounded once, from its start: a burst of spawns never waits
            # for each of them (past the bound, a look without waiting).
            line = self._read_line(self._ready_by - time.monotonic())
            if line is None:
                return None  # still importing (or gone): Popen this time
            self.ready = True
        self._ids += 1
        req = b.ForkRequest(self._ids, log_path, env, cwd, os.getpid())
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write(b.encode(req) + b"\n")
            self.popen.stdin.flush()
            line = self._read_line(REPLY_TIMEOUT)
        except OSError as exc:
            self._break(f"cannot talk to it: {exc}")
            return None
        if line is None:
            # It may still fork this request later: kill it first, so the
            # only late fork possible is the one in flight (the agent
            # refuses its hello: see ProcTable.hello).
            self._break("did not answer")
            self.popen.kill()
            return None
        try:
            reply = b.decode_fork_reply(line)
        except msgspec.DecodeError as exc:
            self._break(f"answered what is no reply ({exc})")
            self.popen.kill()
            return None
        if not isinstance(reply, b.Forked) or reply.id != self._ids:
            log.warning("forkserver could not fork: %s", reply)
            return None
        return Child(reply.pid)

    def _read_line(self, timeout: float) -> bytes | None:
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                self._break("it exited")
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _break(self, why: str) -> None:
        if not self.broken:
            log.warning("forkserver %s: procs start as fresh interpreters from now on", why)
        self.broken = True

    def check(self) -> None:
        """Reap the forkserver if it died (so it is no zombie), and stop using it."""
        if self.popen.poll() is not None:
            self._break(f"exited with {self.popen.returncode}")

    def close(self) -> None:
        """Stop the forkserver (it exits when its stdin closes)."""
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
    # Warm up: everything a proc imports before it knows its spec. None of
    # these modules starts a thread or reads ZMESH_* settings at import.
    import zmesh._host.proc  # noqa: F401

    os.write(1, b.encode(b.ForkReady()) + b"\n")
    buf = b""
    while True:
        chunk = os.read(0, 65536)
        if not chunk:
            os._exit(0)  # the agent closed our stdin
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = b.decode_fork_request(line)
            os.write(1, b.encode(_fork(req)) + b"\n")


def _fork(req: b.ForkRequest) -> b.Forked | b.ForkFailed:
    r, w = os.pipe()
    try:
        middle = os.fork()
    except OSError as exc:
        os.close(r)
        os.close(w)
        return b.ForkFailed(req.id, f"fork: {exc}")
    if middle == 0:  # the middle child: fork the proc, report it, exit
        os.close(r)
        try:
            pid = os.fork()
        except OSError:
            os._exit(1)
        if pid == 0:
            os.close(w)
            _become_proc(req)
        os.write(w, str(pid).encode())
        os._exit(0)  # orphans the proc: it goes to the agent, our subreaper
    os.close(w)
    data = b""
    while chunk := os.read(r, 64):
        data += chunk
    os.close(r)
    os.waitpid(middle, 0)  # once reaped, the proc's parent is the agent
    if not data:
        return b.ForkFailed(req.id, "fork failed in the middle child")
    return b.Forked(req.id, int(data))


def _become_proc(req: b.ForkRequest) -> NoReturn:
    """In the forked proc: set up what Popen would have, then run the proc."""
    code = 1
    try:
        os.setsid()  # Ctrl+C at the client's terminal is the client's
        _set_name(PROC_NAME)
        fd = os.open(req.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # logs are private
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(req.env)
        if req.cwd:
            os.chdir(req.cwd)
        from zmesh._host import proc as _proc

        sys.argv = [_proc.__file__ or "zmesh._host.proc"]
        sys.path[0] = os.getcwd()  # as `python -m` sets it
        # The middle child exits right after forking us; wait for the agent
        # to adopt us, so the proc's parent checks see the agent.
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
