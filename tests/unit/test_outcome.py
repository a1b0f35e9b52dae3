"""How a call of an endpoint ended, by the one set of rules every runner keeps (no sockets).

``zmesh._shared.invoke.returned``/``raised`` are what the proc's mailbox,
its group fast path and the in-process mesh hand an endpoint's result or
exception to; the integration tests (test_errors, test_cancel,
test_base_exceptions, test_local_mesh) hold each runner to what the
outcome then becomes.
"""

from __future__ import annotations

import asyncio

import pytest

from zmesh._host.proc.cancelling import Running
from zmesh._shared.invoke import (
    ANSWERED,
    BAD_ARGUMENTS,
    CANCELLED,
    EXITED,
    RAISED,
    RETURNED,
    STOPPED,
    BadArguments,
    Sent,
    invoke,
    raised,
    returned,
)
from zmesh._shared.stats import EndpointCounters, now_ns


class _Owner:
    def __init__(self, stopped: bool = False) -> None:
        self.stopped = stopped


def _counted(c: EndpointCounters) -> tuple[int, int, int]:
    return c.calls, c.errors, c.in_flight


def test_a_result_counts_as_a_call_and_a_sent_one_at_its_own_time() -> None:
    c = EndpointCounters("f")
    out = returned(5, c, c.begin())
    assert (out.kind, out.value) == (RETURNED, 5)
    sent = Sent(now_ns())
    out = returned(sent, c, c.begin())
    assert (out.kind, out.value) == (RETURNED, sent)
    assert _counted(c) == (2, 0, 0)


def test_arguments_that_do_not_fit_are_bad_arguments_not_the_endpoints_error() -> None:
    def f(self: object, x: int) -> int:
        return x

    c = EndpointCounters("f")
    t0 = c.begin()
    with pytest.raises(BadArguments) as info:
        invoke(f, None, (1, 2), {})
    out = raised(info.value, c, t0, Running(None, False), _Owner())
    assert out.kind is BAD_ARGUMENTS and "positional argument" in out.why
    assert _counted(c) == (1, 1, 0)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [(ValueError("no"), RAISED), (KeyboardInterrupt(), RAISED), (SystemExit(3), EXITED)],
)
def test_an_error_counts_as_one_and_system_exit_is_told_apart(
    exc: BaseException, kind: object
) -> None:
    c = EndpointCounters("f")
    out = raised(exc, c, c.begin())
    assert (out.kind, out.value) == (kind, exc)
    assert _counted(c) == (1, 1, 0)


def test_a_cancellation_in_a_cancelled_task_stops_the_call_uncounted() -> None:
    c = EndpointCounters("f")
    seen = []

    async def main() -> None:
        async def body() -> None:
            t0 = c.begin()
            try:
                await asyncio.sleep(10)
            except BaseException as exc:
                seen.append(raised(exc, c, t0))
                raise

        task = asyncio.ensure_future(body())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert seen[0].kind is STOPPED
    assert _counted(c) == (0, 0, 0)


def test_a_cancelled_error_the_endpoint_raises_itself_is_its_error() -> None:
    async def main() -> object:
        return raised(asyncio.CancelledError("a task of the user's"))

    assert asyncio.run(main()).kind is RAISED  # type: ignore[attr-defined]
    # Read outside the endpoint's task (a worker thread's part), never a stop.
    assert raised(asyncio.CancelledError(), in_task=False).kind is RAISED


def test_a_call_its_caller_cancelled_ends_cancelled_unless_its_actor_stops() -> None:
    c = EndpointCounters("f")
    run = Running(None, True)
    run.cancelled = True
    assert raised(ValueError(), c, c.begin(), run, _Owner()).kind is CANCELLED
    assert returned(1, c, c.begin(), run).kind is CANCELLED  # its result goes nowhere
    assert _counted(c) == (2, 0, 0)  # calls, not errors
    stopping = Running(None, True)
    stopping.cancelled = True
    assert raised(ValueError(), c, c.begin(), stopping, _Owner(stopped=True)).kind is RAISED


def test_a_call_its_thread_answered_before_the_actor_stopped_is_not_answered_twice() -> None:
    c = EndpointCounters("f")
    run = Running(None, False)
    assert run.claim()  # the actor's thread sent its answer
    out = raised(asyncio.CancelledError(), c, c.begin(), run, _Owner(stopped=True))
    assert out.kind is ANSWERED
    assert _counted(c) == (1, 0, 0)
