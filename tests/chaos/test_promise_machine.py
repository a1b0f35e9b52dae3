"""The promise as a state machine: calls, kills, stops and closed streams in any order.

tests/chaos/test_promise_matrix.py holds each way of calling to the promise
under one fault at a time; here hypothesis interleaves the same operations
(``drive`` of tests/_promise.py) on a few producer meshes of 2 procs: spawn
one, call it any way (promptly or stuck past the call's timeout), kill -9 a
rank, stop a mesh, open a stream and walk away from it. After every step,
every call resolved within its budget with what the state says (a value, or
the typed error of a dead, stopped or stuck target), and every live actor
serves its next message.

Left out, because they break today (the matrix has them as strict xfails):
stopping a mesh while a call to it is in flight (steps run one at a time, so
a stop never lands mid-call), and a stuck explicit response port call (it
ignores its timeout).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import zmesh

from _helpers import wait_gone
from _keptagents import stop_meshes
from _promise import QUICK_PACE, WAYS, Pace, Producer, drive

pytestmark = [pytest.mark.chaos, pytest.mark.stress]

STUCK = Pace(seconds=1.5, count=2, gap=1.5, timeout=0.5)
MESH_WAYS = [w for w in WAYS if not w.startswith("svc_")]
ON_RANK_0 = {"call_one", "stream_sync", "stream_async", "port_send", "explicit_port"}
BUDGET = 5.0  # a call resolves this soon (a stuck one: after its 0.5 s timeout)
NEXT = 6.0  # a live actor answers its next message this soon (after stuck work ends)
DEAD = ("SupervisionError", "ConnectionLostError")


@dataclass
class Slot:
    """One producer mesh and what the test did to it."""

    mesh: zmesh.ActorMesh[Producer]
    pids: list[int]
    dead: set[int] = field(default_factory=set)
    stopped: bool = False


def _run(coro: Any, limit: float) -> tuple[bool, Any, float]:
    """(ok, value or exception, seconds); an AssertionError if it is not over in ``limit``."""

    async def bounded() -> tuple[bool, Any, float]:
        t0 = time.monotonic()
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=limit)
        took = time.monotonic() - t0
        assert done, f"not resolved within {limit}s"
        exc = task.exception()
        return (exc is None, task.result() if exc is None else exc, took)

    return asyncio.run(bounded())


class PromiseMachine(RuleBasedStateMachine):
    """Up to 3 producer meshes; each rule picks one by index among those it fits."""

    def __init__(self) -> None:
        super().__init__()
        self.markers = tempfile.mkdtemp(prefix="zm-machine-")
        self.slots: list[Slot] = []
        self.n = 0

    def _marker(self) -> str:
        self.n += 1
        return os.path.join(self.markers, str(self.n))

    def _pick(self, i: int, fits: Any = lambda s: True) -> Slot | None:
        slots = [s for s in self.slots if fits(s)]
        return slots[i % len(slots)] if slots else None

    @precondition(lambda self: len(self.slots) < 3)
    @rule()
    def spawn(self) -> None:
        mesh = Producer.options(procs=2).as_actor().get(timeout=30)
        pids = mesh.pid.options(timeout=10).call().get(timeout=15).values()
        self.slots.append(Slot(mesh, pids))

    @precondition(lambda self: self.slots)
    @rule(
        i=st.integers(0, 2),
        way=st.sampled_from(MESH_WAYS),
        stuck=st.sampled_from([False] * 3 + [True]),
    )
    def call(self, i: int, way: str, stuck: bool) -> None:
        self._call(i, way, stuck)

    @precondition(lambda self: self.slots)
    @rule(i=st.integers(0, 2), way=st.sampled_from(MESH_WAYS))
    def call_promptly(self, i: int, way: str) -> None:  # calls are most of what happens
        self._call(i, way, False)

    def _call(self, i: int, way: str, stuck: bool) -> None:
        slot = self._pick(i)
        assert slot is not None
        stuck = stuck and way != "explicit_port"  # it ignores its timeout (see the docstring)
        pace = STUCK if stuck else QUICK_PACE
        ok, value, took = _run(drive(way, slot.mesh, self._marker(), pace), BUDGET + 5)
        what = f"{way} ({'stuck' if stuck else 'prompt'}) on {slot}: {value!r} after {took:.2f}s"
        assert took <= BUDGET + (pace.timeout if stuck else 0), f"past its budget: {what}"
        if not ok:
            assert isinstance(value, zmesh.ZmeshError), f"not a zmesh error: {what}"
        if way == "broadcast":
            assert ok and value is None, what
            return
        used = {0} if way in ON_RANK_0 else {0, 1}
        if slot.stopped:
            assert not ok and isinstance(value, zmesh.ActorStoppedError), what
        elif way == "choose" and slot.dead and len(slot.dead) < 2:
            # the least loaded live rank, or a dead one's SupervisionError: either resolves
            assert ok or type(value).__name__ in DEAD, what
        elif used & slot.dead:
            assert not ok and type(value).__name__ in DEAD, what
        elif stuck:
            assert not ok and isinstance(value, zmesh.CallTimeoutError), what
        else:
            assert ok, what

    @precondition(lambda self: any(not s.stopped and len(s.dead) < 2 for s in self.slots))
    @rule(i=st.integers(0, 2), rank=st.integers(0, 1))
    def kill(self, i: int, rank: int) -> None:
        slot = self._pick(i, lambda s: not s.stopped and len(s.dead) < 2)
        assert slot is not None
        rank = rank if rank not in slot.dead else 1 - rank
        os.kill(slot.pids[rank], signal.SIGKILL)
        slot.dead.add(rank)
        wait_gone([slot.pids[rank]], 10, "the killed rank")

    @precondition(lambda self: not any(s.stopped for s in self.slots) and self.slots)
    @rule(i=st.integers(0, 2))
    def stop(self, i: int) -> None:
        slot = self._pick(i)
        assert slot is not None
        ok, value, _ = _run(_awaited(slot.mesh.stop()), BUDGET)
        assert ok, f"stop of {slot}: {value!r}"
        slot.stopped = True

    @precondition(lambda self: any(not s.stopped and 0 not in s.dead for s in self.slots))
    @rule(i=st.integers(0, 2), gen=st.sampled_from(["gen_sync", "gen_async"]))
    def walk_away(self, i: int, gen: str) -> None:
        """Read a few items of an endless stream, then close it (the reader goes away)."""
        slot = self._pick(i, lambda s: not s.stopped and 0 not in s.dead)
        assert slot is not None
        one = slot.mesh.flatten("r").slice(r=0)

        async def read() -> list[int]:
            stream = getattr(one, gen).options(timeout=5).call_one(self._marker(), 10_000, 0.005)
            got: list[int] = []
            try:
                async for i in stream:
                    got.append(i)
                    if len(got) == 3:
                        break
            finally:
                await stream.aclose()
            return got

        ok, value, _ = _run(read(), BUDGET)
        assert ok and value == [0, 1, 2], f"{gen} on {slot}: {value!r}"

    @invariant()
    def live_actors_serve(self) -> None:
        for slot in self.slots:
            if slot.stopped:
                continue
            flat = slot.mesh.flatten("r")
            for rank in set(range(2)) - slot.dead:
                ping = flat.slice(r=rank).ping.options(timeout=NEXT).call_one(rank)
                ok, value, took = _run(_awaited(ping), NEXT + 2)
                assert ok and value == rank, f"rank {rank} of {slot} after {took:.2f}s: {value!r}"

    def teardown(self) -> None:
        stop_meshes()
        shutil.rmtree(self.markers, ignore_errors=True)


async def _awaited(fut: zmesh.Future[Any]) -> Any:
    return await fut


PromiseMachine.TestCase.settings = settings(
    max_examples=4,
    stateful_step_count=15,
    deadline=None,
    derandomize=True,  # the same steps in every CI run: a failure reproduces
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_promise_machine = PromiseMachine.TestCase
