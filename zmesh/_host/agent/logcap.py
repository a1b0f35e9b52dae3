"""A cap on a proc's log file: it keeps its last ``KEEP`` bytes once it passes ``MAX``.

A proc printing at full speed writes tens of MB a second to its log, which
no one rotates. The agent checks each log's size every tick; past ``MAX``
(``ZMESH_LOG_MAX_BYTES``, 64 MiB) it cuts the head of the file so that about
``KEEP`` (half of ``MAX``) remains, and the first line left says how many
bytes were dropped before it:

    [zmesh] 123456789 bytes of this log were dropped here (it keeps its last 32 MiB)

The proc writes with ``O_APPEND`` and never stops. On filesystems that can
(ext4, XFS) the head is removed in place with ``fallocate``'s
``FALLOC_FL_COLLAPSE_RANGE``, atomically with respect to the proc's
appends: nothing it writes is lost or reordered. Elsewhere (tmpfs, ...) the
kept tail is copied to the start and the file truncated: lines the proc
writes during that copy (milliseconds) may be lost.

Readers keep their offsets: ``cap`` returns how far the kept bytes moved, and
the agent adds the total to every offset it hands out (``zmesh._host.agent.logtail``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
from typing import Any

log = logging.getLogger("zmesh.agent")

MAX = int(os.environ.get("ZMESH_LOG_MAX_BYTES", str(64 << 20)))
KEEP = MAX // 2
_COLLAPSE_RANGE = 0x08  # FALLOC_FL_COLLAPSE_RANGE (linux/falloc.h)
_HEAD = 64 << 10  # how far into the kept part the marker may extend, to end at a newline

_libc: Any = None
_can_collapse: dict[int, bool] = {}  # by st_dev: whether its filesystem can


def _fallocate() -> Any:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            _libc.fallocate.argtypes = [
                ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong,
            ]  # fmt: skip
        except (OSError, AttributeError):
            _libc = False
    return _libc.fallocate if _libc else None


def marker(dropped: int, keep: int = KEEP) -> bytes:
    """The line that starts a capped log (without its padding and newline)."""
    return (
        f"[zmesh] {dropped} bytes of this log were dropped here "
        f"(it keeps its last {keep >> 20} MiB)"
    ).encode()


def cap(path: str, dropped: int = 0, limit: int = MAX, keep: int = KEEP) -> int:
    """Cut the head of the log at ``path`` if it is over ``limit`` bytes.

    Args:
        dropped: bytes this log dropped before (the marker says the total).

    Returns:
        how many bytes the kept content moved towards the start (0: nothing
        done); a reader's offset into the old file is that much less now.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return 0
    try:
        st = os.fstat(fd)
        if st.st_size <= limit:
            return 0
        if _can_collapse.get(st.st_dev, True):
            moved = _collapse(fd, st, dropped, keep)
            if moved:
                return moved
        return _copy(fd, st.st_size, dropped, keep)
    except OSError as exc:
        log.warning("cannot cap the log %s: %r", path, exc)
        return 0
    finally:
        os.close(fd)


def _collapse(fd: int, st: os.stat_result, dropped: int, keep: int) -> int:
    """Remove the head in place; 0 if this filesystem cannot."""
    fallocate = _fallocate()
    block = st.st_blksize or 4096
    cut = (st.st_size - keep) // block * block
    if fallocate is None or cut <= 0:
        return 0
    if fallocate(fd, _COLLAPSE_RANGE, 0, cut) != 0:
        err = ctypes.get_errno()
        if err in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            _can_collapse[st.st_dev] = False  # copy from now on, on this filesystem
            return 0
        raise OSError(err, os.strerror(err))
    _mark(fd, dropped + cut)
    return cut


def trim(path: str, upto: int) -> int:
    """Remove about the first ``upto`` bytes of ``path`` (no marker: the agent
    has read them already); returns how far the rest moved (0: nothing done)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return 0
    try:
        st = os.fstat(fd)
        upto = min(upto, st.st_size)
        block = st.st_blksize or 4096
        fallocate = _fallocate()
        cut = upto // block * block
        if (
            cut
            and cut < st.st_size
            and fallocate is not None
            and _can_collapse.get(st.st_dev, True)
        ):
            if fallocate(fd, _COLLAPSE_RANGE, 0, cut) == 0:
                return cut
            if ctypes.get_errno() not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                return 0
            _can_collapse[st.st_dev] = False
        rest = os.pread(fd, st.st_size - upto, upto)
        os.ftruncate(fd, 0)
        os.pwrite(fd, rest, 0)
        return upto
    except OSError as exc:
        log.warning("cannot trim %s: %r", path, exc)
        return 0
    finally:
        os.close(fd)


def _mark(fd: int, dropped: int) -> None:
    """Overwrite the (partial) first line(s) with the marker, padded to end on a newline."""
    text = marker(dropped)
    head = os.pread(fd, _HEAD, 0)
    end = head.find(b"\n", len(text))
    if end < 0:
        end = len(head) - 1 if len(head) > len(text) else len(text)
    os.pwrite(fd, text + b" " * (end - len(text)) + b"\n", 0)


def _copy(fd: int, size: int, dropped: int, keep: int) -> int:
    """Copy the kept tail to the start and truncate (filesystems without collapse)."""
    start = size - keep
    tail = os.pread(fd, keep, start)
    cut = tail.find(b"\n") + 1  # begin at a whole line
    tail = tail[cut:]
    start += cut
    head = marker(dropped + start) + b"\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, head + tail, 0)
    return start - len(head)
