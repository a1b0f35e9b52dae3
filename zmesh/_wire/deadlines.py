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

Time on the wire is counted without comparing clocks either. Each request
also says when it was sent on its sender's ``time.monotonic()`` (``sent``).
The proc keeps, per sender's clock (``clock``: a random number each process
sends, ``CLOCK``), the smallest ``arrival - sent`` it has seen lately (``transit``): that is
the two clocks' offset plus the quickest trip. A request whose
``arrival - sent`` is larger by ``d`` spent ``d`` more on the way (held
in a queue during a partition, say), and its deadline is ``d`` sooner.
Two monotonic clocks never step, so neither a wall clock set 120 s ahead
nor one stepped by NTP moves a deadline; the minimum is renewed every
``WINDOW`` so a sender's drift or restart does not pile up. A sender's
clock's first request, with no minimum yet, counts no time on the wire: a proc may
then start a request its caller gave up a moment ago (the answer is
dropped, its caller's own timer fired on time), but it never refuses one
that still has time because two clocks disagree.
"""

from __future__ import annotations

import random
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
    """``msg`` (a ``Call`` or ``GroupCall`` just read, with a budget) now holds
    its deadline on this process's ``time.monotonic()``, less the time it
    spent on the way (``transit``)."""
    now = _monotonic()
    late = transit(msg.clock, msg.sent, now) if msg.sent else 0.0
    force_setattr(msg, "deadline", now + msg.deadline - late)


WINDOW = 30.0  # seconds a sender's smallest offset is kept before it is renewed
SENDERS = 4096  # senders' clocks remembered, at most (the oldest is forgotten)
# This process's clock, as its messages name it: all its sockets share
# time.monotonic(), and so does a forked child (one host, one clock).
CLOCK = random.getrandbits(31) | 1
# clock -> [smallest offset of this window and the last, of this window, window start]
_offsets: dict[int, list[float]] = {}


def transit(clock: int, sent: float, now: float | None = None) -> float:
    """Seconds a message ``sent`` on the sender's monotonic clock ``clock``
    spent on the way beyond the quickest trip seen lately; 0 for a clock's
    first message."""
    now = _monotonic() if now is None else now
    offset = now - sent
    seen = _offsets.get(clock)
    if seen is None:
        if len(_offsets) >= SENDERS:
            del _offsets[next(iter(_offsets))]
        _offsets[clock] = [offset, offset, now]
        return 0.0
    if now - seen[2] > WINDOW:  # the older minimum retires; this window's stays
        seen[0], seen[1], seen[2] = seen[1], offset, now
    if offset < seen[0]:
        seen[0] = offset
    if offset < seen[1]:
        seen[1] = offset
    return offset - seen[0]
