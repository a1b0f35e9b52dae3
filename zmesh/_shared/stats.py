"""Statistics: per-endpoint counters in procs, samplers for procs and hosts.

A proc counts, per actor and endpoint, the calls that ended, the errors, the
calls in flight and a latency histogram; its mailboxes know their queue depth
and its peak. About once a second the proc sends ``statistics()`` (a frozen
record) to its agent, which publishes it with the host's CPU, memory and load.

Counters only ever grow, so an observer gets rates *and* percentiles over any
window from two samples: subtract the older from the newer, bucket by bucket.
That is why the latency histogram has fixed buckets: bucket 0 holds calls
under ``BUCKET_UNIT_NS``, and bucket ``i`` those in
``[2**(i-1), 2**i) * BUCKET_UNIT_NS``; the last one takes everything longer.

The hot path is ``EndpointCounters.begin`` / ``end``: a few integer updates and
one ``perf_counter_ns`` pair per call.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence

import msgspec

BUCKET_UNIT_NS = 1024  # ~1 µs
BUCKETS = 28  # the last bucket starts at 2**26 µs (~67 s)
_LAST = BUCKETS - 1
_now_ns = time.perf_counter_ns
now_ns = _now_ns  # the clock of ``EndpointCounters`` (a call's end seen in another thread)


# ------------------------------------------------------------- records


class EndpointStatistics(msgspec.Struct, frozen=True, omit_defaults=True):
    """One endpoint of one actor. Counters are cumulative since the actor started.

    Attributes:
        name: the endpoint.
        calls: calls that ended (returned or raised).
        errors: calls that raised, or whose arguments or result could not travel.
        in_flight: calls running now.
        queued: calls waiting in the actor's mailbox now.
        latency_ns: the sum of the latencies of ``calls``, in ns.
        histogram: ``BUCKETS`` cumulative counts (see the module docstring).
    """

    name: str
    calls: int = 0
    errors: int = 0
    in_flight: int = 0
    queued: int = 0
    latency_ns: int = 0
    histogram: list[int] = []
    batches: int = 0  # invocations of a batched endpoint
    batched: int = 0  # calls that ran in them

    @property
    def mean_batch(self) -> float | None:
        """Calls per invocation of a batched endpoint (``None``: not batched)."""
        return self.batched / self.batches if self.batches else None


class ActorStatistics(msgspec.Struct, frozen=True, omit_defaults=True):
    """One actor of a proc: its mailbox and its endpoints."""

    name: str
    cls: str
    queue: int = 0  # messages waiting in the mailbox
    queue_peak: int = 0  # the deepest the mailbox has been
    endpoints: list[EndpointStatistics] = []


class ProcStatistics(msgspec.Struct, frozen=True, omit_defaults=True):
    """One proc: who it is, what it costs, and its actors.

    Attributes:
        time: wall clock when sampled (rates use differences of it).
        cpu_percent: CPU used since the previous sample (100 = one core).
        rss: resident memory in bytes.
        uptime: seconds since the proc started.
        dropped: malformed messages dropped; late: requests past their deadline.
        relayed: tree fan-out messages this proc received as its host's relay;
        forwarded: the messages it sent on for them, one per target proc.
        port_dropped: port values it received for a full ``PortReceiver``, dropped;
        port_refused: its ``Port.send`` calls refused with ``PortFullError``.
        backlog_bytes: bytes of the calls waiting in its mailboxes (see
            ``ZMESH_PROC_MAX_BACKLOG_BYTES``).
        initializing: spawns of actors whose ``__init__`` runs now; the
            proc shows as Initializing while there are any (``zmesh ps``, top).
    """

    mesh: str
    rank: int
    generation: int
    pid: int
    time: float
    cpu_percent: float = 0.0
    rss: int = 0
    uptime: float = 0.0
    dropped: int = 0
    late: int = 0
    actors: list[ActorStatistics] = []
    relayed: int = 0
    forwarded: int = 0
    port_dropped: int = 0
    port_refused: int = 0
    backlog_bytes: int = 0
    initializing: int = 0


class HostStatistics(msgspec.Struct, frozen=True, omit_defaults=True):
    """The host of an agent, and the agent process itself."""

    hostname: str
    pid: int
    uptime: float = 0.0
    cpus: int = 1
    cpu_percent: float = 0.0  # of the whole host (100 = every core busy)
    mem_total: int = 0
    mem_used: int = 0
    load: list[float] = []  # 1, 5 and 15 minute load averages


class ServiceSummary(msgspec.Struct, frozen=True, omit_defaults=True):
    """A service's replica table, as its orchestrator publishes it."""

    name: str
    healthy: int = 0
    desired: int = 0
    restarts: int = 0
    last_failure: str = ""
    state: str = ""
    # Which service (names may repeat), and its replica table for handles
    # of it in other processes (zmesh._service.client.TableRow, msgpack).
    id: str = ""
    table: bytes = b""
    # Requests in flight per replica (``max_concurrent_requests``), and the
    # endpoints that run one at a time all the same (not ``concurrent``, not
    # batched): ``zmesh top`` warns when the first is over 1 and a request
    # goes to one of the second.
    max_concurrent: int = 0
    serial: list[str] = []


# ------------------------------------------------------------- counters


class EndpointCounters:
    """The live counters of one endpoint; touched only on the proc's loop."""

    __slots__ = ("batched", "batches", "calls", "errors", "hist", "in_flight", "latency_ns", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.errors = 0
        self.in_flight = 0
        self.latency_ns = 0
        self.hist = [0] * BUCKETS
        self.batches = 0
        self.batched = 0

    def begin(self) -> int:
        """A call starts: return its start time for ``end``."""
        self.in_flight += 1
        return _now_ns()

    def end(self, t0: int, error: int, at: int = 0) -> None:
        """The call started at ``t0`` ended (``error`` is 0 or 1), now or ``at`` (``now_ns``)."""
        dt = (at or _now_ns()) - t0
        self.in_flight -= 1
        self.calls += 1
        self.errors += error
        self.latency_ns += dt
        b = (dt // BUCKET_UNIT_NS).bit_length()
        self.hist[b if b < _LAST else _LAST] += 1

    def statistics(self, queued: int = 0) -> EndpointStatistics:
        return EndpointStatistics(
            self.name,
            self.calls,
            self.errors,
            self.in_flight,
            queued,
            self.latency_ns,
            list(self.hist),
            self.batches,
            self.batched,
        )


def actor_statistics(
    name: str,
    cls: str,
    counters: Iterable[EndpointCounters],
    queued_methods: Iterable[str],
    queue_peak: int,
) -> ActorStatistics:
    """The record of one actor, from its counters and what waits in its mailbox."""
    waiting: dict[str, int] = {}
    depth = 0
    for m in queued_methods:
        waiting[m] = waiting.get(m, 0) + 1
        depth += 1
    eps = [c.statistics(waiting.get(c.name, 0)) for c in counters]
    eps.sort(key=lambda e: e.name)
    return ActorStatistics(name, cls, depth, max(queue_peak, depth), eps)


# ------------------------------------------------------------- histograms


def bucket_bounds(i: int) -> tuple[float, float]:
    """The latency range of bucket ``i``, in seconds."""
    lo = 0 if i == 0 else (1 << (i - 1)) * BUCKET_UNIT_NS
    hi = (1 << i) * BUCKET_UNIT_NS
    return lo / 1e9, hi / 1e9


def percentile(hist: Sequence[int], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of a histogram, in seconds; ``None`` if empty.

    Interpolates linearly inside the bucket where the rank falls.
    """
    total = sum(hist)
    if total <= 0:
        return None
    rank = q / 100.0 * total
    seen = 0
    for i, n in enumerate(hist):
        if n <= 0:
            continue
        if seen + n >= rank:
            lo, hi = bucket_bounds(i)
            frac = (rank - seen) / n
            return lo + (hi - lo) * max(0.0, min(1.0, frac))
        seen += n
    return bucket_bounds(len(hist) - 1)[1]


def subtract(new: Sequence[int], old: Sequence[int]) -> list[int]:
    """``new - old`` bucket by bucket (a missing ``old`` counts as zeros)."""
    if not old:
        return list(new)
    return [max(0, a - b) for a, b in zip(new, old, strict=False)] + list(new[len(old) :])


# ------------------------------------------------------------- samplers


class ProcSampler:
    """CPU % (since the previous sample), RSS and uptime of this process."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._last = (self.started, _cpu_seconds())

    def sample(self) -> tuple[float, int, float]:
        """Return ``(cpu_percent, rss_bytes, uptime_s)``."""
        now, cpu = time.monotonic(), _cpu_seconds()
        then, cpu0 = self._last
        self._last = (now, cpu)
        pct = 100.0 * (cpu - cpu0) / (now - then) if now > then else 0.0
        return pct, _rss(), now - self.started


class HostSampler:
    """Host CPU % (since the previous sample), memory and load, from ``/proc``."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._cpu = _host_cpu()

    def sample(self, hostname: str) -> HostStatistics:
        busy0, total0 = self._cpu
        busy, total = self._cpu = _host_cpu()
        pct = 100.0 * (busy - busy0) / (total - total0) if total > total0 else 0.0
        mem_total, mem_avail = _meminfo()
        try:
            load = list(os.getloadavg())
        except OSError:
            load = []
        return HostStatistics(
            hostname=hostname,
            pid=os.getpid(),
            uptime=time.monotonic() - self.started,
            cpus=os.cpu_count() or 1,
            cpu_percent=pct,
            mem_total=mem_total,
            mem_used=max(0, mem_total - mem_avail),
            load=load,
        )


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _host_cpu() -> tuple[int, int]:
    """``(busy, total)`` jiffies of all CPUs."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user
    return total - idle, total


def _meminfo() -> tuple[int, int]:
    """``(MemTotal, MemAvailable)`` in bytes."""
    total = avail = 0
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    total = int(line.split()[1]) * 1024
                elif line.startswith(b"MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return total, avail
