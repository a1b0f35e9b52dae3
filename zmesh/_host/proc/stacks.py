"""Stacks of a live proc, on request: the proc's half and the agent's half.

At start, a proc registers ``faulthandler`` on ``SIGUSR1``: on the signal,
the stack of every thread is written to a private file next to the proc's
log (``<mesh>.<rank>.g<gen>.stack``, mode 0600). faulthandler writes from the
C signal handler itself, without taking the GIL and without running Python
code, so the dump comes even while a thread spins in pure Python or sits in
a blocking call of a sync endpoint.

``zmesh stack`` asks the agent (the proc's parent, so it may signal it),
which truncates the file, sends the signal and polls the file on its loop
until the dump stops growing, then answers with the text.

The file is registered before it gets its final name, so the agent signals
a proc only once the file exists: a proc that has not registered yet (still
starting, or of an older zmesh) is never killed by a ``SIGUSR1`` it did not
expect.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from zmesh._wire import messages as w

SIGNAL = signal.SIGUSR1
MAX_BYTES = 256 * 1024  # a dump larger than this is cut (faulthandler caps at 100 threads)
WAIT = 1.0  # seconds the agent waits for a dump
POLL = 0.02

_tasks: set[asyncio.Task[Any]] = set()
_locks: dict[str, asyncio.Lock] = {}  # one dump at a time per stack file


class StackUnavailable(Exception):
    """The proc cannot dump its stack, or did not within ``WAIT`` seconds."""


def stack_path(log_path: str) -> str:
    """The stack file of the proc whose log is ``log_path``."""
    root, _ = os.path.splitext(log_path)
    return root + ".stack"


def install(log_path: str) -> None:
    """In a proc, at start: make ``SIGUSR1`` dump every thread's stack to the stack file.

    Raises:
        OSError: the file cannot be made; the proc runs on, without stacks.
    """
    path = stack_path(log_path)
    tmp = f"{path}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(tmp, flags, 0o600)
    # O_APPEND: after the agent truncates the file, the next dump starts at
    # offset 0 instead of where the last one ended (no hole of NUL bytes).
    faulthandler.register(SIGNAL, file=fd, all_threads=True, chain=False)
    os.replace(tmp, path)  # only now may the agent signal us


async def dump(
    path: str, send_signal: Callable[[], None], *, not_before: float = 0.0, wait: float = WAIT
) -> tuple[str, bool]:
    """Signal a proc and read its dump: ``(text, truncated)``. Runs on the agent's loop.

    Args:
        not_before: wall clock when the proc started: a stack file last
            changed before it belongs to an earlier process of that name.

    Raises:
        StackUnavailable: no stack file (the proc has not registered), or no
            dump within ``wait`` seconds.
    """
    # Two requests at once for one proc would empty the file under each other.
    # (A lock per proc that was ever asked: a few bytes each.)
    async with _locks.setdefault(path, asyncio.Lock()):
        return await _dump(path, send_signal, not_before, wait)


async def _dump(
    path: str, send_signal: Callable[[], None], not_before: float, wait: float
) -> tuple[str, bool]:
    try:
        if os.stat(path).st_ctime < not_before - 1.0:  # 1 s: clocks of two kinds
            raise FileNotFoundError(path)
        os.truncate(path, 0)
    except FileNotFoundError:
        raise StackUnavailable("the proc has not set up stack dumps (still starting?)") from None
    except OSError as exc:
        raise StackUnavailable(f"cannot reset {path}: {exc}") from exc
    send_signal()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    last = -1
    while loop.time() < deadline:
        await asyncio.sleep(POLL)
        size = os.stat(path).st_size
        if size > 0 and size == last:
            break  # one poll without growth: faulthandler writes the whole dump at once
        last = size
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if not data:
        raise StackUnavailable(f"the proc wrote no stack within {wait:g}s")
    return data[:MAX_BYTES].decode("utf-8", "replace"), len(data) > MAX_BYTES


async def reply(
    req_id: int,
    where: str,
    pid: int,
    log_path: str,
    send_signal: Callable[[], None],
    not_before: float,
) -> w.StackReply:
    """The agent's answer to a ``GetStack`` for the live proc ``pid``, ``where``
    (``mesh[rank] on host``) it runs: its dump, or why there is none."""
    try:
        text, cut = await dump(stack_path(log_path), send_signal, not_before=not_before)
        return w.StackReply(req_id, text=text, pid=pid, truncated=cut)
    except StackUnavailable as exc:
        error = f"{where} (pid {pid}): {exc} (log: {log_path})"
        return w.StackReply(req_id, ok=False, error=error, pid=pid)


def background(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` on the running loop, keeping a reference until it ends."""
    task = asyncio.get_running_loop().create_task(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
