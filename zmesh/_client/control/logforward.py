"""Actors' output on the client's terminal: ``(mesh rank host) line``, Ray style.

Every agent this client spawns on publishes the new lines of its procs' logs
under the owner's id (``zmesh._host.agent.logtail``). This module follows those
streams from one daemon thread with its own sockets, so the call path never
sees it, and prints each line with a prefix naming where it came from.

* Deduplicated: the same line from several ranks of one mesh (every rank
  prints "loading model") within ``DEDUP_WINDOW`` is printed once, then
  ``[repeated Nx across ranks]``.
* Rate-limited: at most ``MAX_LINES`` lines a second reach the terminal
  (the agent also caps each proc's bytes); what is cut is counted, and the
  logs keep the rest (``zmesh logs MESH``; their last ``ZMESH_LOG_MAX_BYTES``).
* Off with ``ZMESH_FORWARD_LOGS=0`` or ``zmesh.connect(..., forward_logs=False)``.

What a proc writes to stdout is printed on the client's stdout, what it
writes to stderr on the client's stderr (the agent tells them apart,
``LogLines.stream``). zmesh's own notes (lines cut, bytes not forwarded) go
to stderr, so a program's stdout carries only what its actors printed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import sys
import threading
import time
from typing import Any, TextIO

import zmq

from zmesh._wire import messages as w
from zmesh._wire.codec import Codec
from zmesh._wire.security import secure_client

DEDUP_WINDOW = 2.0
MAX_LINES = 200  # a second, to the terminal
_enabled: bool | None = None  # None: ask ZMESH_FORWARD_LOGS
_lock = threading.Lock()
_forwarder: _Forwarder | None = None


def enable(on: bool) -> None:
    """Forward (or stop forwarding) actors' output to this process's stdout."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    if _enabled is not None:
        return _enabled
    return os.environ.get("ZMESH_FORWARD_LOGS", "1").strip().lower() not in ("0", "false", "no")


def watch(control: str, owner: str) -> None:
    """Follow the log stream of the agent at ``control`` for ``owner``'s procs."""
    global _forwarder
    if not enabled() or os.environ.get("ZMESH_PROC"):
        return  # a proc's own meshes print into its log, which its owner follows
    with _lock:
        if _forwarder is None or _forwarder.pid != os.getpid():
            _forwarder = _Forwarder(owner)
            _forwarder.start()
            atexit.register(_forwarder.drain)
        _forwarder.add(control)


class Printer:
    """Prefixes, deduplicates and rate-limits lines onto ``out`` and ``err`` (one thread's).

    Args:
        out: where stdout lines go (default: ``sys.stdout`` at the time).
        err: where stderr lines and zmesh's notes go (default: ``sys.stderr``).
    """

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out = out
        self.err = err
        # (mesh, stream, text) -> [first seen, repeats, host]
        self.seen: dict[tuple[str, int, str], list[Any]] = {}
        self.second = 0.0
        self.shown = 0
        self.cut = 0
        self.cut_total = 0  # lines not shown since the start (``statistics``)
        self.skipped_total = 0  # bytes the agents did not forward
        self.skipped: dict[tuple[str, int, str, str], int] = {}  # not said yet, by proc
        self.said_skipped = 0.0
        self.flushed = 0.0

    def lines(self, msg: w.LogLines, now: float) -> None:
        for text in msg.lines:
            key = (msg.mesh, msg.stream, text)
            seen = self.seen.get(key)
            if seen is not None and now - seen[0] < DEDUP_WINDOW:
                seen[1] += 1
                continue
            if self._over(now):  # cut: not remembered either, so a flood costs no memory
                self.cut += 1
                self.cut_total += 1
                continue
            self.seen[key] = [now, 0, msg.agent]
            self._emit(f"({msg.mesh} {msg.rank} {msg.agent}) {text}", now, msg.stream)
        if msg.skipped:  # said once a second per proc (a flood would say it every tick)
            self.skipped_total += msg.skipped
            where = (msg.mesh, msg.rank, msg.agent, msg.path)
            self.skipped[where] = self.skipped.get(where, 0) + msg.skipped

    def flush(self, now: float) -> None:
        """Say what repeated, once its window closed; report cut lines (a few times a second)."""
        if now - self.flushed < 0.1:
            return
        self.flushed = now
        for key, (first, n, host) in list(self.seen.items()):
            if now - first >= DEDUP_WINDOW:
                del self.seen[key]
                if n:
                    line = f"({key[0]} {host}) {key[2]} [repeated {n}x across ranks]"
                    self._emit(line, now, key[1])
        if self.skipped and now - self.said_skipped >= 1.0:
            self.said_skipped = now
            for (mesh, rank, host, path), n in self.skipped.items():
                line = (
                    f"({mesh} {rank} {host}) [zmesh: {n} bytes of output not forwarded "
                    f"(over the rate); the log has them: {path}]"
                )
                self._emit(line, now, 2, always=True)
            self.skipped.clear()
        if self.cut and now - self.second >= 1.0:
            cut, self.cut = self.cut, 0
            line = f"[zmesh: {cut} lines of actor output not shown; see zmesh logs]"
            self._emit(line, now, 2, always=True)

    def _over(self, now: float) -> bool:
        if now - self.second >= 1.0:
            self.second, self.shown = now, 0
        return self.shown >= MAX_LINES

    def _emit(self, line: str, now: float, stream: int, always: bool = False) -> None:
        if self._over(now) and not always:
            self.cut += 1
            self.cut_total += 1
            return
        self.shown += 1
        out = (self.err or sys.stderr) if stream == 2 else (self.out or sys.stdout)
        with contextlib.suppress(ValueError, OSError):  # stdout closed at exit
            out.write(line + "\n")
            out.flush()


class _Forwarder(threading.Thread):
    def __init__(self, owner: str) -> None:
        super().__init__(name="zmesh-logs", daemon=True)
        self.pid = os.getpid()
        self.owner = owner.encode()
        self.pending: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.watched: set[str] = set()
        self.printer = Printer()
        self.idle = threading.Event()
        self.stopping = False  # not ``_stop``: threading calls Thread._stop() after a fork

    def add(self, control: str) -> None:
        if control not in self.watched:
            self.watched.add(control)
            self.pending.put(control)

    def drain(self, timeout: float = 0.3) -> None:
        """At exit: print what is on its way (a proc's last words), briefly."""
        deadline = time.monotonic() + timeout
        self.idle.clear()
        while time.monotonic() < deadline and not self.idle.wait(0.05):
            pass
        self.stopping = True

    def run(self) -> None:
        ctx: Any = zmq.Context.instance()
        poller = zmq.Poller()
        subs: list[Any] = []  # one SUB per agent: each has its own keys (or none, on ipc)
        codec = Codec(w.LOG_STREAM, allow_pickle=False)
        try:
            while not self.stopping:
                while not self.pending.empty():
                    sub = self._subscribe(ctx, self.pending.get())
                    if sub is not None:
                        subs.append(sub)
                        poller.register(sub, zmq.POLLIN)
                ready = dict(poller.poll(100)) if subs else {}
                if not subs:
                    time.sleep(0.1)  # nothing to follow yet (an agent without a log stream)
                for sub in ready:
                    while sub.poll(0):
                        frames = sub.recv_multipart(copy=True)
                        with contextlib.suppress(Exception):  # one bad message, not the thread
                            msg = codec.decode(frames[1:])
                            if isinstance(msg, w.LogLines):
                                self.printer.lines(msg, time.monotonic())
                if not ready:
                    self.idle.set()
                self.printer.flush(time.monotonic())
        finally:
            for sub in subs:
                sub.close(linger=0)

    def _subscribe(self, ctx: Any, control: str) -> Any:
        """Ask the agent where its log stream is, and follow our topic there."""
        req = secure_client(ctx.socket(zmq.DEALER), addr=control)
        req.setsockopt(zmq.LINGER, 0)
        try:
            req.connect(control)
            req.send_multipart(Codec(w.AGENT_INBOX).encode(w.Describe(1)))
            if not req.poll(10_000):
                return None  # the caller hears of a silent agent elsewhere
            info = Codec(w.AGENT_REPLIES, allow_pickle=False).decode(req.recv_multipart())
        except Exception:  # forwarding is best effort; calls are not affected
            return None
        finally:
            req.close(linger=0)
        if not isinstance(info, w.AgentInfo) or not info.logs:
            return None  # an agent without a log stream
        where = info.logs
        if "://0.0.0.0:" in where and control.startswith("tcp://"):
            where = where.replace("0.0.0.0", control[6:].rsplit(":", 1)[0])
        try:
            sub = ctx.socket(zmq.SUB)
        except zmq.ZMQError:  # the context is ending (zmesh.shutdown() meanwhile)
            return None
        try:
            secure_client(sub, addr=where)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, self.owner)
            sub.connect(where)
        except Exception:  # closed here, or collected unclosed later (a ResourceWarning)
            sub.close(linger=0)
            return None
        return sub
