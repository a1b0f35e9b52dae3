"""What the dispatcher decides, for the service client to carry out: send, settle, replace, wake.

Every method of ``Dispatcher`` (``dispatch.py``) that an event reaches
returns the decisions it made, in order, and calls nothing back: the
client (``client.py``) carries them out (it sends an attempt, gives a
caller its answer, tells the supervisor of a failed replica, wakes a
fan-out waiting for one) and reports what then happens (a reply, a
failure, a timeout) as the next event. So control flows one way, and the
rules are tested by what a method returns, with no process behind them
(tests/unit/test_dispatch_decisions.py).
"""

from __future__ import annotations

from typing import Any, TypeAlias

import msgspec

from zmesh._service.requests import Attempt, Request


class Send(msgspec.Struct, frozen=True):
    """Send ``attempt`` to its replica (``attempt.slot``, ``attempt.generation``).

    The client reports its end to ``Dispatcher.settled`` exactly once; or,
    when the replica left routing before the send (an earlier decision of
    the same batch found it broken), hands it back with ``Dispatcher.unsent``.
    """

    attempt: Attempt


class Settle(msgspec.Struct, frozen=True):
    """``request`` ended: its caller gets ``error`` if there is one, else ``value``.

    Made exactly once per request. For a stream request, an ``error`` also
    closes its call if one is still open (its slot came back already).
    """

    request: Request
    error: BaseException | None
    value: Any = None


class Failed(msgspec.Struct, frozen=True):
    """Generation ``generation`` of replica ``index`` failed (once per generation):
    the supervisor replaces it, a client away from it re-reads the table."""

    index: int
    generation: int
    reason: str


class Changed(msgspec.Struct, frozen=True):
    """A replica came up or went for good, or the service stopped: a fan-out
    waiting for a replica looks again."""


CHANGED = Changed()

Decision: TypeAlias = Send | Settle | Failed | Changed
