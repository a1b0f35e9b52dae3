"""The statistics counters and histogram arithmetic (no sockets)."""

from __future__ import annotations

import pytest

from zmesh._shared import stats as _stats
from zmesh._shared.stats import BUCKETS, EndpointCounters, percentile, subtract


def test_counters_count_calls_errors_and_in_flight() -> None:
    c = EndpointCounters("incr")
    t0 = c.begin()
    assert c.in_flight == 1
    c.end(t0, 0)
    c.end(c.begin(), 1)
    s = c.statistics(queued=3)
    assert (s.name, s.calls, s.errors, s.in_flight, s.queued) == ("incr", 2, 1, 0, 3)
    assert len(s.histogram) == BUCKETS and sum(s.histogram) == 2
    assert s.latency_ns > 0


def test_a_long_call_lands_in_the_last_bucket() -> None:
    c = EndpointCounters("slow")
    c.in_flight += 1
    c.end(_stats._now_ns() - 10**12, 0)  # "started" 1000 s ago
    assert c.hist[-1] == 1


def test_percentiles_interpolate_inside_fixed_buckets() -> None:
    hist = [0] * BUCKETS
    hist[10] = 100  # every call in [512, 1024) µs-units
    lo, hi = _stats.bucket_bounds(10)
    p50 = percentile(hist, 50)
    assert p50 is not None and lo < p50 < hi
    assert percentile(hist, 100) == pytest.approx(hi)
    assert percentile([0] * BUCKETS, 50) is None


def test_deltas_give_the_window_only() -> None:
    old = [5, 0, 2]
    new = [7, 4, 2]
    assert subtract(new, old) == [2, 4, 0]
    assert subtract(new, []) == new


def test_actor_statistics_count_what_waits() -> None:
    a, b = EndpointCounters("b"), EndpointCounters("a")
    rec = _stats.actor_statistics("x", "X", [a, b], ["a", "b", "a"], queue_peak=1)
    assert rec.queue == 3 and rec.queue_peak == 3
    assert [(e.name, e.queued) for e in rec.endpoints] == [("a", 2), ("b", 1)]


def test_samplers_read_this_machine() -> None:
    cpu, rss, uptime = _stats.ProcSampler().sample()
    assert cpu >= 0 and rss > 0 and uptime >= 0
    host = _stats.HostSampler().sample("me")
    assert host.hostname == "me" and host.cpus >= 1
    assert host.mem_total >= host.mem_used > 0
    assert len(host.load) == 3
