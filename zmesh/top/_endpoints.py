"""The actors pane's rows: one per (mesh, actor, endpoint), over every rank.

Pure functions of the agents' samples. Rates, percentiles and the mean batch
size are over the snapshot's window (the latest sample less the one a window
before; a proc's lifetime when there is no older sample); the totals are
cumulative.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zmesh._shared.stats import ProcStatistics, percentile, subtract

if TYPE_CHECKING:
    from zmesh.top._collect import AgentSample


@dataclass(frozen=True)
class EndpointRow:
    mesh: str
    actor: str
    endpoint: str
    ranks: int = 0
    calls: float = 0.0  # per second over the window
    errors: float = 0.0  # per second over the window
    p50: float | None = None  # seconds
    p99: float | None = None
    in_flight: int = 0
    queue: int = 0
    calls_total: int = 0
    errors_total: int = 0
    hist: tuple[int, ...] = field(default=(), repr=False, compare=False)  # over the window
    # A batched endpoint (``@endpoint(batch=...)``): its invocations so far,
    # and the calls per invocation over the window (``None``: none ran).
    batches_total: int = 0
    mean_batch: float | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.mesh, self.actor, self.endpoint)


class _Acc:
    """One row's sums while the ranks are added up."""

    __slots__ = (
        "batched", "batches", "batches_total", "calls", "calls_total", "errors", "errors_total",
        "hist", "inflight", "queue", "ranks",
    )  # fmt: skip

    def __init__(self) -> None:
        self.ranks = self.inflight = self.queue = self.calls_total = self.errors_total = 0
        self.batches = self.batched = self.batches_total = 0
        self.calls = self.errors = 0.0
        self.hist: list[int] = []


def endpoint_rows(agents: Sequence[AgentSample]) -> list[EndpointRow]:
    """One row per endpoint of every mesh the agents report."""
    acc: dict[tuple[str, str, str], _Acc] = {}
    for a in agents:
        if a.stats is None:
            continue
        base = {(p.mesh, p.rank, p.generation): p for p in (a.base.procs if a.base else [])}
        for p in a.stats.procs:
            old = base.get((p.mesh, p.rank, p.generation))
            if old is not None and old.time >= p.time:
                old = None  # the same report twice: fall back to the proc's lifetime
            span = _span(p, old)
            old_eps = _endpoints_of(old)
            for actor in p.actors:
                for ep in actor.endpoints:
                    d = acc.setdefault((p.mesh, actor.name, ep.name), _Acc())
                    prev = old_eps.get((actor.name, ep.name))
                    dcalls = ep.calls - (prev.calls if prev else 0)
                    derr = ep.errors - (prev.errors if prev else 0)
                    d.ranks += 1
                    if span > 0:
                        d.calls += max(0, dcalls) / span
                        d.errors += max(0, derr) / span
                    d.hist = _add(d.hist, subtract(ep.histogram, prev.histogram if prev else []))
                    d.inflight += ep.in_flight
                    d.queue += ep.queued
                    d.calls_total += ep.calls
                    d.errors_total += ep.errors
                    d.batches_total += ep.batches
                    d.batches += max(0, ep.batches - (prev.batches if prev else 0))
                    d.batched += max(0, ep.batched - (prev.batched if prev else 0))
    return [_row(k, d) for k, d in acc.items()]


def _row(k: tuple[str, str, str], d: _Acc) -> EndpointRow:
    return EndpointRow(
        k[0], k[1], k[2], d.ranks, d.calls, d.errors, percentile(d.hist, 50),
        percentile(d.hist, 99), d.inflight, d.queue, d.calls_total, d.errors_total,
        tuple(d.hist), d.batches_total, d.batched / d.batches if d.batches else None,
    )  # fmt: skip


def total_row(rows: Sequence[EndpointRow]) -> EndpointRow:
    """The Total row over ``rows`` (batches summed; no mean batch size)."""
    hist: list[int] = []
    for r in rows:
        hist = _add(hist, list(r.hist))
    return EndpointRow(
        "",
        "Total",
        "",
        sum(r.ranks for r in rows),
        sum(r.calls for r in rows),
        sum(r.errors for r in rows),
        percentile(hist, 50),
        percentile(hist, 99),
        sum(r.in_flight for r in rows),
        sum(r.queue for r in rows),
        sum(r.calls_total for r in rows),
        sum(r.errors_total for r in rows),
        tuple(hist),
        sum(r.batches_total for r in rows),
    )


def _span(p: ProcStatistics, old: ProcStatistics | None) -> float:
    """Seconds between ``old`` and ``p`` (since the proc started if there is no ``old``)."""
    if old is not None and p.time > old.time:
        return p.time - old.time
    return p.uptime


def _endpoints_of(p: ProcStatistics | None) -> dict[tuple[str, str], Any]:
    if p is None:
        return {}
    return {(a.name, e.name): e for a in p.actors for e in a.endpoints}


def _add(a: list[int], b: list[int]) -> list[int]:
    if len(a) < len(b):
        a = a + [0] * (len(b) - len(a))
    return [x + (b[i] if i < len(b) else 0) for i, x in enumerate(a)]
