"""The service dispatcher's rules, one event at a time, by the decisions it returns.

``Dispatcher`` (zmesh/_service/dispatch.py) calls nothing back: each event
(a request, a reply, a broken replica, a deadline) returns what to do,
``Send``, ``Settle``, ``Failed`` or ``Changed``, and the service client
carries it out. So the promises of docs/services.md that are routing rules
are checked here as plain functions, with no process: a full replica
queues, a full service is overloaded, a request in flight on a dead replica
goes elsewhere once, a deadline gives the caller its typed timeout, a
stream never repeats an item. (tests/unit/test_dispatch_properties.py
drives random event orders through the same methods.)
"""

from __future__ import annotations

from typing import Any

import pytest

from zmesh._errors import (
    ActorStoppedError,
    CallTimeoutError,
    OverloadedError,
    ServiceError,
    ServiceOverloadedError,
    StreamInterruptedError,
    SupervisionError,
)
from zmesh._service.decisions import CHANGED, Decision, Failed, Send, Settle
from zmesh._service.dispatch import Attempt, Dispatcher, Outcome, Request
from zmesh._service.routing import HEALTHY, RECOVERING, RoundRobinRouter, ServiceConfig


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def dispatcher(replicas: int = 2, up: int | None = None, **config: Any) -> tuple[Dispatcher, Clock]:
    """A dispatcher whose first ``up`` replicas (default: all) are up, in generation 1."""
    clock = Clock()
    d = Dispatcher("svc", replicas, ServiceConfig(**config), RoundRobinRouter(), clock)
    for i in range(replicas if up is None else up):
        assert d.replica_up(i, 1) == [CHANGED]
    return d, clock


def request(name: str, timeout: float = 10.0, **kw: Any) -> Request:
    return Request(name, "ep", timeout, **kw)


def sent(decisions: list[Decision]) -> Attempt:
    """The one attempt ``decisions`` send (and nothing else)."""
    assert len(decisions) == 1 and isinstance(decisions[0], Send), decisions
    return decisions[0].attempt


def settled_with(decisions: list[Decision], req: Request) -> Settle:
    settles = [d for d in decisions if isinstance(d, Settle)]
    assert [s.request for s in settles] == [req], decisions
    return settles[0]


# ------------------------------------------------------------ limits


def test_a_full_replica_queues_and_sends_the_next_when_one_answers() -> None:
    d, _ = dispatcher(1, max_concurrent_requests=1, max_queue=1)
    first, second = request("a"), request("b")
    a = sent(d.submit(first))
    assert d.submit(second) == []  # it waits: nothing to do yet
    assert d.slots[0].statistics().queued == 1
    out = d.settled(a, Outcome.OK, "value of a")
    # The caller gets its answer first, then the waiting request goes out.
    assert out[0] == Settle(first, None, "value of a")
    b = sent(out[1:])
    assert b.request is second and b.slot.index == 0


def test_when_every_replica_is_full_the_call_is_overloaded_at_once() -> None:
    d, _ = dispatcher(2, max_concurrent_requests=1, max_queue=1)
    for name in "abcd":  # two in flight, two queued
        d.submit(request(name))
    late = request("late")
    (end,) = d.submit(late)
    assert isinstance(end, Settle) and end.request is late
    assert isinstance(end.error, ServiceOverloadedError)
    assert isinstance(end.error, OverloadedError)  # one except clause for both kinds
    assert "every healthy replica has 1 requests in flight and 1 queued" in str(end.error)
    assert late.done and d.failed == 1


def test_while_no_replica_is_healthy_calls_wait_up_to_a_bound_then_overload() -> None:
    d, _ = dispatcher(1, max_queue=2)
    d.replica_failed(0, 1, "killed")  # being replaced: worth waiting for
    waiting = [request(f"w{i}") for i in range(2)]
    for req in waiting:
        assert d.submit(req) == []
    (end,) = d.submit(request("one too many"))
    assert isinstance(end, Settle) and isinstance(end.error, ServiceOverloadedError)
    # The replacement comes up: what waited goes to it, and fan-outs look again.
    out = d.replica_up(0, 2)
    assert [dec.attempt.request for dec in out if isinstance(dec, Send)] == waiting
    assert out[-1] == CHANGED


# ------------------------------------------------------------ a replica that dies


def test_a_request_in_flight_on_a_dead_replica_goes_elsewhere_once() -> None:
    d, _ = dispatcher(2)
    req = request("r")
    first = sent(d.submit(req))
    assert first.slot.index == 0
    out = d.settled(first, Outcome.BROKEN, SupervisionError("killed by SIGKILL"))
    # The dead generation is reported (the supervisor replaces it), then the
    # request is re-sent, with the same id, to the replica that serves.
    assert out[0] == Failed(0, 1, "killed by SIGKILL")
    again = sent(out[1:])
    assert again.request is req and again.slot.index == 1 and req.attempts == 2
    assert d.retried == 1 and d.slots[0].state == RECOVERING
    # The dead replica's other ranks answering late change nothing.
    assert d.settled(first, Outcome.OK, "late") == []
    assert d.settled(again, Outcome.OK, "value") == [Settle(req, None, "value")]
    assert req.attempts == 2 and d.completed == 1


def test_requests_queued_on_a_dead_replica_move_when_its_agent_says_so() -> None:
    d, _ = dispatcher(2, max_concurrent_requests=1)
    in_flight, queued = request("a"), request("b", retry=False)
    sent(d.submit(in_flight))
    d.submit(request("c"))  # to replica 1 (round robin)
    d.submit(queued)  # back on replica 0, behind "a"
    assert d.slots[0].statistics().queued == 1
    out = d.replica_failed(0, 1, "Failed: exit code -9")
    # The queued one was never sent: it moves at once, even with retry=False;
    # the one in flight waits for its own failure (it is then retried).
    assert [type(dec) for dec in out] == [Failed]
    assert d.slots[1].statistics().queued == 1 and queued.attempts == 0


def test_an_endpoint_that_opted_out_of_retry_gets_the_failure() -> None:
    d, _ = dispatcher(2)
    req = request("pay", retry=False)
    attempt = sent(d.submit(req))
    broke = SupervisionError("killed by SIGKILL")
    out = d.settled(attempt, Outcome.BROKEN, broke)
    assert out == [Failed(0, 1, "killed by SIGKILL"), Settle(req, broke)]
    assert req.attempts == 1 and d.retried == 0


def test_a_user_error_is_an_answer_not_a_failure() -> None:
    d, _ = dispatcher(2)
    req = request("r")
    boom = ValueError("bad input")
    attempt = sent(d.submit(req))
    assert d.settled(attempt, Outcome.ERROR, boom) == [Settle(req, boom)]
    assert d.slots[0].state == HEALTHY and req.attempts == 1


def test_a_send_not_carried_out_is_routed_again_as_never_sent() -> None:
    """The client finds the replica broken while carrying out an earlier send of
    the same batch: the later sends there are handed back, not sent to it."""
    d, _ = dispatcher(2, up=1)
    a, b = request("a"), request("b", retry=False)
    attempt_a, attempt_b = sent(d.submit(a)), sent(d.submit(b))  # both to replica 0
    d.replica_up(1, 1)
    d.settled(attempt_a, Outcome.BROKEN, SupervisionError("gone"))  # (a moves to 1)
    again = sent(d.unsent(attempt_b))
    assert again.request is b and again.slot.index == 1
    assert b.attempts == 1 and not b.done  # never sent to the dead one: retry=False is kept


# ------------------------------------------------------------ deadlines


def test_a_request_past_its_deadline_fails_with_a_call_timeout() -> None:
    d, clock = dispatcher(1)
    req = request("slow", timeout=5.0)
    attempt = sent(d.submit(req))
    clock.now = 5.0
    (end,) = d.expire(req)
    assert isinstance(end, Settle) and end.request is req
    assert isinstance(end.error, CallTimeoutError) and isinstance(end.error, TimeoutError)
    # The replica is still running it: the slot stays taken until it answers,
    # and that late answer goes to nobody.
    assert d.slots[0].in_flight == 1
    assert d.settled(attempt, Outcome.OK, "late") == []
    assert d.slots[0].in_flight == 0


def test_a_request_no_replica_took_before_its_deadline_says_so() -> None:
    d, clock = dispatcher(1)
    d.replica_failed(0, 1, "killed")
    req = request("r", timeout=2.0)
    assert d.submit(req) == []
    clock.now = 2.0
    (end,) = d.expire(req)
    assert isinstance(end, Settle) and type(end.error) is ServiceError
    assert "no healthy replica of svc took 'ep' before its timeout" in str(end.error)
    assert not d.waiting


def test_a_retry_keeps_the_deadline() -> None:
    d, clock = dispatcher(2)
    req = request("r", timeout=3.0)
    attempt = sent(d.submit(req))
    clock.now = 3.0  # it broke just as its time ran out: not sent again
    (_, end) = d.settled(attempt, Outcome.BROKEN, SupervisionError("killed"))
    assert isinstance(end, Settle) and isinstance(end.error, CallTimeoutError)
    assert req.attempts == 1


# ------------------------------------------------------------ streams


def test_a_stream_that_broke_after_an_item_is_interrupted_not_repeated() -> None:
    d, _ = dispatcher(2)
    req = request("gen", stream=True)
    attempt = sent(d.submit(req))
    d.item(attempt)
    out = d.settled(attempt, Outcome.BROKEN, SupervisionError("killed by SIGKILL"))
    assert out[0] == Failed(0, 1, "killed by SIGKILL")
    end = settled_with(out, req)
    assert isinstance(end.error, StreamInterruptedError)
    assert (end.error.replica, end.error.generation, end.error.items) == (0, 1, 1)
    assert not any(isinstance(dec, Send) for dec in out) and req.attempts == 1


def test_a_stream_timed_out_before_its_first_item_gives_its_slot_back_at_once() -> None:
    d, clock = dispatcher(1, max_concurrent_requests=1)
    stream, after = request("gen", timeout=1.0, stream=True), request("next")
    sent(d.submit(stream))
    assert d.submit(after) == []  # queued behind the open stream
    clock.now = 1.0
    out = d.expire(stream)
    # The client closes the stream's call as it settles it, so the next
    # request need not wait for the replica to notice.
    assert isinstance(out[0], Settle) and isinstance(out[0].error, CallTimeoutError)
    assert sent(out[1:]).request is after


def test_a_reader_that_stops_frees_the_slot_and_ends_without_error() -> None:
    d, _ = dispatcher(1, max_concurrent_requests=1)
    stream, after = request("gen", stream=True), request("next")
    sent(d.submit(stream))
    d.submit(after)
    out = d.cancel(stream)
    assert out[0] == Settle(stream, None, None)
    assert sent(out[1:]).request is after


# ------------------------------------------------------------ stopping


@pytest.mark.parametrize("queued", [False, True])
def test_stop_fails_what_waits_with_actor_stopped(queued: bool) -> None:
    d, _ = dispatcher(1, max_concurrent_requests=1)
    if queued:
        d.submit(request("busy"))
    else:
        d.replica_failed(0, 1, "killed")
    req = request("r")
    d.submit(req)
    out = d.stop()
    assert isinstance(out[0], Settle) and out[0].request is req
    assert isinstance(out[0].error, ActorStoppedError)
    assert out[-1] == CHANGED
    (later,) = d.submit(request("later"))
    assert isinstance(later, Settle) and isinstance(later.error, ActorStoppedError)


def test_a_router_that_raises_fails_its_call_and_keeps_the_rest() -> None:
    """A user's ``Router.choose`` that raises: that call fails with a
    ``ServiceError`` naming the router, and what the same event decided
    before it (an answer, a send) is still carried out."""

    class Broken(RoundRobinRouter):
        fail = False

        def choose(self, replicas: Any, session: str | None) -> int | None:
            if self.fail:
                raise RuntimeError("router bug")
            return super().choose(replicas, session)

    clock = Clock()
    router = Broken()
    d = Dispatcher("svc", 1, ServiceConfig(max_concurrent_requests=1, max_queue=2), router, clock)
    d.replica_up(0, 1)
    first, second = request("a"), request("b")
    a = sent(d.submit(first))
    assert d.submit(second) == []  # queued on the replica: no choice to make later
    router.fail = True
    bad = request("c")
    (end,) = d.submit(bad)  # the router is asked where it goes, and raises
    out = d.settled(a, Outcome.OK, "value of a")
    assert out[0] == Settle(first, None, "value of a")
    assert sent(out[1:]).request is second
    assert isinstance(end, Settle) and end.request is bad
    assert isinstance(end.error, ServiceError) and "Broken.choose) raised RuntimeError" in str(
        end.error
    )
