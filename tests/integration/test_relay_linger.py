"""How long a relay holds its answers (``zmesh._host.proc.relayback``).

A relay sends a call's answers back together when they come within its
linger (``ZMESH_RELAY_LINGER``, 20 ms): one message, one wake-up of the
sender, instead of one per answer. A failure does not wait: the caller's
``call()`` fails at the first failure, so a relay sends it at once, even
while other targets are still running.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

import zmesh
from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls import tree as _tree

pytestmark = pytest.mark.slow

PROCS = 4  # one host: rank 0 is the relay


class Late(zmesh.Actor):
    @zmesh.endpoint
    async def late(self, rank: int, seconds: float) -> int:
        """Answer at once, but ``rank`` answers ``seconds`` later."""
        me = zmesh.current_rank().rank
        if me == rank:
            await asyncio.sleep(seconds)
        return me

    @zmesh.endpoint
    async def fail_or_nap(self, failing: int, napping: int, seconds: float) -> int:
        me = zmesh.current_rank().rank
        if me == failing:
            raise ValueError(f"rank {me} fails")
        if me == napping:
            await asyncio.sleep(seconds)
        return me


@pytest.fixture(autouse=True)
def through_relays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tree, "MODE", "tree")


def received() -> int:
    """Messages this client's proc connections have received so far."""
    rt, _ = _runtime.current()
    return sum(c.sock.received for c in rt.conns.values() if c.sock is not None)


def test_answers_a_few_ms_apart_come_back_as_one_message() -> None:
    mesh = Late.options(procs=PROCS).as_actor().get(timeout=60)
    for _ in range(3):  # warm: the relay and its links
        mesh.late.call(-1, 0).get(timeout=30)
    counts = []
    for _ in range(15):
        before = received()
        # Rank 3 answers 10 ms after the others: past a 5 ms linger (two
        # messages back), within 20 ms (one).
        assert mesh.late.call(3, 0.01).get(timeout=30).values() == list(range(PROCS))
        counts.append(received() - before)
    assert statistics.median(counts) == 1, counts
    mesh.stop().get(timeout=30)


def test_a_failure_goes_back_at_once_while_others_still_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A long linger: the failure must not wait for it, nor for the napping rank.
    monkeypatch.setenv("ZMESH_RELAY_LINGER", "5")
    mesh = Late.options(procs=PROCS).as_actor().get(timeout=60)
    mesh.late.call(-1, 0).get(timeout=30)  # warm: the relay and its links
    t0 = time.monotonic()
    with pytest.raises(zmesh.ActorError, match="rank 1 fails"):
        mesh.fail_or_nap.call(1, 3, 3.0).get(timeout=30)
    took = time.monotonic() - t0
    assert took < 1.5, f"the failure took {took:.2f} s to reach the caller"
    mesh.stop().get(timeout=30)
