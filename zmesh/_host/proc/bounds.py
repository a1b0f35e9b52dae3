"""A proc's bounds on what its callers can queue in it, and its drop counts for its stats.

A proc reads no further from its ROUTER while its mailboxes (and batchers)
hold ``MAX_BACKLOG`` calls or ``MAX_BACKLOG_BYTES`` of them, and reads again
at half of both (``ProcServer.took``/``started``): a caller flooding an
actor meets backpressure (ZeroMQ's pipes, then its own in-flight limit,
``OverloadedError`` with ``block=False``), never a proc that grows without
bound. The bytes of a call are those of its frames and pickle blob and of
its top-level ``str`` arguments (a large ``bytes`` or buffer argument is a
frame of its own): what dominates a large call.
"""

from __future__ import annotations

import os
from typing import Any

from zmesh._client.ports import portsockets as _portsockets
from zmesh._wire import messages as w

MAX_BACKLOG = int(os.environ.get("ZMESH_PROC_MAX_BACKLOG", "100000"))
MAX_BACKLOG_BYTES = int(os.environ.get("ZMESH_PROC_MAX_BACKLOG_BYTES", str(1 << 30)))
_BASE = 64  # an envelope's bytes, roughly, beyond what is counted


def call_bytes(call: w.Call, frames: list[Any]) -> int:
    """The bytes a queued ``call`` holds, as this bound counts them."""
    n = _BASE + sum(memoryview(f).nbytes for f in frames)
    payload = call.payload
    if payload.blob is not None:
        n += len(payload.blob)
    for arg in payload.args:
        if isinstance(arg, str):  # (a large bytes argument is one of the frames)
            n += len(arg)
    return n


_said: set[int] = set()  # procs (by id) that logged their first pause


def first_pause(server: Any) -> bool:
    """Whether this is the first time ``server`` stops reading: said once, not per pause."""
    if id(server) in _said:
        return False
    _said.add(id(server))
    return True


def counts(server: Any) -> dict[str, int]:
    """The bound-related counts of a ``ProcServer`` for its ``ProcStatistics``."""
    return {
        "port_dropped": _portsockets.dropped_values(),
        "port_refused": _portsockets.refused_values(),
        "backlog_bytes": server.backlog_bytes,
    }
