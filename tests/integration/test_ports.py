"""Ports and channels (Monarch's names): a port is a value any actor can send to.

``Channel.open()`` gives ``(Port, PortReceiver)``; the port travels as an
argument, through other actors, and values from one sender arrive in order.
``once=True`` refuses a second send; a port whose receiver is gone never
blocks its sender. ``explicit_response_port`` endpoints answer through a port;
``send(endpoint, args, kwargs, port=..., selection=...)`` sends answers to one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import zmesh
from zmesh import Channel, Port

pytestmark = pytest.mark.anyio


class Relay(zmesh.Actor):
    @zmesh.endpoint
    async def forward(self, port: Port[Any], hops: list[Any], value: int) -> None:
        """Pass ``port`` along ``hops`` (actor handles); the last one sends to it."""
        if not hops:
            port.send(value)
            return
        await hops[0].forward.call_one(port, hops[1:], value + 1)

    @zmesh.endpoint
    def burst(self, port: Port[int], n: int) -> float:
        t0 = time.monotonic()
        for i in range(n):
            port.send(i)
        return time.monotonic() - t0

    @zmesh.endpoint
    def burst_told(self, port: Port[int], n: int) -> tuple[float, int]:
        """``burst``, counting the sends refused with ``PortFullError``."""
        t0, refused = time.monotonic(), 0
        for i in range(n):
            try:
                port.send(i)
            except zmesh.PortFullError:
                refused += 1
        return time.monotonic() - t0, refused

    @zmesh.endpoint
    async def send_twice(self, port: Port[int]) -> None:
        port.send(1)
        port.send(2)

    @zmesh.endpoint(explicit_response_port=True)
    async def later(self, port: Port[int], x: int) -> None:
        async def answer() -> None:
            await asyncio.sleep(0.05)
            port.send(x + zmesh.current_rank().rank)

        self.task = asyncio.get_running_loop().create_task(answer())

    @zmesh.endpoint(explicit_response_port=True)
    async def refuse(self, port: Port[int]) -> None:
        raise RuntimeError("no answer")

    @zmesh.endpoint
    async def double(self, x: int) -> int:
        return 2 * x


@pytest.fixture
async def relays() -> AsyncIterator[zmesh.ActorMesh[Relay]]:
    mesh = await Relay.options(procs=3).as_actor()
    yield mesh
    await mesh.stop()


async def test_a_port_passed_through_two_actors_delivers_to_the_client(relays: Any) -> None:
    a, b, c = (relays.slice(procs=i) for i in range(3))
    port, receiver = Channel.open()
    await a.forward.call_one(port, [b, c], 1)  # a -> b -> c, and c sends
    assert await asyncio.wait_for(receiver.recv(), 10) == 3


async def test_values_from_one_sender_arrive_in_send_order(relays: Any) -> None:
    port, receiver = Channel.open()
    await relays.slice(procs=0).burst.call_one(port, 2000)
    assert [await receiver.recv() for _ in range(2000)] == list(range(2000))


async def test_open_once_refuses_a_second_send(relays: Any) -> None:
    port, receiver = Channel.open(once=True)
    port.send(7)
    with pytest.raises(ValueError, match="once=True"):
        port.send(8)
    assert await receiver.recv() == 7
    other, got = Channel.open(once=True)
    with pytest.raises(zmesh.ActorError, match="once=True"):
        await relays.slice(procs=1).send_twice.call_one(other)
    assert await got.recv() == 1


async def test_a_port_whose_receiver_is_gone_never_blocks_its_sender(relays: Any) -> None:
    port, receiver = Channel.open()
    del receiver  # nobody receives: the values are dropped where they arrive
    took, _ = await relays.slice(procs=0).burst_told.call_one(port, 20_000)
    assert took < 5.0  # (some may be refused: this process may read slower than that)
    dead: Port[int] = Port("ipc:///nonexistent/zmesh-port", 1)  # a receiving process that is gone
    # Its sender is told, at once, when it has sent its bound of values unread.
    took, refused = await relays.slice(procs=1).burst_told.call_one(dead, 20_000)
    # (A worker thread runs a little ahead of the loop that counts what went out.)
    assert took < 5.0 and refused > 20_000 - 11_000, (took, refused)
    dead.send(1)  # from here too: nothing unread from here yet, so it goes, not waiting


async def test_open_ranked_gives_the_senders_rank(relays: Any) -> None:
    port, receiver = Channel.open_ranked()
    zmesh.send(relays.double, (4,), port=port)  # each actor's answer goes to the port
    assert sorted([await receiver.recv() for _ in range(3)]) == [(0, 8), (1, 8), (2, 8)]
    zmesh.send(relays.double, (5,), port=port, selection="choose")
    rank, value = await receiver.recv()
    assert value == 10 and rank in (0, 1, 2)


async def test_explicit_response_port_endpoints_answer_through_their_port(relays: Any) -> None:
    assert await relays.slice(procs=2).later.call_one(5) == 7
    assert (await relays.later.call(5)).values() == [5, 6, 7]
    # Raising, it has no port left to answer with: the actor dies, as in Monarch.
    with pytest.raises(zmesh.SupervisionError, match="RuntimeError: no answer"):
        await relays.slice(procs=0).refuse.call_one()
    with pytest.raises(zmesh.SupervisionError, match=r"Endpoint call relay\.double\(\) failed"):
        await relays.slice(procs=0).double.call_one(1)
    assert await relays.slice(procs=1).double.call_one(1) == 2


def test_a_receiver_in_sync_code() -> None:
    mesh = Relay.options().as_actor().get(timeout=60)
    try:
        port, receiver = Channel.open()
        mesh.forward.call_one(port, [], 41).get(timeout=10)
        assert receiver.recv().get(timeout=10) == 41
    finally:
        mesh.stop().get(timeout=10)
