"""The statistics an agent holds for ``zmesh top``: its host's, its procs'
latest, and the replica tables its services' orchestrators report.

No sockets here: the agent records what arrives and publishes ``Stats``
(``snapshot``) about once a second on a stream of its own.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable

from zmesh._shared import stats as _stats

SERVICE_TTL = 5.0  # a service unheard of this long has stopped reporting


class StatsBook:
    """The latest statistics of one agent's host, procs and services."""

    def __init__(self) -> None:
        # The latest statistics of each running proc, by (mesh, rank).
        self.procs: dict[tuple[str, int], _stats.ProcStatistics] = {}
        # Services' replica tables, as their orchestrators report them, and
        # when; by the service's id, as two services may share a name (two
        # scripts each running an "embedder").
        self.services: dict[str, tuple[_stats.ServiceSummary, float]] = {}
        self._sampler = _stats.HostSampler()
        self._host: _stats.HostStatistics | None = None

    def record_proc(self, st: _stats.ProcStatistics) -> None:
        """Keep a live proc's latest statistics."""
        self.procs[(st.mesh, st.rank)] = st

    def record_service(self, summary: _stats.ServiceSummary) -> None:
        """Keep a service's latest replica table."""
        self.services[summary.id or summary.name] = (summary, time.monotonic())

    def sample_host(self) -> None:
        """Take a fresh sample of the host (CPU, memory, load)."""
        self._host = self._sampler.sample(socket.gethostname())

    def host(self) -> _stats.HostStatistics:
        """The host's latest sample (one is taken if there is none yet)."""
        if self._host is None:
            self.sample_host()
        assert self._host is not None
        return self._host

    def current(
        self, live: Iterable[tuple[str, int]]
    ) -> tuple[list[_stats.ProcStatistics], list[_stats.ServiceSummary]]:
        """The statistics of the procs in ``live`` and of services still reporting.

        What belongs to a proc not in ``live``, or to a service unheard of
        for ``SERVICE_TTL``, is history and is dropped.
        """
        alive = set(live)
        for key in [k for k in self.procs if k not in alive]:
            del self.procs[key]  # the proc is gone: its numbers are history
        now = time.monotonic()
        for sid in [k for k, (_, seen) in self.services.items() if now - seen > SERVICE_TTL]:
            del self.services[sid]  # its orchestrator stopped reporting
        return list(self.procs.values()), [s for s, _ in self.services.values()]
