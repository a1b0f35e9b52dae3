"""Coalescing small messages into batches, on real ZeroMQ sockets over tcp loopback."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anyio
import msgspec
import pytest
import zmq

from zmesh._wire import messages as w
from zmesh._wire.codec import BIG_BUFFER, Codec
from zmesh._wire.zsock import BATCH_LINGER, BATCH_MARK, BATCH_MAX, AsyncSocket, configure

pytestmark = pytest.mark.anyio


def _call(i: int, arg: Any = 0) -> w.Call:
    return w.Call(i, "a", "m", w.Payload(args=(arg,)), 0.0, False)


class Pair:
    """A batching DEALER (under test) and a plain ROUTER peer, both on ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        ctx: zmq.Context[Any] = zmq.Context.instance()
        self.server = configure(ctx.socket(zmq.ROUTER))
        self.server.bind("tcp://127.0.0.1:*")
        self.frames: list[list[Any]] = []  # each message the ROUTER got, without identity
        self.got = asyncio.Event()
        self.peer = AsyncSocket(self.server, loop, self._on_server, router=True)
        dealer = configure(ctx.socket(zmq.DEALER))
        dealer.connect(self.server.getsockopt_string(zmq.LAST_ENDPOINT))
        self.client = AsyncSocket(dealer, loop, None, batch=True)
        self.codec = Codec(w.PROC_INBOX)

    def _on_server(self, frames: list[Any]) -> None:
        self.frames.append(frames[1:])
        self.got.set()

    def messages(self) -> list[Any]:
        """Everything received, batches opened, in arrival order."""
        out: list[Any] = []
        for frames in self.frames:
            env = frames[0]
            if env[0] == BATCH_MARK:
                out += self.codec.decode_batch(env)
            else:
                out.append(self.codec.decode(frames))
        return out

    async def wait_for(self, n: int) -> list[Any]:
        with anyio.fail_after(10):
            while len(self.messages()) < n:
                self.got.clear()
                await self.got.wait()
        return self.messages()

    def close(self) -> None:
        self.client.close()
        self.peer.close()


@pytest.fixture
async def pair() -> Any:
    p = Pair(asyncio.get_running_loop())
    yield p
    p.close()


async def test_one_message_goes_out_as_itself(pair: Pair) -> None:
    pair.client.send(pair.codec.encode(_call(1)))
    [msg] = await pair.wait_for(1)
    assert msg.id == 1
    assert pair.frames[0][0][0] != BATCH_MARK  # a peer that knows no batches reads it


async def test_messages_of_one_turn_share_a_batch_in_order(pair: Pair) -> None:
    for i in range(10):
        pair.client.send(pair.codec.encode(_call(i)))
    msgs = await pair.wait_for(10)
    assert [m.id for m in msgs] == list(range(10))
    # The first goes at once; the other nine wait for the turn's end, together.
    assert len(pair.frames) == 2
    assert pair.frames[1][0][0] == BATCH_MARK


async def test_a_full_batch_goes_out_at_once(pair: Pair) -> None:
    n = 3 * BATCH_MAX + 5
    for i in range(n):
        pair.client.send(pair.codec.encode(_call(i)))
    msgs = await pair.wait_for(n)
    assert [m.id for m in msgs] == list(range(n))
    sizes = [
        len(pair.codec.decode_batch(f[0])) if f[0][0] == BATCH_MARK else 1 for f in pair.frames
    ]
    assert max(sizes) == BATCH_MAX and sum(sizes) == n


async def test_a_message_with_buffers_keeps_its_place(pair: Pair) -> None:
    big = b"b" * (BIG_BUFFER + 1)
    for i in range(3):
        pair.client.send(pair.codec.encode(_call(i)))
    payload, buffers = Codec.pack((big,), {})
    pair.client.send(pair.codec.encode(w.Call(3, "a", "m", payload, 0.0, False), buffers))
    for i in range(4, 7):
        pair.client.send(pair.codec.encode(_call(i)))
    msgs = await pair.wait_for(7)
    assert [m.id for m in msgs] == list(range(7))
    with_buffers = next(f for f in pair.frames if len(f) > 1)
    assert bytes(with_buffers[1].buffer) == big


async def test_a_batch_decodes_as_one_msgpack_array(pair: Pair) -> None:
    for i in range(20):
        pair.client.send(pair.codec.encode(_call(i, f"v{i}")))
    await pair.wait_for(20)
    batch = pair.frames[1][0]
    raw = msgspec.msgpack.decode(batch[1:])  # a plain msgpack array of 19 messages
    assert len(raw) == 19 and raw[0][0] == "Call"


_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError)


def test_a_malformed_batch_raises_a_catchable_error() -> None:
    codec = Codec(w.PROC_INBOX)
    ext = msgspec.msgpack.encode(_call(1, msgspec.msgpack.Ext(1, b"\x01\x00\x00\x00")))
    for bad in (b"\xc1", b"\xc1\x92\x01\x02", b"\xc1" + b"\x91" * 100_000, b"\xc1\x91" + ext):
        with pytest.raises(_DECODE_ERRORS):
            codec.decode_batch(bad)


async def test_a_batch_does_not_wait_behind_a_caller_computing() -> None:
    """A caller that computes between sends (not yielding) still gets them out."""
    ctx: zmq.Context[Any] = zmq.Context.instance()
    server = configure(ctx.socket(zmq.ROUTER))  # read without the loop, which stays busy
    server.bind("tcp://127.0.0.1:*")
    dealer = configure(ctx.socket(zmq.DEALER))
    dealer.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))
    client = AsyncSocket(dealer, asyncio.get_running_loop(), None, batch=True)
    codec = Codec(w.PROC_INBOX)
    try:
        await asyncio.sleep(0)  # the socket's first reader pass
        for i in range(3):
            client.send(codec.encode(_call(i)))
            busy_until = time.monotonic() + 2 * BATCH_LINGER
            while time.monotonic() < busy_until:  # work, without yielding to the loop
                pass
        # Still in the same loop turn: the first went at once, and the third
        # send flushed the second (with itself): it had waited past BATCH_LINGER.
        got: list[int] = []
        while len(got) < 2 and server.poll(5000):
            env = server.recv_multipart()[1]
            msgs = codec.decode_batch(env) if env[0] == BATCH_MARK else [codec.decode([env])]
            got += [m.id for m in msgs]
        assert got[:2] == [0, 1]
    finally:
        client.close()
        server.close(linger=0)


async def test_replies_queued_before_a_handler_raises_still_go_out() -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    loop = asyncio.get_running_loop()
    codec = Codec(w.PROC_INBOX)
    seen: list[int] = []

    def handle(frames: list[Any]) -> None:
        msg = codec.decode(frames[1:])
        seen.append(msg.id)
        server.send([frames[0], *codec.encode(_call(100 + msg.id))])
        if msg.id == 1:
            raise RuntimeError("a handler bug")  # the loop logs it

    router = configure(ctx.socket(zmq.ROUTER))
    router.bind("tcp://127.0.0.1:*")
    server = AsyncSocket(router, loop, handle, router=True, batch=True)
    client = configure(ctx.socket(zmq.DEALER))  # a plain peer, read without the loop
    client.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    loop.set_exception_handler(lambda loop, context: None)  # the bug is expected
    try:
        client.send_multipart(codec.encode(_call(0)))
        client.send_multipart(codec.encode(_call(1)))
        got: list[int] = []
        with anyio.fail_after(10):
            while len(got) < 2:
                if client.poll(0):
                    env = client.recv_multipart()[0]
                    batch = env[0] == BATCH_MARK
                    got += [
                        m.id for m in (codec.decode_batch(env) if batch else [codec.decode([env])])
                    ]
                else:
                    await asyncio.sleep(0.01)
        assert got == [100, 101]
    finally:
        loop.set_exception_handler(None)
        server.close()
        client.close(linger=0)
