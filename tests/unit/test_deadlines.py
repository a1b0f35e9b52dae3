"""Deadlines between processes: budgets, and time on the wire told from clock offsets."""

from __future__ import annotations

from zmesh._wire import deadlines


def test_a_constant_clock_offset_counts_as_no_time_on_the_wire() -> None:
    clock = 1001
    for i in range(5):  # another host's monotonic clock, 5 days apart from ours
        assert deadlines.transit(clock, sent=10.0 + i, now=432_010.0 + i + 0.001) == 0.0


def test_a_message_held_on_the_way_loses_that_time_from_its_budget() -> None:
    clock = 1003
    assert deadlines.transit(clock, sent=100.0, now=5_100.0) == 0.0  # the quickest trip
    assert abs(deadlines.transit(clock, sent=101.0, now=5_103.5) - 2.5) < 1e-9  # held 2.5 s
    assert deadlines.transit(clock, sent=104.0, now=5_104.0) == 0.0


def test_an_old_quickest_trip_is_forgotten_after_two_windows() -> None:
    clock = 1005
    deadlines.transit(clock, sent=0.0, now=1_000.0)  # offset 1000
    t = 1_000.0
    for _ in range(3):  # from now on the offset is 1010 (the sender's clock was reset)
        t += deadlines.WINDOW + 1
        deadlines.transit(clock, sent=t - 1_010.0, now=t)
    assert deadlines.transit(clock, sent=t + 1 - 1_010.0, now=t + 1) == 0.0


def test_senders_clocks_are_bounded() -> None:
    for clock in range(10_000, 10_000 + deadlines.SENDERS + 50):
        deadlines.transit(clock, sent=0.0, now=1.0)
    assert len(deadlines._offsets) <= deadlines.SENDERS
