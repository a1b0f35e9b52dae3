"""Properties of the service dispatcher (zmesh/_service/dispatch.py), by hypothesis.

The dispatcher has no sockets and calls nothing back: a shell here carries
out the decisions each event returns, recording what is sent and answered,
and random sequences of events (new requests, replies, user errors, broken
replicas, timeouts, replicas failing, coming back and giving up, stop) are
fed to it in any order. Whatever the order:

* every request ends exactly once, and every request ends once every attempt
  has been answered and every deadline has passed;
* nothing is sent to a replica generation known failed, nor to a replica
  that is not HEALTHY (``sent_after_failure`` stays 0), even when a send
  fails at once (a connection the runtime knew broken) while the decisions
  of one event are carried out: the later sends there are handed back;
* a replica never holds more than ``max_concurrent_requests`` attempts, nor
  queues more than ``max_queue``; its ``in_flight`` is exactly its unsettled
  attempts;
* retries are bounded: a request is sent at most once per replica
  generation that broke under it, plus once; a ``retry=False`` or pinned
  request is sent at most once;
* a pinned request is only ever sent to its replica;
* a session's requests go to the generation it is bound to; a strict session
  whose generation is gone fails with ``SessionLostError`` instead;
* a stream request (a generator endpoint) is never sent again once an item of
  it reached its reader: a replica breaking under it then ends it with
  ``StreamInterruptedError``, and its deadline no longer ends it; a reader
  that stops reading (cancel) ends it at once and frees its slot.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zmesh._errors import (
    ActorStoppedError,
    CallTimeoutError,
    ServiceError,
    SessionLostError,
    StreamInterruptedError,
    SupervisionError,
)
from zmesh._service.decisions import Decision, Failed, Send, Settle
from zmesh._service.dispatch import Attempt, Dispatcher, Outcome, Request
from zmesh._service.routing import (
    HEALTHY,
    LeastLoadedRouter,
    RoundRobinRouter,
    ServiceConfig,
    Session,
)

SCALE = int(os.environ.get("ZMESH_PROPERTY_SCALE", "1"))
FAST = settings(
    max_examples=200 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
REPLICAS = 3


class _Svc:
    id = "svc"


class Shell:
    """What the I/O shell would do, recorded: attempts out, answers given."""

    def __init__(self, cfg: ServiceConfig, router: Any) -> None:
        self.now = 0.0
        self.open: list[Attempt] = []  # sent, not settled
        self.sends: list[tuple[Request, int, int]] = []  # (request, replica, generation)
        self.ended: dict[str, list[Any]] = {}
        self.failed_gens: set[tuple[int, int]] = set()
        self.cut: set[tuple[int, int]] = set()  # generations whose sends fail at once
        self.failures: list[tuple[int, int]] = []
        self.d = Dispatcher("svc", REPLICAS, cfg, router, lambda: self.now)
        self.requests: list[Request] = []
        # A stream request's sends when its first item reached the reader.
        self.first_item: dict[str, int] = {}
        self.interrupted: set[str] = set()  # broke under a live attempt after items

    def apply(self, decisions: list[Decision]) -> None:
        """Carry out what the dispatcher decided, in order."""
        for dec in decisions:
            if isinstance(dec, Send):
                self.send(dec.attempt)
            elif isinstance(dec, Settle):
                self.finish(dec.request, dec.error, dec.value)
            elif isinstance(dec, Failed):
                self.on_failure(dec.index, dec.generation, dec.reason)

    def send(self, attempt: Attempt) -> None:
        slot = attempt.slot
        gen = (slot.index, attempt.generation)
        if slot.state != HEALTHY or slot.generation != attempt.generation:
            # Its replica left routing since the decision (an earlier send of
            # the batch found it cut): handed back, as the service client does.
            self.apply(self.d.unsent(attempt))
            return
        assert gen not in self.failed_gens, "sent to a dead gen"
        assert slot.in_flight <= self.d.config.max_concurrent_requests
        self.sends.append((attempt.request, slot.index, attempt.generation))
        if gen in self.cut:
            # The runtime knew its connection broken before the dispatcher did:
            # the send fails at once, while the batch is being carried out.
            self.failed_gens.add(gen)
            self.apply(self.d.settled(attempt, Outcome.BROKEN, SupervisionError("cut")))
            return
        self.open.append(attempt)

    def finish(self, req: Request, error: BaseException | None, value: Any) -> None:
        self.ended.setdefault(req.id, []).append(error if error is not None else value)
        if req.stream and error is not None:
            # A stream's call still open (timed out before its first item)
            # is closed as its request ends: the dispatcher gave its slot back.
            self.open = [a for a in self.open if a.request is not req or a.held]
        if req.items:  # a stream under way is not timed out by its deadline
            assert not isinstance(error, CallTimeoutError | ServiceError), error
        if isinstance(error, StreamInterruptedError):
            assert req.stream and req.items and error.items == req.items

    def item(self, attempt: Attempt) -> None:
        req = attempt.request
        live = attempt.held and req.attempt is attempt
        self.d.item(attempt)  # (decides nothing: a count)
        if live:
            self.first_item.setdefault(req.id, req.attempts)

    def on_failure(self, index: int, generation: int, reason: str) -> None:
        self.failures.append((index, generation))

    def fail(self, index: int) -> None:
        gen = self.d.slots[index].generation
        self.failed_gens.add((index, gen))
        self.apply(self.d.replica_failed(index, gen, "killed"))


requests_st = st.tuples(
    st.booleans(),  # retry
    st.sampled_from([None, 0, 1]),  # session: none, plain or strict
    st.sampled_from([None, None, None, 0, 1, 2]),  # pinned
    st.booleans(),  # least loaded
    st.floats(0.5, 5.0),  # timeout
    st.booleans(),  # a stream (generator endpoint)
)
events_st = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), requests_st),
        st.tuples(st.sampled_from(["ok", "error", "broken", "item"]), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(
            st.sampled_from(["fail", "up", "gone", "orphan", "cut"]), st.integers(0, REPLICAS - 1)
        ),
        st.tuples(st.just("tick"), st.floats(0.0, 2.0)),
        st.tuples(st.just("stop"), st.none()),
    ),
    max_size=80,
)
# Mostly streams, and the events that matter to them: items, breaks, cancels.
_stream_submit = st.tuples(st.just("submit"), requests_st.map(lambda r: (*r[:5], True)))
_stream_act = st.tuples(
    st.sampled_from(["item", "item", "broken", "ok", "cancel"]), st.integers(0, 9)
)
stream_events_st = st.lists(
    st.one_of(
        _stream_submit,
        _stream_act,
        _stream_act,
        st.tuples(st.sampled_from(["fail", "up"]), st.integers(0, REPLICAS - 1)),
        st.tuples(st.just("tick"), st.floats(0.0, 0.5)),
    ),
    min_size=12,
    max_size=60,
)
# Connections the runtime knows broken before the dispatcher does, while
# queues fill and replicas fail: sends that fail at once mid-batch. A
# session's queued requests move together when its replica fails, so one
# event sends several to one replica.
cut_events_st = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), requests_st.map(lambda r: (*r[:2], None, *r[3:5], False))),
        st.tuples(st.sampled_from(["cut", "fail", "up"]), st.integers(0, REPLICAS - 1)),
        st.tuples(st.sampled_from(["ok", "broken"]), st.integers(0, 9)),
    ),
    min_size=10,
    max_size=60,
)
configs_st = st.builds(
    ServiceConfig,
    max_concurrent_requests=st.integers(1, 3),
    max_queue=st.integers(0, 3),
)


def run(events: list[tuple[str, Any]], cfg: ServiceConfig, least: bool) -> Shell:
    shell = Shell(cfg, LeastLoadedRouter() if least else RoundRobinRouter())
    d = shell.d
    gens = [0] * REPLICAS
    for i in range(REPLICAS):
        gens[i] += 1
        shell.apply(d.replica_up(i, gens[i]))
    sessions = [Session(_Svc(), "a"), Session(_Svc(), "b", strict=True)]  # type: ignore[arg-type]
    for kind, arg in events:
        if kind == "submit":
            retry, sess, pinned, least_loaded, timeout, stream = arg
            req = Request(
                f"r{len(shell.requests)}", "ep", shell.now + timeout, retry=retry,
                session=sessions[sess] if sess is not None else None,
                pinned=None if stream else pinned, least_loaded=least_loaded,
                start=shell.now, stream=stream,
            )  # fmt: skip
            shell.requests.append(req)
            shell.apply(d.submit(req))
        elif kind == "item" and shell.open:
            attempt = shell.open[arg % len(shell.open)]
            if attempt.request.stream:
                shell.item(attempt)
        elif kind == "cancel" and shell.requests:
            req = shell.requests[arg % len(shell.requests)]
            if req.stream:  # the reader stopped: the shell closes the live attempt
                live = req.attempt
                shell.apply(d.cancel(req))
                if live is not None:
                    shell.open.remove(live)
        elif kind in ("ok", "error", "broken") and shell.open:
            attempt = shell.open.pop(arg % len(shell.open))
            if kind == "ok":
                shell.apply(d.settled(attempt, Outcome.OK, attempt.request.id))
            elif kind == "error":
                shell.apply(d.settled(attempt, Outcome.ERROR, ValueError("user")))
            else:
                gen = (attempt.slot.index, attempt.generation)
                if d.slots[gen[0]].generation == gen[1] and d.slots[gen[0]].state == HEALTHY:
                    shell.failed_gens.add(gen)
                req = attempt.request
                if req.items and req.attempt is attempt and not req.done and not d.stopped:
                    shell.interrupted.add(req.id)
                shell.apply(d.settled(attempt, Outcome.BROKEN, SupervisionError("broke")))
        elif kind == "fail" and d.slots[arg].state == HEALTHY:
            shell.fail(arg)
        elif kind == "cut" and d.slots[arg].state == HEALTHY:
            shell.cut.add((arg, d.slots[arg].generation))
        elif kind == "up" and d.slots[arg].state != "UNHEALTHY":
            if d.slots[arg].state == HEALTHY:  # a newer generation: the old one is gone
                shell.failed_gens.add((arg, d.slots[arg].generation))
            gens[arg] += 1
            shell.apply(d.replica_up(arg, gens[arg]))
        elif kind == "gone" and d.slots[arg].state != HEALTHY:
            shell.apply(d.replica_gone(arg))
        elif kind == "orphan" and d.slots[arg].state != "UNHEALTHY":
            # Stopped because the process that made the service is gone (as a
            # client away from the supervisor hears it): down for good.
            if d.slots[arg].state == HEALTHY:
                shell.fail(arg)
            shell.apply(d.owner_gone(arg, d.slots[arg].generation, "owner gone"))
        elif kind == "tick":
            shell.now += arg
            for req in shell.requests:
                if req.deadline <= shell.now:
                    shell.apply(d.expire(req))
        elif kind == "stop":
            shell.apply(d.stop())
            # The replicas' procs are stopped: what was in flight breaks.
            while shell.open:
                shell.apply(
                    d.settled(shell.open.pop(), Outcome.BROKEN, ActorStoppedError("stopped"))
                )
        check_invariants(shell)
    # The end of time: every replica answers what it still has, every deadline passes.
    while shell.open:
        shell.apply(d.settled(shell.open.pop(0), Outcome.OK, "late"))
        check_invariants(shell)
    shell.now += 1000
    for req in shell.requests:
        shell.apply(d.expire(req))
    while shell.open:  # a request routed by a late pump, then expired: answered now
        shell.apply(d.settled(shell.open.pop(0), Outcome.OK, "late"))
    return shell


def check_invariants(shell: Shell) -> None:
    d, cfg = shell.d, shell.d.config
    for slot in d.slots:
        held = sum(1 for a in shell.open if a.slot is slot)
        assert slot.in_flight == held, (slot.index, slot.in_flight, held)
        assert slot.in_flight <= cfg.max_concurrent_requests
        assert len(slot.queue) <= cfg.max_queue
        assert slot.sent_after_failure == 0
        if slot.state != HEALTHY:
            assert not slot.queue, "requests queued on a replica that cannot take them"
    assert len(d.waiting) <= cfg.max_queue * len(d.slots)
    for rid, ends in shell.ended.items():
        assert len(ends) == 1, f"{rid} ended {len(ends)} times"


@FAST
@given(events_st, configs_st, st.booleans())
def test_every_request_ends_exactly_once(
    events: list[tuple[str, Any]], cfg: ServiceConfig, least: bool
) -> None:
    shell = run(events, cfg, least)
    for req in shell.requests:
        assert req.done
        assert len(shell.ended[req.id]) == 1
    assert shell.d.completed + shell.d.failed == len(shell.requests)


@FAST
@given(events_st, configs_st, st.booleans())
def test_retries_are_bounded_and_pinned_requests_stay(
    events: list[tuple[str, Any]], cfg: ServiceConfig, least: bool
) -> None:
    shell = run(events, cfg, least)
    for req in shell.requests:
        mine = [(i, g) for r, i, g in shell.sends if r is req]
        assert len(mine) == req.attempts
        if not req.retry or req.pinned is not None:
            assert len(mine) <= 1
        broken_under = {(i, g) for i, g in mine if (i, g) in shell.failed_gens}
        assert len(mine) <= len(broken_under) + 1
        assert len(set(mine)) == len(mine), "sent twice to one generation"
        if req.pinned is not None:
            assert all(i == req.pinned for i, _ in mine)


@FAST
@given(events_st, configs_st)
def test_each_failure_is_reported_once(events: list[tuple[str, Any]], cfg: ServiceConfig) -> None:
    shell = run(events, cfg, False)
    assert len(shell.failures) == len(set(shell.failures))
    assert set(shell.failures) <= shell.failed_gens


@FAST
@given(events_st, configs_st)
def test_sessions_stay_on_their_generation(
    events: list[tuple[str, Any]], cfg: ServiceConfig
) -> None:
    shell = run(events, cfg, False)
    lost = 0
    for req in shell.requests:
        if req.session is None or req.pinned is not None:
            continue
        (end,) = shell.ended[req.id]
        if isinstance(end, SessionLostError):
            assert req.session.strict
            lost += 1
    for s in {r.session for r in shell.requests if r.session is not None}:
        assert s.rebound == (s.rebinds > 0)
    strict = [r.session for r in shell.requests if r.session is not None and r.session.strict]
    if strict:
        assert lost == strict[0].rebinds
    # Consecutive sends of one session's requests change generation only by a rebind.
    for s in {r.session for r in shell.requests if r.session is not None}:
        gens = [(i, g) for r, i, g in shell.sends if r.session is s and r.pinned is None]
        moves = sum(1 for a, b in itertools.pairwise(gens) if a != b)
        assert moves <= s.rebinds


@FAST
@given(st.one_of(events_st, stream_events_st), configs_st, st.booleans())
def test_a_stream_is_never_sent_again_after_its_first_item(
    events: list[tuple[str, Any]], cfg: ServiceConfig, least: bool
) -> None:
    shell = run(events, cfg, least)
    for req in shell.requests:
        sends = sum(1 for r, _, _ in shell.sends if r is req)
        if req.id in shell.first_item:
            assert req.stream
            assert sends == shell.first_item[req.id], "re-sent after its first item"
        (end,) = shell.ended[req.id]
        if req.id in shell.interrupted:
            assert isinstance(end, StreamInterruptedError), end
            assert end.replica is not None and end.items == req.items


@FAST
@given(cut_events_st, configs_st, st.booleans())
def test_sends_that_fail_at_once_leave_no_request_on_a_dead_replica(
    events: list[tuple[str, Any]], cfg: ServiceConfig, least: bool
) -> None:
    shell = run(events, cfg, least)  # (Shell.send asserts no send reaches a dead generation)
    for req in shell.requests:
        assert req.done and len(shell.ended[req.id]) == 1
        mine = [(i, g) for r, i, g in shell.sends if r is req]
        assert len(mine) == req.attempts, "a send handed back counts as no attempt"


def test_a_session_moving_to_a_cut_replica_sends_nothing_after_its_first_failure() -> None:
    """Two queued requests of a session move to replica 1 in one event; the
    first send finds its connection broken: the second is not sent there."""
    cfg = ServiceConfig(max_concurrent_requests=2, max_queue=3)
    submit = ("submit", (True, 0, None, False, 5.0, False))  # in the plain session
    shell = run([submit] * 4 + [("cut", 1), ("fail", 0)], cfg, False)
    r2, r3 = shell.requests[2:]
    assert [(i, g) for r, i, g in shell.sends if r is r3] == [(2, 1)]  # never to (1, 1)
    assert (r2.attempts, r3.attempts) == (2, 1)


def test_a_session_rebinds_when_its_generation_is_replaced() -> None:
    """The bug of issue 15: killed and respawned before the next call."""
    shell = Shell(ServiceConfig(), RoundRobinRouter())
    d = shell.d
    for i in range(REPLICAS):
        shell.apply(d.replica_up(i, 1))
    s = Session(_Svc(), "s")  # type: ignore[arg-type]
    strict = Session(_Svc(), "t", strict=True)  # type: ignore[arg-type]

    def call(session: Session) -> Any:
        req = Request(f"r{len(shell.requests)}", "ep", 100.0, session=session)
        shell.requests.append(req)
        shell.apply(d.submit(req))
        if shell.open:
            shell.apply(d.settled(shell.open.pop(), Outcome.OK, "v"))
        return shell.ended[req.id][0]

    call(s)
    call(strict)
    assert s.replica is not None and strict.replica is not None
    for index in {s.replica, strict.replica}:
        shell.fail(index)
        d.replica_up(index, 2)  # respawned before the next call
    assert call(s) == "v"
    assert (s.rebinds, s.rebound) == (1, True)
    assert isinstance(call(strict), SessionLostError)
    assert call(strict) == "v"  # bound afresh
    assert strict.rebinds == 1


def test_when_its_maker_is_gone_waiting_and_later_requests_fail_at_once() -> None:
    """Every replica stopped because the process that made the service died:
    nothing will replace them, so nothing waits for a recovery."""
    shell = Shell(ServiceConfig(), RoundRobinRouter())
    d = shell.d
    for i in range(REPLICAS):
        shell.apply(d.replica_up(i, 1))
    for i in range(REPLICAS - 1):
        shell.fail(i)
        shell.apply(d.owner_gone(i, 1, "owner gone"))
    shell.fail(REPLICAS - 1)  # heard as failed first: a request now waits for it
    waiting = Request("w", "ep", 100.0)
    shell.apply(d.submit(waiting))
    assert "w" not in shell.ended and list(d.waiting) == [waiting]
    shell.apply(d.owner_gone(REPLICAS - 1, 1, "owner gone"))
    for rid in ("w", "later"):
        if rid == "later":
            shell.apply(d.submit(Request(rid, "ep", 100.0)))
        (error,) = shell.ended[rid]
        assert isinstance(error, ServiceError)
        assert "the process that made it is gone" in str(error), error
    d.replica_up(0, 2)  # someone does replace it after all: it serves again
    assert not d.orphaned
    shell.apply(d.submit(Request("again", "ep", 100.0)))
    assert shell.sends[-1][1:] == (0, 2)
