"""The log cap on both kinds of filesystem: cut in place (ext4, XFS) or copied (tmpfs)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from zmesh._host.agent import logcap

MiB = 1 << 20


@pytest.fixture(params=["here", "tmpfs"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    if request.param == "here":
        yield tmp_path
        return
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm (tmpfs) here")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        yield Path(d)


def test_a_log_over_its_cap_keeps_its_last_lines_after_a_marker(where: Path) -> None:
    path = where / "m.0.g1.log"
    lines = [f"line {i} {'x' * 90}\n".encode() for i in range(40_000)]  # ~4 MiB
    path.write_bytes(b"".join(lines))
    size = path.stat().st_size
    assert logcap.cap(str(path), 0, limit=5 * MiB, keep=MiB) == 0  # under the cap: untouched
    moved = logcap.cap(str(path), 1000, limit=2 * MiB, keep=MiB)
    data = path.read_bytes()
    assert 0 < moved < size and len(data) == size - moved
    head, rest = data.split(b"\n", 1)
    assert head.startswith(b"[zmesh] ") and b"bytes of this log were dropped" in head, head
    assert int(head.split()[1]) >= 1000 + moved
    assert rest.endswith(lines[-1]) and MiB - 200 <= len(data) <= MiB + 8192
    kept = rest.split(b"\n")[:-1]
    first = int(kept[0].split()[1])  # whole lines, in order, up to the last
    assert [ln + b"\n" for ln in kept] == lines[first:]
    # Appends after the cut land after the kept lines (O_APPEND writers go on).
    with open(path, "ab") as f:
        f.write(b"after\n")
    assert path.read_bytes().endswith(lines[-1] + b"after\n")


def test_trim_removes_what_was_read(where: Path) -> None:
    path = where / "m.0.g1.err"
    path.write_bytes(b"a" * (3 * MiB) + b"tail\n")
    moved = logcap.trim(str(path), 3 * MiB)
    data = path.read_bytes()
    assert 0 < moved <= 3 * MiB and data.endswith(b"tail\n") and len(data) == 3 * MiB + 5 - moved
