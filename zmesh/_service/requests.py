"""What the dispatcher routes: requests, their attempts, and the replicas' slots.

Plain records with no behaviour of their own beyond counting; the rules are
``zmesh._service.dispatch``'s.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Any

from zmesh._service.routing import (
    LATENCY_WINDOW,
    RECOVERING,
    ReplicaStatistics,
    ServiceConfig,
    Session,
)


class Outcome(enum.Enum):
    """How one attempt ended, as the shell reports it."""

    OK = "ok"  # every rank answered: the value is rank return_rank's
    ERROR = "error"  # the endpoint raised (or another error that is the request's own)
    BROKEN = "broken"  # the replica broke under it (SupervisionError, ActorStoppedError)


class Slot:
    """One replica as the dispatcher sees it: its state and its counters."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.state = RECOVERING  # until its first generation is up
        self.generation = 0
        self.in_flight = 0  # attempts holding a slot
        self.queue: deque[Request] = deque()
        self.completed = 0
        self.failed = 0
        self.retried = 0
        self.restarts = 0  # kept by the supervisor
        self.sent = 0  # to the current generation
        self.sent_after_failure = 0
        self.last_failure = ""
        self.answers = 0  # anything the replica answered (progress: it is alive)
        self.unready_since = 0.0  # when it became UNREADY (the dispatcher's clock)
        self.latencies: deque[tuple[float, float]] = deque(maxlen=20_000)

    def has_room(self, cfg: ServiceConfig) -> bool:
        return self.in_flight < cfg.max_concurrent_requests or len(self.queue) < cfg.max_queue

    def statistics(self, now: float | None = None) -> ReplicaStatistics:
        """Its record; with ``now`` (the dispatcher's clock), p50/p99 too."""
        p50 = p99 = None
        if now is not None:
            horizon = now - LATENCY_WINDOW
            # A snapshot first: statistics() may run on another thread (sync
            # code) while the loop appends, and iterating a deque that changes
            # raises RuntimeError.
            window = sorted(dt for t, dt in tuple(self.latencies) if t >= horizon)
            if window:
                p50 = window[len(window) // 2]
                p99 = window[min(len(window) - 1, int(len(window) * 0.99))]
        return ReplicaStatistics(
            self.index, self.state, self.generation, self.in_flight, len(self.queue),
            self.completed, self.failed, self.retried, self.restarts, self.sent,
            self.sent_after_failure, p50, p99, self.last_failure,
        )  # fmt: skip


class Request:
    """One call of a service endpoint, over all its attempts."""

    __slots__ = (
        "args", "attempt", "attempts", "deadline", "done", "endpoint", "id", "items",
        "least_loaded", "on", "pinned", "retry", "sent_once", "session", "sink", "start",
        "stream",
    )  # fmt: skip

    def __init__(
        self,
        req_id: str,
        endpoint: str,
        deadline: float,
        *,
        retry: bool = True,
        session: Session | None = None,
        pinned: int | None = None,
        least_loaded: bool = False,
        args: Any = None,
        sink: Any = None,
        start: float = 0.0,
        stream: bool = False,
    ) -> None:
        self.id = req_id  # the same on every attempt: actors deduplicate by it
        self.endpoint = endpoint
        self.deadline = deadline  # on the dispatcher's clock
        self.retry = retry
        self.session = session
        self.pinned = pinned  # a fan-out request: this replica or nothing
        self.least_loaded = least_loaded  # ``choose``: the least loaded, whatever the router
        self.args = args  # what the shell sends (opaque here)
        self.sink = sink  # where the shell puts the result (opaque here)
        self.start = start
        self.stream = stream  # a generator endpoint's items: see ``item``
        self.items = 0  # of a stream: items its reader was given
        self.attempt: Attempt | None = None  # the live attempt, if one is in flight
        self.on: Slot | None = None  # the replica of the latest attempt
        self.attempts = 0
        self.sent_once = False
        self.done = False


class Attempt:
    """One send of a request to one generation of one replica.

    It holds one of the replica's slots until ``Dispatcher.settled`` is
    called for it, exactly once, when the replica answers or breaks.
    """

    __slots__ = ("generation", "held", "request", "slot")

    def __init__(self, request: Request, slot: Slot) -> None:
        self.request = request
        self.slot = slot
        self.generation = slot.generation
        self.held = True
