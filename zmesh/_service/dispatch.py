"""The dispatcher: which replica each request goes to, and what happens next.

No sockets, no event loop, no clock of its own, and no callbacks: each
event the I/O shell (``zmesh._service.client``) feeds it returns the
decisions it made (``decisions.py``: ``Send``, ``Settle``, ``Failed``,
``Changed``), which the shell carries out, reporting what follows as the
next event. So it can be tested with any order of replies, failures and
timeouts (tests/unit/test_dispatch_properties.py), and each rule by what
one event returns (tests/unit/test_dispatch_decisions.py). What a replica's
change of state does is in ``replicastates.py``, a part of the dispatcher.
Its rules:

* a request goes to a replica that is HEALTHY in the generation the
  dispatcher knows, never to one known failed (``sent_after_failure`` counts
  violations and stays 0);
* at most ``max_concurrent_requests`` attempts hold a replica's slots, and at
  most ``max_queue`` requests wait for it; beyond both, overload at once;
* an attempt keeps its slot until its replica answers or breaks, even after
  its caller timed out: the proc is still running it;
* a request whose replica breaks under it is re-sent elsewhere (at least
  once), unless its endpoint opted out (``retry=False``) or it was pinned to
  that replica (a fan-out); requests queued on a failed replica always move;
* every request ends exactly once: an answer, an error, or its timeout;
* a session is bound to a replica *generation*: when that generation is gone
  the session is rebound (``rebinds``, ``rebound``) or, if strict, its call
  fails with ``SessionLostError``;
* a stream request (a generator endpoint) holds its slot while the stream is
  open, so it counts as load; a replica that breaks before the stream's first
  item moves it like any request, but once an item reached the reader it is
  never re-sent (its items would repeat): it ends with
  ``StreamInterruptedError``. Its deadline bounds the wait for the first
  item only; after that the reader's own per-item timeout applies.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from zmesh._errors import (
    ActorStoppedError,
    CallTimeoutError,
    ServiceError,
    ServiceOverloadedError,
    SessionLostError,
    StreamInterruptedError,
    SupervisionError,
    ZmeshError,
)
from zmesh._service.decisions import CHANGED, Decision, Send, Settle
from zmesh._service.replicastates import ReplicaStates
from zmesh._service.requests import Attempt, Outcome, Request, Slot
from zmesh._service.routing import (
    HEALTHY,
    STOPPED,
    LeastLoadedRouter,
    Router,
    ServiceConfig,
)

__all__ = ["Attempt", "Decision", "Dispatcher", "Outcome", "Request", "Slot"]


class Dispatcher(ReplicaStates):
    """Routes requests over replicas; told of replies, failures and timeouts.

    Each event method returns the decisions it made, in the order the
    shell must carry them out (``decisions.py``); it calls nothing back.

    Args:
        name: the service's name, for errors.
        replicas: how many replicas.
        config: the limits and ``return_rank``.
        router: picks among the candidates of a routed request.
        clock: the time deadlines are on (the shell's loop time).
    """

    def __init__(
        self,
        name: str,
        replicas: int,
        config: ServiceConfig,
        router: Router,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self.config = config
        self.router = router
        self.clock = clock
        self.slots = [Slot(i) for i in range(replicas)]
        self.waiting: deque[Request] = deque()  # no healthy replica yet
        self._least = LeastLoadedRouter()
        self.completed = 0
        self.failed = 0
        self.retried = 0
        self.stopped = False
        # Set when a replica was stopped because the process that made the
        # service is gone (``owner_gone``): why nothing will replace replicas.
        self.orphaned = ""
        # The decisions of the event being handled: each event method returns
        # them (``_take``). Nothing of the shell's runs while one is handled
        # (the shell acts on them afterwards), so one list will do.
        self._out: list[Decision] = []

    def _take(self) -> list[Decision]:
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------ stopping

    def stop(self) -> list[Decision]:
        """No more work: what waits fails with ``ActorStoppedError``.

        Attempts in flight end as their replicas are stopped (``settled``
        with BROKEN): they are not re-sent.
        """
        self.stopped = True
        stopped = ActorStoppedError(f"service {self.name} was stopped", mesh=self.name)
        waiting = list(self.waiting)
        self.waiting.clear()
        for slot in self.slots:
            waiting.extend(slot.queue)
            slot.queue.clear()
            slot.state = STOPPED
        for req in waiting:
            self._finish(req, None, stopped)
        self._out.append(CHANGED)
        return self._take()

    # ------------------------------------------------------------ requests

    def submit(self, req: Request) -> list[Decision]:
        """A new request: route it (or fail it at once: stopped, overloaded)."""
        if self.stopped:
            self._finish(
                req, None, ActorStoppedError(f"service {self.name} was stopped", mesh=self.name)
            )
        else:
            self._dispatch(req)
        return self._take()

    def settled(self, attempt: Attempt, outcome: Outcome, value: Any = None) -> list[Decision]:
        """``attempt`` ended: with its value (OK) or an exception."""
        self._settled(attempt, outcome, value)
        return self._take()

    def unsent(self, attempt: Attempt) -> list[Decision]:
        """The shell did not send ``attempt``: its replica left routing after
        the decision (an earlier decision of the same batch found it broken).

        It was never sent, so, as a request queued there, it goes elsewhere
        whatever its ``retry``; it does not count as an attempt.
        """
        if attempt.held:
            attempt.held = False
            slot, req = attempt.slot, attempt.request
            slot.in_flight -= 1
            slot.sent -= 1
            req.attempts -= 1
            req.sent_once = req.attempts > 0
            if req.attempt is attempt:
                req.attempt = None
                self._dispatch(req)
            self._pump(slot)
        return self._take()

    def _settled(self, attempt: Attempt, outcome: Outcome, value: Any) -> None:
        if not attempt.held:
            return  # settled already
        attempt.held = False
        slot, req = attempt.slot, attempt.request
        slot.in_flight -= 1
        if outcome is not Outcome.BROKEN:
            slot.answers += 1
        live = req.attempt is attempt
        if live:
            req.attempt = None
        if outcome is Outcome.BROKEN:
            # The replica broke (or is being replaced): not the request's fault.
            self._replica_failed(slot.index, attempt.generation, str(value), True)
            if live and req.items and not self.stopped:
                # Re-sending it would repeat the items its reader has.
                slot.failed += 1
                self._finish(req, slot, _interrupted(self.name, attempt, value))
                self._pump(slot)
                return
        if live:
            if outcome is Outcome.OK:
                slot.completed += 1
                now = self.clock()
                slot.latencies.append((now, now - req.start))
                self._finish(req, slot, None, value)
            elif outcome is Outcome.BROKEN and req.retry and req.pinned is None:
                if self.stopped:
                    slot.failed += 1
                    self._finish(req, slot, value)
                else:
                    slot.retried += 1
                    self.retried += 1
                    self._dispatch(req)
            else:
                slot.failed += 1
                self._finish(req, slot, value)
        self._pump(slot)

    def item(self, attempt: Attempt) -> None:
        """An item of ``attempt``'s stream reached its reader."""
        attempt.slot.answers += 1
        if attempt.held and attempt.request.attempt is attempt:
            attempt.request.items += 1

    def alive(self, attempt: Attempt) -> None:
        """``attempt``'s stream waits for its reader's credit: progress of its
        replica, which must not be judged silent for a reader that pauses."""
        attempt.slot.answers += 1

    def cancel(self, req: Request) -> list[Decision]:
        """The reader of a stream stopped reading: ``req`` ends (without an error).

        Its live attempt gives its slot back now (the shell closes the
        generator); a request not sent yet leaves its queue.
        """
        if req.attempt is not None:
            self._settled(req.attempt, Outcome.OK, None)
        elif not req.done:
            self._unqueue(req)
            self._finish(req, None, None, None)
        return self._take()

    def expire(self, req: Request) -> list[Decision]:
        """``req``'s deadline passed: its caller gets a timeout now.

        An attempt in flight keeps its replica's slot until the replica
        answers it (see ``settled``), except a stream's: the shell closes
        its call as it settles it with the error, so the slot comes back
        now. A stream that has delivered items is not timed out here: its
        reader waits for each item with its own timeout.
        """
        if req.done or req.items:
            return []
        attempt = req.attempt
        if attempt is None:
            self._unqueue(req)
            self._finish(req, None, _timeout_error(self.name, req))
            return self._take()
        req.attempt = None
        if req.on is not None:
            req.on.failed += 1
        error = _timeout_error(self.name, req)
        self._finish(req, req.on, error)
        if req.stream:
            self._settled(attempt, Outcome.ERROR, error)
        return self._take()

    def _unqueue(self, req: Request) -> None:
        for q in [self.waiting, *(s.queue for s in self.slots)]:
            if req in q:
                q.remove(req)

    # ------------------------------------------------------------ routing

    def _dispatch(self, req: Request) -> None:
        if req.done:
            return
        cfg = self.config
        if req.pinned is not None:
            slot = self.slots[req.pinned]
            if slot.state != HEALTHY:
                self._finish(req, slot, SupervisionError(
                    f"replica {slot.index} of {self.name} is {slot.state}", mesh=self.name,
                ))  # fmt: skip
            else:
                self._place(slot, req)  # a fan-out counts against the limits too
            return
        healthy = self.healthy()
        if not healthy:
            if not self.recovering():
                # Every replica stays down (restart limit, or its owner is
                # gone): no recovery to wait for.
                self._finish(req, None, ServiceError(
                    f"service {self.name} is DOWN: {self.why_down()}",
                    mesh=self.name,
                ))  # fmt: skip
            elif len(self.waiting) >= cfg.max_queue * len(self.slots):
                self._finish(req, None, _overloaded(self.name, self.config))
            else:
                self.waiting.append(req)  # until a replica recovers or the deadline
            return
        target = _bound(self, req)
        if req.done:
            return  # a strict session lost its replica
        if target is None:
            ready = [s for s in healthy if s.has_room(cfg)]
            if not ready:
                self._finish(req, None, _overloaded(self.name, self.config))
                return
            session = req.session
            router = self._least if req.least_loaded else self.router
            try:
                pick = router.choose(
                    [s.statistics() for s in ready], session.id if session is not None else None
                )
            except Exception as exc:  # a user's router: its error is this call's, not the event's
                self._finish(req, None, _router_error(self.name, router, exc))
                return
            target = next((s for s in ready if s.index == pick), ready[0])
            if session is not None:
                session.replica, session.generation = target.index, target.generation
        self._place(target, req)

    def _place(self, slot: Slot, req: Request) -> None:
        """Send ``req`` to ``slot`` now, or queue it there, or fail it: overloaded."""
        if slot.in_flight < self.config.max_concurrent_requests:
            self._send(slot, req)
        elif len(slot.queue) < self.config.max_queue:
            slot.queue.append(req)
        else:
            self._finish(req, None, _overloaded(self.name, self.config))

    def _send(self, slot: Slot, req: Request) -> None:
        if self.clock() >= req.deadline:
            self._finish(req, None, _timeout_error(self.name, req))
            return
        attempt = Attempt(req, slot)
        req.attempt = attempt
        req.on = slot
        req.sent_once = True
        req.attempts += 1
        slot.in_flight += 1
        slot.sent += 1
        if slot.state != HEALTHY:
            slot.sent_after_failure += 1
        self._out.append(Send(attempt))

    def _pump(self, slot: Slot) -> None:
        while slot.queue and slot.in_flight < self.config.max_concurrent_requests:
            if slot.state != HEALTHY:
                return
            self._send(slot, slot.queue.popleft())

    def _pump_waiting(self) -> None:
        waiting, self.waiting = self.waiting, deque()
        for req in waiting:
            self._dispatch(req)

    # ------------------------------------------------------------ endings

    def _finish(
        self, req: Request, slot: Slot | None, error: BaseException | None, value: Any = None
    ) -> None:
        if req.done:
            return
        req.done = True
        if error is None:
            self.completed += 1
        else:
            self.failed += 1
        self._out.append(Settle(req, error, value))


def _bound(d: Dispatcher, req: Request) -> Slot | None:
    """The replica ``req``'s session is bound to, if it still serves that generation.

    A session whose generation is gone is unbound here (and counted); a
    strict one fails ``req`` with ``SessionLostError`` instead of moving
    silently.
    """
    session = req.session
    if session is None or session.replica is None:
        return None
    slot = d.slots[session.replica]
    if slot.state == HEALTHY and slot.generation == session.generation:
        return slot
    lost = f"replica {session.replica} generation {session.generation}"
    session.replica = None
    session.rebinds += 1
    session.rebound = True
    if session.strict:
        d._finish(req, None, SessionLostError(
            f"session {session.id} of {d.name} lost its replica ({lost} is gone): "
            "the state it kept there is gone", mesh=d.name,
        ))  # fmt: skip
    return None


def _overloaded(name: str, cfg: ServiceConfig) -> ServiceOverloadedError:
    return ServiceOverloadedError(
        f"service {name} is full: every healthy replica has "
        f"{cfg.max_concurrent_requests} requests in flight and {cfg.max_queue} queued",
        mesh=name,
    )


def _interrupted(name: str, attempt: Attempt, cause: Any) -> StreamInterruptedError:
    req, index = attempt.request, attempt.slot.index
    err = StreamInterruptedError(
        f"the stream of {req.endpoint!r} broke on replica {index} (generation "
        f"{attempt.generation}) of {name} after {req.items} item(s); it is not moved to "
        f"another replica, as its items would repeat: {cause}",
        replica=index, generation=attempt.generation, items=req.items, mesh=name,
        reason=getattr(cause, "reason", ""), rank=getattr(cause, "rank", None),
        host=getattr(cause, "host", None), log_path=getattr(cause, "log_path", None),
    )  # fmt: skip
    if isinstance(cause, BaseException):
        err.__cause__ = cause
    return err


def _router_error(name: str, router: Any, exc: Exception) -> ServiceError:
    err = ServiceError(
        f"the router of {name} ({type(router).__name__}.choose) raised "
        f"{type(exc).__name__}: {exc}; the call was not sent",
        mesh=name,
    )
    err.__cause__ = exc
    return err


def _timeout_error(name: str, req: Request) -> ZmeshError:
    if not req.sent_once:
        return ServiceError(
            f"no healthy replica of {name} took {req.endpoint!r} before its timeout", mesh=name
        )
    return CallTimeoutError(f"{req.endpoint!r} on {name} timed out", mesh=name)
