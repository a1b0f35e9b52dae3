"""A port nobody reads: bounded by count and bytes, and no value lost without a count.

Senders flood a ``PortReceiver`` in this process that is never read, with
many small values and with 1 MiB ones. This process's RSS must stay under a
stated bound (it grew ~1 GiB for a million 1 KiB values before), every value
a ``send`` accepted is either received or counted as dropped (exactly), the
senders are told (``PortFullError``) and the drops are in the stats, and once
the reader catches up the port works again.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import anyio
import pytest

import zmesh
from zmesh import Channel, Port, PortFullError
from zmesh._client.calls import runtime as _runtime
from zmesh._client.ports import portsockets as _portsockets
from zmesh._wire import messages as w

pytestmark = [pytest.mark.stress, pytest.mark.anyio]

MiB = 1 << 20


class Sender(zmesh.Actor):
    @zmesh.endpoint
    async def flood(self, port: Port[Any], n: int, size: int) -> tuple[int, int]:
        """Send ``n`` values of ``size`` bytes as fast as it can: (accepted, refused)."""
        value = b"v" * size
        sent = refused = 0
        for i in range(n):
            try:
                port.send(value)
                sent += 1
            except PortFullError as exc:
                assert exc.port == port.number and exc.reason, exc
                refused += 1
            if i % 500 == 0:
                await asyncio.sleep(0)  # let acks in, as a real producer would
        return sent, refused

    @zmesh.endpoint
    async def one(self, port: Port[Any], value: Any) -> bool:
        """Send one value: whether it was accepted."""
        try:
            port.send(value)
            return True
        except PortFullError:
            return False


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _settled(receiver: Any, accepted: int, within: float) -> Any:
    """The receiver's statistics once every accepted value is accounted for."""
    deadline = time.monotonic() + within
    while True:
        stats = receiver.statistics()
        if stats.received + stats.dropped >= accepted or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.05)


async def _proc_refusals(mesh: Any) -> int:
    """``port_refused`` of the mesh's procs, from their agent's stats (about once a second)."""
    rt, _ = _runtime.current()
    total = 0
    for ref in mesh._refs:
        agent = rt.controller.agents[ref.agent]
        reply = await agent.request(w.GetStats)
        total += sum(p.port_refused for p in reply.stats.procs if p.mesh == mesh.proc_mesh)
    return total


@pytest.mark.parametrize(
    ("n", "size", "procs", "bound"),
    [
        (100_000, 1024, 2, 80 * MiB),  # 200k 1 KiB values: 10,000 kept, 2 x 10,000 in pipes
        (1_000, MiB, 2, 192 * MiB),  # 2k 1 MiB values: 64 MiB queued, 64 MiB in the pipe
    ],
    ids=["200k-small", "2k-1MiB"],
)
async def test_an_unread_port_stays_bounded_and_counts_every_drop(
    n: int, size: int, procs: int, bound: int
) -> None:
    mesh = await Sender.options(procs=procs).as_actor()
    try:
        port, receiver = Channel.open()
        await mesh.one.call(port, b"warm")  # sockets made, connected: not part of the growth
        for _ in range(procs):
            await receiver.recv()
        dropped_before = _portsockets.dropped_values()
        warm = receiver.statistics().received
        before = rss(os.getpid())
        with anyio.fail_after(60):
            results = list((await mesh.flood.call(port, n, size)).values())
        accepted = sum(sent for sent, _ in results)
        refused = sum(r for _, r in results)
        assert accepted + refused == n * procs
        assert refused > 0, "the senders were never told the receiver is full"
        stats = await _settled(receiver, warm + accepted, 20)
        grew = rss(os.getpid()) - before
        print(f"accepted {accepted}, refused {refused}, {stats}, RSS grew {grew / MiB:.0f} MiB")
        # Never silent: what was accepted and not received is counted, exactly.
        assert stats.dropped == accepted - (stats.received - warm), stats
        assert _portsockets.dropped_values() - dropped_before == stats.dropped
        # Bounded: by count and by bytes.
        assert stats.queued == stats.received - warm <= _portsockets.PORT_MAX_VALUES, stats
        assert stats.queued_bytes <= _portsockets.PORT_MAX_BYTES, stats
        assert grew < bound, f"the receiving process grew {grew / MiB:.0f} MiB"
        # The senders' procs report their refusals in their stats.
        deadline = time.monotonic() + 10
        while await _proc_refusals(mesh) < refused and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
        assert await _proc_refusals(mesh) >= refused
        # Read it all: the port works again (the senders hear it has room).
        for _ in range(stats.queued):
            await receiver.recv()
        deadline = time.monotonic() + 10
        accepted = 0
        while not accepted:
            accepted = sum((await mesh.one.call(port, "again")).values())
            assert accepted or time.monotonic() < deadline, "the port never took values again"
            await asyncio.sleep(0.1)
        with anyio.fail_after(10):
            got = [await receiver.recv() for _ in range(accepted)]
        assert got == ["again"] * accepted
        receiver.close()
    finally:
        await mesh.stop()


class Holder(zmesh.Actor):
    """Opens a channel in its proc and never reads it."""

    @zmesh.endpoint
    async def open(self) -> Port[bytes]:
        self.port, self.receiver = Channel.open()
        return self.port

    @zmesh.endpoint
    async def account(self) -> tuple[int, int, int]:
        s = self.receiver.statistics()
        return s.received, s.dropped, s.queued


async def _proc_dropped(mesh: Any) -> int:
    rt, _ = _runtime.current()
    agent = rt.controller.agents[mesh._refs[0].agent]
    reply = await agent.request(w.GetStats)
    return sum(p.port_dropped for p in reply.stats.procs if p.mesh == mesh.proc_mesh)


async def test_a_port_in_a_proc_counts_its_drops_in_the_procs_statistics() -> None:
    holder = await Holder.options().as_actor()
    try:
        port = await holder.open.call_one()
        refused_before = _portsockets.refused_values()
        accepted = refused = 0
        for i in range(50_000):  # from this client, as fast as it can
            try:
                port.send(b"c" * 1024)
                accepted += 1
            except PortFullError:
                refused += 1
            if i % 500 == 0:
                await asyncio.sleep(0)
        assert refused > 0 and _portsockets.refused_values() - refused_before == refused
        deadline = time.monotonic() + 20
        while True:
            received, dropped, queued = await holder.account.call_one()
            if received + dropped >= accepted or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert dropped == accepted - received and queued == received <= 10_000
        while await _proc_dropped(holder) < dropped and time.monotonic() < deadline:
            await asyncio.sleep(0.3)  # statistics reach the agent about once a second
        assert await _proc_dropped(holder) == dropped
    finally:
        await holder.stop()


async def test_garbage_sent_to_a_port_inbox_is_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import zmq

    from zmesh._client.ports.portsockets import _server

    port, receiver = Channel.open()
    rt, _ = _runtime.current()
    server = _server(rt)
    ctx: Any = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(port.addr)
    try:
        with caplog.at_level("WARNING", logger="zmesh.ports"):
            for i in range(1000):
                sock.send_multipart([b"\xc1 not msgpack %d" % i])
            deadline = time.monotonic() + 10
            while server.garbled < 1000 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        assert server.garbled == 1000
        said = [r for r in caplog.records if "does not decode" in r.getMessage()]
        assert len(said) == 1, len(said)
        port.send("still works")  # the inbox serves on
        with anyio.fail_after(10):
            assert await receiver.recv() == "still works"
    finally:
        sock.close()
        receiver.close()
