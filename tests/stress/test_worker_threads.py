"""Sync work that waits for other sync work must all get a thread.

Sync endpoints, sync generators and ``__init__`` run in a proc's worker
threads. With a fixed pool (it was 64 threads), work beyond the pool queued
behind threads that were waiting for it: 100 actors of one proc meeting at
a barrier broke it after its timeout, and 64 sync streams waiting for their
readers left no thread for any other sync call of the proc.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh
from zmesh.testing import local_mesh

pytestmark = pytest.mark.stress

ACTORS = 300
STREAMS = 100
WAIT = 15.0
_state: dict[str, Any] = {}
_lock = threading.Lock()


def _barrier(n: int) -> threading.Barrier:
    with _lock:  # one per process: all the actors of a proc share it
        if "barrier" not in _state:
            _state["barrier"] = threading.Barrier(n, timeout=WAIT)
        barrier: threading.Barrier = _state["barrier"]
        return barrier


class Meet(zmesh.Actor):
    @zmesh.endpoint
    def meet(self, n: int) -> int:
        _barrier(n).wait()  # all n at once, or BrokenBarrierError after WAIT
        return 1

    @zmesh.endpoint(concurrent=True, window=1)
    def tokens(self) -> Iterator[int]:
        i = 0
        while True:  # each open stream holds a thread while it waits for credit
            yield i
            i += 1

    @zmesh.endpoint
    def ping(self, x: int) -> int:
        return x


def test_hundreds_of_actors_of_one_proc_meet_in_sync_endpoints() -> None:
    mesh = Meet.options(procs=1, actors_per_proc=ACTORS).as_actor().get(timeout=60)
    try:
        t0 = time.monotonic()
        values = mesh.meet.call(ACTORS).get(timeout=WAIT + 15)
        assert sum(v for _, v in values.items()) == ACTORS
        assert time.monotonic() - t0 < WAIT, "the barrier broke: not every actor had a thread"
    finally:
        mesh.stop().get(timeout=30)


def test_a_sync_call_is_answered_while_many_sync_streams_wait_for_credit() -> None:
    mesh = Meet.options(procs=1).as_actor().get(timeout=60)
    streams = []
    try:
        for _ in range(STREAMS):
            s = mesh.tokens.call_one()
            it = iter(s)
            assert next(it) == 0  # open, and now waiting for credit in its thread
            streams.append(s)
        t0 = time.monotonic()
        assert mesh.ping.call_one(7).get(timeout=10) == 7
        assert time.monotonic() - t0 < 5.0
    finally:
        for s in streams:
            s.close()
        mesh.stop().get(timeout=30)


def test_local_mesh_ranks_meet_in_a_sync_endpoint() -> None:
    _state.clear()
    with local_mesh(Meet, procs=32) as mesh:
        values = mesh.meet.call(32).get(timeout=WAIT + 5)
        assert sum(v for _, v in values.items()) == 32
    _state.clear()
