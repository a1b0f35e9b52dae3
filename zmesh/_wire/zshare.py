"""A socket shared with one other thread: a proc's actor thread sends its own answers.

A ZeroMQ socket is not thread-safe. ``AsyncSocket`` (``zmesh._wire.zsock``)
belongs to its loop's thread; after ``share()`` one other thread may send on
it too (``send_from_thread``), and every use of the socket then holds its
lock. The loop sleeps on the edge of ``ZMQ_FD``, which a send from the other
thread may take: that send reads ``EVENTS`` after it and wakes the loop if
input waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import zmq

_get = cast("Callable[[Any, int], int]", zmq.backend.Socket.get)  # EVENTS is an int
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_Frame = zmq.Frame


def _check_buffers(frames: list[Any]) -> None:
    """Refuse, before any part goes out, a part ZeroMQ could not take.

    A part failing after the first would leave the socket in the middle of
    a message, and the next message would be glued onto it.

    Raises:
        BufferError: a part is not one contiguous block of memory.
    """
    for f in frames:
        t = type(f)
        if t is not bytes and t is not _Frame and not memoryview(f).c_contiguous:
            raise BufferError("a buffer sent as a frame must be contiguous")


class ThreadSend:
    """The part of ``AsyncSocket`` that lets one other thread send on it."""

    if TYPE_CHECKING:  # the socket's own, set by AsyncSocket.__init__
        sock: Any
        loop: asyncio.AbstractEventLoop
        closed: bool
        sent: int
        unroutable: int
        _pending: deque[list[Any]]
        _outbox: dict[bytes | None, list[bytes]]

        def _send_parts(self, frames: list[Any]) -> None: ...
        def recheck(self) -> None: ...

    # Held around every use of the socket once another thread may send on
    # it too (``share``); None before, so an unshared socket pays nothing.
    lock: threading.RLock | None = None

    def share(self) -> None:
        """Let one other thread send on this socket (``send_from_thread``)."""
        if self.lock is None:
            self.lock = threading.RLock()

    def guard(self) -> contextlib.AbstractContextManager[Any]:
        """Hold this while using ``sock`` directly (its lock, once shared)."""
        return self.lock if self.lock is not None else contextlib.nullcontext()

    def send_from_thread(self, frames: list[Any], claim: Callable[[], bool]) -> bool:
        """Send ``frames`` from a thread that is not the loop's (``share`` first),
        if ``claim()``, called under the socket's lock, says so; whether they went.

        Not when anything waits to go out before them (queued at the
        high-water mark, or in a batch), which keeps this peer's order, nor
        when a part is not one block of memory: ``claim`` is then not called,
        and the caller sends through the loop. The send may take the edge of
        input the loop sleeps on, so it wakes the loop itself when input
        waits (or when the message had to wait); the loop ``recheck``s
        afterwards all the same.
        """
        lock = self.lock
        assert lock is not None, "share() the socket first"
        with lock:
            if self.closed or self._pending or self._outbox:
                return False
            try:
                _check_buffers(frames)
            except (BufferError, TypeError):
                return False
            if not claim():
                return False
            try:
                self._send_parts(frames)
                self.sent += 1
            except zmq.Again:  # (only part one can fail): the loop sends it when it can
                self._pending.append(frames)
                self._wake()  # for the loop to send it when it can
            except zmq.ZMQError as exc:  # claimed, so never raised into the thread:
                if exc.errno == zmq.EHOSTUNREACH:  # ROUTER_MANDATORY: the peer is gone
                    self.unroutable += 1
                # (else the socket is ending with its proc: nobody is left to answer)
            self._wake_for_input()
        return True

    def _wake_for_input(self) -> None:
        """After a send from another thread (under the lock): wake the loop if
        input waits. The send may have taken the edge of ``ZMQ_FD`` the loop
        sleeps on, and nothing else may wake it (measured: messages from a
        peer waited 0.2-0.9 s, most of them). Read here, ``EVENTS`` takes any
        edge too, so no input is left behind unseen: if none waits, the next
        message makes a new edge."""
        try:
            waiting = _get(self.sock, _EVENTS) & _POLLIN
        except zmq.ZMQError:  # the socket is ending
            return
        if waiting:
            self._wake()

    def _wake(self) -> None:
        """From another thread: have the loop look at the socket now."""
        try:
            self.loop.call_soon_threadsafe(self.recheck)
        except RuntimeError:  # the loop is closed: the proc is ending
            pass
