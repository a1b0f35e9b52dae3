"""An explicit response port handed on to a process that then dies.

An endpoint with an explicit response port may pass the port on (as an
argument of a call to another actor) and return: the other actor answers
the caller later. The caller never called that actor, and the port's guard
in the endpoint's proc was disarmed when the port was pickled
(``zmesh._host.proc.responseport``). So the proc that unpickles the port
tells its receiver that it holds it (``channels._PortHeld``), and the caller
watches that proc as it watches the procs it calls: killed before it
answers, the call fails with ``SupervisionError``, with a timeout or
without, however far the port was handed on. Before, a call without a
timeout waited for ever.

The note travels on its own: a holder killed in the moment between
receiving the port and its note leaving is not seen (the call's timeout
bounds that case), so the tests kill once the caller has heard.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import zmesh
from zmesh._client.calls import runtime as _runtime

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]


class Keeper(zmesh.Actor):
    """Keeps the ports it is given, to answer later (or is killed first)."""

    def __init__(self) -> None:
        self.ports: list[Any] = []

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def keep(self, port: Any) -> None:
        self.ports.append(port)

    @zmesh.endpoint
    async def kept(self) -> int:
        return len(self.ports)

    @zmesh.endpoint
    async def answer_all(self, value: Any) -> None:
        for port in self.ports:
            port.send(value)
        self.ports.clear()

    @zmesh.endpoint
    async def pass_on(self, other: Any) -> None:
        for port in self.ports:
            await other.keep.call_one(port)
        self.ports.clear()


class Front(zmesh.Actor):
    @zmesh.endpoint(explicit_response_port=True)
    async def ask(self, port: Any, keeper: Any) -> None:
        await keeper.keep.call_one(port)  # the keeper answers the caller, later


@pytest.fixture
async def meshes() -> AsyncIterator[tuple[Any, Any, Any]]:
    keeper = await Keeper.options().as_actor()
    other = await Keeper.options().as_actor()
    front = await Front.options().as_actor()
    yield keeper, other, front
    for mesh in (front, other, keeper):
        await mesh.stop()


@pytest.mark.parametrize("timeout", [None, 30.0])
async def test_the_holders_death_fails_the_call(
    meshes: tuple[Any, Any, Any], timeout: float | None
) -> None:
    keeper, _, front = meshes
    pid = await keeper.pid.call_one()
    call = front.ask.options(timeout=timeout).call_one(keeper)
    await wait_kept(keeper, 1)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(zmesh.SupervisionError) as info:
        await asyncio.wait_for(call, 10.0)  # the death is known within a second or so
    assert info.value.mesh == keeper.proc_mesh


async def test_a_port_handed_on_twice_fails_with_its_last_holder(
    meshes: tuple[Any, Any, Any],
) -> None:
    keeper, other, front = meshes
    call = front.ask.call_one(keeper)
    await wait_kept(keeper, 1)
    await keeper.pass_on.call_one(other)
    await wait_kept(other, 1)
    pid = await other.pid.call_one()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(zmesh.SupervisionError) as info:
        await asyncio.wait_for(call, 10.0)
    assert info.value.mesh == other.proc_mesh


async def test_a_live_holder_answers_and_the_note_is_not_the_answer(
    meshes: tuple[Any, Any, Any],
) -> None:
    """The holder's note travels on the port before the answer: a once port
    takes the answer, not the note; a user's own port never shows the note."""
    keeper, other, front = meshes
    call = front.ask.call_one(keeper)
    await wait_kept(keeper, 1)
    await keeper.pass_on.call_one(other)
    await other.answer_all.call_one("late answer")
    assert await asyncio.wait_for(call, 10.0) == "late answer"

    port, receiver = zmesh.Channel.open()
    zmesh.send(front.ask, (keeper,), port=port)
    await wait_kept(keeper, 1, heard=False)  # (a user's own port: nobody watches)
    await keeper.answer_all.call_one("to my port")
    assert await asyncio.wait_for(receiver.recv(), 10.0) == "to my port"
    assert receiver.statistics().received == 1


@pytest.mark.stress
async def test_many_calls_held_by_one_proc_all_fail_when_it_dies(
    meshes: tuple[Any, Any, Any],
) -> None:
    """200 calls (20x a usual burst) whose ports one proc holds: its kill -9
    fails every one, promptly, none left waiting."""
    keeper, _, front = meshes
    calls = [asyncio.ensure_future(front.ask.call_one(keeper)) for _ in range(200)]
    await wait_kept(keeper, 200, timeout=60)
    pid = await keeper.pid.call_one()
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    done, late = await asyncio.wait(calls, timeout=15.0)
    assert not late, f"{len(late)} calls still waiting 15 s after their holder died"
    assert all(isinstance(c.exception(), zmesh.SupervisionError) for c in done)
    print(f"200 calls failed within {time.monotonic() - start:.2f}s of the kill")


async def wait_kept(keeper: Any, n: int, timeout: float = 20.0, heard: bool = True) -> None:
    """Until ``keeper`` holds ``n`` ports (and, with ``heard``, a caller heard that it does)."""
    deadline = time.monotonic() + timeout
    while await keeper.kept.call_one() < n or (heard and not watched(keeper)):
        assert time.monotonic() < deadline, f"the keeper never held {n} ports"
        await asyncio.sleep(0.02)


def watched(mesh: Any) -> bool:
    """Whether a call of ours watches ``mesh``'s proc (told it holds its port)."""
    rt, _ = _runtime.current()
    conn = rt.conns.get(mesh._refs[0].addr)
    return conn is not None and bool(conn.watchers)
