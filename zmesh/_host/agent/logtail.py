"""Procs' logs, read back: ``GetLogs`` answers and lines forwarded to their owners.

Each proc writes its stdout to its log file and its stderr to a file beside
it (``paths.stderr_path``; both opened before the proc starts, so what a
proc writes survives its kill -9). Nothing on the call path changes for
this: the agent reads the files back. Every tick it copies the new whole
lines of the stderr file into the log, each marked ``ERR_MARK``: the log is
the combined view ``zmesh logs`` reads, and a forwarded line goes to the
owner's stdout or stderr by its mark.

* ``GetLogs`` (``zmesh logs``, top's logs view) reads a piece of one file,
  from an offset, or from where the file stood ``since`` seconds ago: each
  tick the agent notes (time, size) for every log that grew, so ``--since``
  needs no timestamps in the file.
* Forwarding (Ray style): a client subscribes to the agent's log stream (a
  PUB socket next to the event stream, its address in ``AgentInfo.logs``)
  with its owner id as topic. The agent tails only the logs of owners that
  are subscribed (an XPUB says who is), every tick (~100 ms), and publishes
  the new whole lines as ``LogLines`` under the owner's id (one message per
  stream), so no client gets another's output. A proc that writes faster
  than ``RATE`` bytes a second is not forwarded in full: the rest is skipped
  (the count is sent, the bytes stay in the log).
* Flushed on request (``FlushLogs``): a client about to stop has its lines
  forwarded at once, then a marker, so its actors' last words reach its
  terminal before it stops them. The last lines of a mesh the agent
  forgets are forwarded before its tails go.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import zmq

from zmesh._host.agent import logcap as _logcap
from zmesh._shared.paths import stderr_path
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec
from zmesh._wire.security import Keys, secure_server
from zmesh._wire.zsock import AsyncSocket, configure

RATE = 256 << 10  # bytes a second forwarded per proc; the rest stays in the log
TICK = 0.1
CHECKPOINTS = 600  # (time, size) pairs kept per log, for --since
MAX_LINE = 16 << 10  # a longer line is forwarded in pieces
ERR_MARK = b"[stderr] "  # how a line the proc wrote to stderr starts, in its log
COPY_MAX = 1 << 20  # bytes of stderr copied into a log per tick, at most (10 MB/s)


@dataclass
class _Tail:
    path: str
    offset: int = -1  # forwarded up to here (-1: not yet started)
    partial: bytes = b""
    budget: float = float(RATE)
    size: int = 0
    marks: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=CHECKPOINTS))
    err_offset: int = 0  # the stderr file copied into the log up to here
    err_partial: bytes = b""
    shift: int = 0  # bytes cut from the log's head so far (zmesh._host.agent.logcap)
    owner: bytes = b""  # the mesh's: to forward its last lines once the mesh is forgotten


class LogTail:
    """The agent's half of logs: answers ``GetLogs``, forwards lines to owners.

    Args:
        meshes: the agent's meshes (name -> mesh with ``spec.owner`` and
            ``procs``: rank -> proc with ``log_path``, ``generation``, ``reaped``).
        label: the agent's host label, sent with each line.
    """

    def __init__(self, meshes: dict[str, Any], label: str) -> None:
        self.meshes = meshes
        self.label = label
        self.address = ""
        self._tails: dict[tuple[str, int, int], _Tail] = {}
        self._subscribed: dict[bytes, int] = {}  # owner id -> subscriptions
        self._pub: AsyncSocket | None = None
        self._codec = Codec(w.LOG_STREAM)
        self._last = time.monotonic()
        self._shifts: dict[str, int] = {}  # logs no longer tailed: bytes cut from their head

    def bind(
        self, ctx: Any, loop: asyncio.AbstractEventLoop, keys: Keys | None, stream: str
    ) -> str:
        """Bind the log stream next to the event stream at ``stream``: the same
        ipc:// directory (``.../l``), or a new port on the same TCP host."""
        if stream.startswith("ipc://"):
            where = stream.rsplit("/", 1)[0] + "/l"
        else:
            where = stream.rsplit(":", 1)[0] + ":0"
        sock = secure_server(configure(ctx.socket(zmq.XPUB), addr=where), keys, where)
        if where.startswith("tcp://") and where.endswith(":0"):
            where = where[:-2] + ":*"
        sock.bind(where)
        if where.startswith("ipc://"):
            os.chmod(where[len("ipc://") :], 0o600)
        self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._pub = AsyncSocket(sock, loop, self._on_subscription)
        return self.address

    def close(self) -> None:
        if self._pub is not None:
            self._pub.close()

    def _on_subscription(self, frames: list[Any]) -> None:
        msg = bytes(frames[0])
        if not msg:
            return
        topic, n = msg[1:], self._subscribed.get(msg[1:], 0)
        self._subscribed[topic] = n + 1 if msg[0] == 1 else n - 1
        if self._subscribed[topic] <= 0:
            del self._subscribed[topic]

    # ---------------------------------------------------------- each tick

    def flush(self, owner: str, marker: int) -> bool:
        """Forward ``owner``'s new lines now, then the marker ``LogLines(flushed=marker)``.

        Whether ``owner`` is subscribed: if not (yet), nothing can reach it.
        """
        topic = owner.encode()
        if topic not in self._subscribed or self._pub is None:
            return False
        self.tick(only=topic)  # (its client stops next: a last open line goes too)
        msg = w.LogLines("", -1, self.label, [], flushed=marker)
        self._pub.send([topic, *self._codec.encode(msg)])
        return True

    def tick(self, only: bytes | None = None) -> None:
        """Note how every log grew; forward the new lines of subscribed owners
        (of ``only``, when named: a flush)."""
        now = time.monotonic()
        # A flush adds no forwarding budget (a stream of them must not lift
        # the rate limit), nor takes the other owners' time.
        dt = now - self._last if only is None else 0.0
        if only is None:
            self._last = now
        wall = time.time()
        seen = set()
        for name, mesh in self.meshes.items():
            owner = mesh.spec.owner.encode()
            if only is not None and owner != only:
                continue
            forward = owner in self._subscribed
            for rank, proc in mesh.procs.items():
                key = (name, rank, proc.generation)
                seen.add(key)
                tail = self._tails.get(key)
                if tail is None:
                    tail = self._tails[key] = _Tail(proc.log_path, owner=owner)
                _copy_stderr(tail)
                try:
                    size = os.stat(tail.path).st_size
                except OSError:
                    continue
                if size > _logcap.MAX:
                    size -= self._cap(tail)
                if size != tail.size:
                    tail.size = size
                    tail.marks.append((wall, size))
                if forward:
                    tail.budget = min(float(RATE), tail.budget + RATE * dt)
                    self._forward(owner, name, rank, tail, final=only is not None)
        if only is not None:
            return  # a flush: the other owners' logs wait for the next tick
        for key in [k for k in self._tails if k not in seen]:
            tail = self._tails.pop(key)  # the agent forgot the mesh (or the generation)
            if tail.owner in self._subscribed:  # its last words first
                self._last_words(key, tail)
            if tail.shift:  # offsets into that log (zmesh logs -g N) stay right
                self._shifts[tail.path] = tail.shift
        if len(self._shifts) > 10_000:  # logs of forgotten meshes, oldest first
            for path in list(self._shifts)[:1000]:
                del self._shifts[path]

    def _last_words(self, key: tuple[str, int, int], tail: _Tail) -> None:
        """Forward what a forgotten proc wrote since the last tick (its last lines)."""
        _copy_stderr(tail)
        try:
            tail.size = os.stat(tail.path).st_size
        except OSError:
            return
        self._forward(tail.owner, key[0], key[1], tail, final=True)

    def _cap(self, tail: _Tail) -> int:
        """Cut ``tail``'s log to its last ``logcap.KEEP`` bytes; how far it moved."""
        moved = _logcap.cap(tail.path, tail.shift)
        if moved:
            tail.shift += moved
            tail.size = max(0, tail.size - moved)
            if tail.offset > 0:  # forwarding goes on where it was (or at the marker)
                tail.offset = max(0, tail.offset - moved)
                if tail.offset == 0:
                    tail.partial = b""
            tail.marks = deque(((t, max(0, s - moved)) for t, s in tail.marks), maxlen=CHECKPOINTS)
        return moved

    def _forward(
        self, owner: bytes, mesh: str, rank: int, tail: _Tail, final: bool = False
    ) -> None:
        """Publish ``tail``'s new whole lines (and, when ``final``, a last open one)."""
        if tail.offset < 0:
            tail.offset = 0  # from the start: what the proc said before we subscribed too
        if (tail.size <= tail.offset and not (final and tail.partial)) or self._pub is None:
            return
        want = tail.size - tail.offset
        take = min(want, max(0, int(tail.budget)))
        skipped = want - take
        if skipped:  # over the rate: forward the newest, count what was jumped
            tail.offset, tail.partial = tail.size - take, b""
        data = _read(tail.path, tail.offset, take)
        tail.offset += len(data)
        tail.budget -= len(data)
        if skipped:  # the jump landed inside a line: start at the next one
            cut = data.find(b"\n") + 1
            skipped, data = skipped + cut, data[cut:]
        data = tail.partial + data
        *lines, tail.partial = data.split(b"\n")
        if len(tail.partial) > MAX_LINE or (final and tail.partial):
            lines.append(tail.partial)
            tail.partial = b""
        if not lines and not skipped:
            return
        streams: tuple[list[str], list[str]] = ([], [])
        n = len(ERR_MARK)
        for ln in lines:
            err = ln.startswith(ERR_MARK)
            streams[err].append(ln[n if err else 0 :].decode("utf-8", "replace").rstrip("\r"))
        for stream, text in enumerate(streams, 1):
            if text or (skipped and stream == 1):
                msg = w.LogLines(
                    mesh, rank, self.label, text, skipped=skipped if stream == 1 else 0,
                    path=tail.path, stream=stream,
                )  # fmt: skip
                self._pub.send([owner, *self._codec.encode(msg)])

    # ------------------------------------------------------------ GetLogs

    def answer(self, msg: w.GetLogs) -> w.LogsReply:
        """A piece of one proc's log (see ``GetLogs``)."""
        mesh = self.meshes.get(msg.mesh)
        proc = mesh.procs.get(msg.rank) if mesh is not None else None
        if mesh is None or proc is None:
            error = f"no mesh named {msg.mesh!r} on {self.label}" if mesh is None else (
                f"no rank {msg.rank} in mesh {msg.mesh!r} on {self.label}"
            )  # fmt: skip
            return w.LogsReply(msg.id, ok=False, error=error)
        path = proc.log_path
        if msg.generation and msg.generation != proc.generation:
            path = _generation_path(path, proc.generation, msg.generation)
        try:
            size = os.stat(path).st_size
        except OSError as exc:
            return w.LogsReply(msg.id, ok=False, path=path, error=f"cannot read {path}: {exc}")
        # Offsets are into the log as if nothing had been cut from its head
        # (zmesh._host.agent.logcap): a reader that follows it keeps its place.
        current = self._tails.get((msg.mesh, msg.rank, proc.generation))
        shift = current.shift if current is not None and current.path == path else 0
        shift = shift or self._shifts.get(path, 0)
        start = msg.offset - shift if msg.offset >= 0 else msg.offset
        if msg.offset >= 0 and start < 0:
            start = 0  # cut already: from the marker on
        if start < 0:
            if msg.since:
                tail = self._tails.get((msg.mesh, msg.rank, proc.generation))
                start = _offset_since(tail, time.time() - msg.since) if tail else 0
            else:
                start = max(0, size - msg.limit)
        start = min(start, size)
        data = _read(path, start, min(msg.limit, size - start))
        if start and msg.offset < 0 and _read(path, start - 1, 1) != b"\n":
            cut = data.find(b"\n")  # we landed inside a line: begin at the next one
            data, start = (data[cut + 1 :], start + cut + 1) if cut >= 0 else (data, start)
        return w.LogsReply(
            msg.id, text=data.decode("utf-8", "replace"), offset=shift + start + len(data),
            size=shift + size, path=path, live=not proc.reaped,
        )  # fmt: skip


def _copy_stderr(tail: _Tail) -> None:
    """Append the stderr file's new whole lines to the log, each marked ``ERR_MARK``.

    At most ``COPY_MAX`` bytes a tick: a proc that floods its stderr gets
    into its log late, never out of the stderr file (which keeps it all).
    """
    path = stderr_path(tail.path)
    try:
        if os.stat(path).st_size <= tail.err_offset:
            return  # the usual tick: nothing new (a stat, not a read)
    except OSError:
        return  # a proc started without a stderr file of its own
    data = _read(path, tail.err_offset, COPY_MAX)
    if not data:
        return
    behind = os.stat(path).st_size - tail.err_offset
    if behind > _logcap.MAX:  # it floods faster than COPY_MAX: skip to its last KEEP bytes
        skip = behind - _logcap.KEEP
        tail.err_offset += skip
        tail.err_partial = b""
        data = _read(path, tail.err_offset, COPY_MAX)
        cut = data.find(b"\n") + 1  # from the next whole line
        tail.err_offset, data = tail.err_offset + cut, data[cut:]
        note = f"[zmesh] {skip + cut} bytes of stderr were dropped here (not copied in time)"
        with contextlib.suppress(OSError), open(tail.path, "ab") as f:
            f.write(b"\n" + ERR_MARK + note.encode() + b"\n")
    tail.err_offset += len(data)
    if tail.err_offset > _logcap.KEEP:  # what is copied need not stay in the stderr file
        tail.err_offset -= _logcap.trim(path, tail.err_offset)
    *lines, tail.err_partial = (tail.err_partial + data).split(b"\n")
    if len(tail.err_partial) > MAX_LINE:
        lines.append(tail.err_partial)
        tail.err_partial = b""
    if lines:
        block = b"".join(ERR_MARK + ln + b"\n" for ln in lines)
        # A stdout line the proc left open ("loading...", no newline yet) ends
        # here: glued onto it, the block's first line would lose its mark (and
        # reach the owner's stdout, the mark inside).
        if _ends_open(tail.path):
            block = b"\n" + block
        with contextlib.suppress(OSError), open(tail.path, "ab") as f:
            f.write(block)


def _ends_open(path: str) -> bool:
    """Whether the file at ``path`` ends inside a line (not empty, no final newline)."""
    try:
        with open(path, "rb") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False


def _offset_since(tail: _Tail, when: float) -> int:
    """Where the log stood at wall time ``when``: the size noted just before it grew after."""
    times = [t for t, _ in tail.marks]
    i = bisect.bisect_left(times, when)
    if i == 0:
        return 0 if len(tail.marks) < CHECKPOINTS else tail.marks[0][1]
    return tail.marks[i - 1][1]


def _generation_path(path: str, have: int, want: int) -> str:
    suffix = f".g{have}.log"
    return path[: -len(suffix)] + f".g{want}.log" if path.endswith(suffix) else path


def _read(path: str, offset: int, n: int) -> bytes:
    if n <= 0:
        return b""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)
    return b""
