"""Deadlines between processes: a budget on the wire, a monotonic deadline at each end.

Two machines' wall clocks need not agree (a replica whose clock ran 120 s
ahead once found every request "too late"), and one process's monotonic
clock means nothing to another. So a request's ``deadline`` field carries,
on the wire, the seconds its caller will still wait when it is sent (its
remaining *budget*; 0: no deadline), and each process keeps deadlines on
its own ``time.monotonic()``:

* a sender turns its monotonic deadline into a budget as it builds the
  message (``budget``);
* a proc turns the budget back into a deadline on its own clock as it reads
  the message (``arrive``), and skips the request if it takes it off its
  queue after that.

Time on the wire (or in a relay) is not counted against the budget: a proc
may start a request its caller gave up a moment ago (the answer is dropped,
and the caller's own timer fired on time), but it never refuses one that
still has time because two clocks disagree.
"""

from __future__ import annotations

import time
from typing import Any

from msgspec.structs import force_setattr

# The budget of a request whose deadline passed before it was sent: not 0
# (which means "no deadline"), so the proc finds it late at once.
SPENT = 1e-9
_monotonic = time.monotonic


def budget(deadline: float) -> float:
    """The wire value for ``deadline`` (``time.monotonic()``; 0: none): seconds left."""
    if not deadline:
        return 0.0
    left = deadline - _monotonic()
    return left if left > SPENT else SPENT


def arrive(msg: Any) -> None:
    """``msg`` (a ``Call`` or ``GroupCall`` just read, with a budget) now holds its
    deadline on this process's ``time.monotonic()``."""
    force_setattr(msg, "deadline", _monotonic() + msg.deadline)
