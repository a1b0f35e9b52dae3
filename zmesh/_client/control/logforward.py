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
* Flushed before the client stops (``flush``, from ``zmesh.shutdown()`` and
  at exit): each agent is asked to forward what is new at once and to mark
  the end of it (``FlushLogs``), and the client prints up to each mark, so
  a script's actors' last lines are not lost as it ends (a tick is ~100 ms).

What a proc writes to stdout is printed on the client's stdout, what it
writes to stderr on the client's stderr (the agent tells them apart,
``LogLines.stream``). zmesh's own notes (lines cut, bytes not forwarded) go
to stderr, so a program's stdout carries only what its actors printed.
"""

from __future__ import annotations

import contextlib
import itertools
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
FLUSH_WAIT = 1.0  # seconds a client about to stop waits for its actors' last lines, at most
ACK_WAIT = 0.3  # ... of which for an agent to answer at all (a dead one never does)
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
        _forwarder.add(control)


def forget(control: str) -> None:
    """Stop following the agent at ``control`` (it stopped)."""
    forwarder = _forwarder
    if forwarder is not None and forwarder.pid == os.getpid():
        forwarder.forget(control)


def flush(controls: list[str], timeout: float = FLUSH_WAIT) -> None:
    """Print what the actors of this process on the agents at ``controls``
    wrote up to now (bounded by ``timeout``)."""
    forwarder = _forwarder
    if forwarder is not None and forwarder.pid == os.getpid() and forwarder.is_alive():
        forwarder.flush(controls, timeout)


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

    def flush(self, now: float, final: bool = False) -> None:
        """Say what repeated, once its window closed; report cut lines (a few times a second).

        ``final``: the client stops, so every window closes now.
        """
        if now - self.flushed < 0.1 and not final:
            return
        self.flushed = now
        for key, (first, n, host) in list(self.seen.items()):
            if now - first >= DEDUP_WINDOW or final:
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
        self.dropped: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.watched: set[str] = set()
        self.printer = Printer()
        self.printing = threading.Lock()  # the printer is ours, and a flush's at the end
        self.stopping = False  # not ``_stop``: threading calls Thread._stop() after a fork
        self.tried: set[str] = set()  # controls we tried to follow (or gave up on)
        self.subscribed: set[str] = set()  # controls whose log stream we follow
        self.marks: set[int] = set()  # ``FlushLogs`` ids whose marker arrived
        self.marked = threading.Condition()
        self.flushes = itertools.count(1)

    def add(self, control: str) -> None:
        if control not in self.watched:
            self.watched.add(control)
            self.pending.put(control)

    def forget(self, control: str) -> None:
        with self.marked:
            self.watched.discard(control)
            self.tried.discard(control)
            self.subscribed.discard(control)
        self.dropped.put(control)

    def flush(self, controls: list[str], timeout: float) -> None:
        """Ask the agents at ``controls`` we follow to forward their news and
        mark the end; return once every mark is printed, or at ``timeout``."""
        deadline = time.monotonic() + timeout
        wanted = set(controls)
        with self.marked:  # those watched a moment ago are followed first (briefly)
            self.marked.wait_for(lambda: wanted & self.watched <= self.tried, ACK_WAIT)
            asking = [c for c in controls if c in self.subscribed]
        expect = self._ask(asking, time.monotonic() + ACK_WAIT)
        with self.marked:
            self.marked.wait_for(
                lambda: expect <= self.marks, max(0.0, deadline - time.monotonic())
            )
        # "[repeated Nx across ranks]" is said before the end, unless the
        # printer is stuck (a full stdout pipe): the exit must not wait on it.
        if self.printing.acquire(timeout=max(0.05, deadline - time.monotonic())):
            try:
                self.printer.flush(time.monotonic(), final=True)
            finally:
                self.printing.release()

    def _ask(self, controls: list[str], until: float) -> set[int]:
        """Send ``FlushLogs`` to each agent at ``controls``; the ids they acknowledged.

        An agent that has not seen our subscription yet (it travels on its
        own) is asked again; one that does not answer by ``until`` is left.
        """
        ctx: Any = zmq.Context.instance()
        inbox, replies = Codec(w.AGENT_INBOX), Codec(w.AGENT_REPLIES, allow_pickle=False)
        owner = self.owner.decode()
        socks: list[Any] = []
        asked: dict[int, Any] = {}  # FlushLogs id -> its socket, until acknowledged
        expect: set[int] = set()

        def ask(sock: Any) -> None:
            mark = next(self.flushes)
            sock.send_multipart(inbox.encode(w.FlushLogs(mark, owner)))
            asked[mark] = sock

        try:
            for control in controls:
                sock = secure_client(ctx.socket(zmq.DEALER), addr=control)
                socks.append(sock)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(control)
                ask(sock)
            while asked and (left := until - time.monotonic()) > 0:
                poller = zmq.Poller()
                for sock in asked.values():
                    poller.register(sock, zmq.POLLIN)
                for sock, _ in poller.poll(int(left * 1000) + 1):
                    with contextlib.suppress(Exception):  # a bad reply: that agent is left
                        reply = replies.decode(sock.recv_multipart())
                        if not isinstance(reply, w.Ack) or asked.get(reply.id) is not sock:
                            continue
                        del asked[reply.id]
                        if reply.ok:
                            expect.add(reply.id)
                        else:  # our subscription is on its way there
                            time.sleep(0.01)
                            ask(sock)
        except zmq.ZMQError:  # the context is ending: nothing more can be printed
            pass
        finally:
            for sock in socks:
                sock.close(linger=0)
        return expect

    def run(self) -> None:
        ctx: Any = zmq.Context.instance()
        poller = zmq.Poller()
        subs: dict[str, Any] = {}  # one SUB per agent: each has its own keys (or none, on ipc)
        codec = Codec(w.LOG_STREAM, allow_pickle=False)
        try:
            while not self.stopping:
                while not self.dropped.empty():
                    sub = subs.pop(self.dropped.get(), None)
                    if sub is not None:
                        poller.unregister(sub)
                        sub.close(linger=0)
                while not self.pending.empty():
                    control = self.pending.get()
                    if control not in self.watched:
                        continue  # forgotten before we got to it: its agent stopped
                    sub = self._subscribe(ctx, control)
                    if sub is not None:
                        subs[control] = sub
                        poller.register(sub, zmq.POLLIN)
                    with self.marked:
                        if control in self.watched:  # not forgotten meanwhile
                            self.subscribed.update((control,) if sub is not None else ())
                            self.tried.add(control)
                        self.marked.notify_all()
                ready = dict(poller.poll(100)) if subs else {}
                if not subs:
                    time.sleep(0.1)  # nothing to follow yet (an agent without a log stream)
                for sub in ready:
                    while sub.poll(0):
                        frames = sub.recv_multipart(copy=True)
                        with contextlib.suppress(Exception):  # one bad message, not the thread
                            msg = codec.decode(frames[1:])
                            if isinstance(msg, w.LogLines) and msg.flushed:
                                with self.marked:  # every line before it is printed
                                    self.marks.add(msg.flushed)
                                    self.marked.notify_all()
                            elif isinstance(msg, w.LogLines):
                                with self.printing:
                                    self.printer.lines(msg, time.monotonic())
                with self.printing:
                    self.printer.flush(time.monotonic())
        finally:
            for sub in subs.values():
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
