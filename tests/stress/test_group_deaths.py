"""Ten actors of two crowded procs die at once, under a flood of calls to their neighbours.

32 actors in 2 procs (``actors_per_proc=16``). Ten of them, five in each
proc, each get a call that naps, then one that raises ``KeyboardInterrupt``
(it kills the actor, not its proc), then more calls queued behind: all at
once, while the 22 others get a flood of calls. Every call to a dead actor
must fail with ``SupervisionError`` naming its rank (none hangs, none
succeeds after the death), every call to a live one must succeed, and the
client's ``unhandled_fault_hook`` must see each death exactly once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import zmesh

from _helpers import wait_until

pytestmark = [pytest.mark.stress, pytest.mark.chaos]

PROCS, PER = 2, 16
VICTIMS = [1, 4, 7, 10, 13, 16, 19, 22, 25, 28]  # five in each proc
ROUNDS = 15  # of calls to each of the 22 survivors: 330 in all
BEHIND = 4  # calls queued behind each victim's fatal one


class Crowd(zmesh.Actor):
    @zmesh.endpoint
    async def rank(self) -> int:
        return zmesh.current_rank().rank

    @zmesh.endpoint
    async def nap(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return zmesh.current_rank().rank

    @zmesh.endpoint
    async def interrupt(self) -> None:
        raise KeyboardInterrupt("pulled the plug")


async def _outcome(fut: Any) -> tuple[bool, Any]:
    try:
        return True, await asyncio.wait_for(asyncio.ensure_future(_await(fut)), 30)
    except asyncio.TimeoutError:
        return False, "hung"
    except Exception as exc:
        return False, exc


async def _await(fut: Any) -> Any:
    return await fut


@pytest.mark.anyio
async def test_ten_actors_die_at_once_under_a_flood(faults: list[zmesh.MeshFailure]) -> None:
    mesh = await Crowd.options(procs=PROCS, actors_per_proc=PER).as_actor()
    flat = mesh.flatten("a")
    survivors = [r for r in range(PROCS * PER) if r not in VICTIMS]
    assert (await mesh.rank.call()).values() == list(range(PROCS * PER))

    doomed: list[tuple[int, str, Any]] = []
    for r in VICTIMS:  # each: a nap, the fatal call, then calls queued behind it
        one = flat.slice(a=r)
        doomed.append((r, "nap", one.nap.call_one(0.2)))
        doomed.append((r, "interrupt", one.interrupt.call_one()))
        doomed += [(r, "rank", one.rank.call_one()) for _ in range(BEHIND)]
    flood = [(r, flat.slice(a=r).rank.call_one()) for _ in range(ROUNDS) for r in survivors]

    got = await asyncio.gather(*(_outcome(f) for _, _, f in doomed))
    alive = await asyncio.gather(*(_outcome(f) for _, f in flood))

    for (r, what, _), (ok, value) in zip(doomed, got, strict=True):
        if what == "nap":  # it ran before the death
            assert ok and value == r, (r, value)
            continue
        assert not ok and isinstance(value, zmesh.SupervisionError), (r, what, value)
        assert value.rank == r and "KeyboardInterrupt: pulled the plug" in str(value), value
    for (r, _), (ok, value) in zip(flood, alive, strict=True):
        assert ok and value == r, (r, value)

    # Later calls: the dead fail at once, typed; the living answer.
    for r in VICTIMS:
        with pytest.raises(zmesh.SupervisionError):
            await asyncio.wait_for(_await(flat.slice(a=r).rank.call_one()), 10)
    assert [await flat.slice(a=r).rank.call_one() for r in survivors] == survivors

    await wait_until(lambda: len(faults) >= len(VICTIMS), 20, "the hook, for every death")
    with pytest.raises(zmesh.SupervisionError):  # a fan-out over the dead fails, typed
        await asyncio.wait_for(_await(mesh.rank.call()), 10)
    await flat.slice(a=0).rank.call_one()  # (a round trip more: a duplicate would be in)
    assert sorted(f.rank for f in faults) == VICTIMS  # each death once
    assert {f.mesh_name for f in faults} == {mesh.actor}
    assert all("KeyboardInterrupt: pulled the plug" in f.report() for f in faults)
    await mesh.stop()
