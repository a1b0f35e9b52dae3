"""AsyncSocket's sends on real ZeroMQ sockets: a bad part never corrupts the stream."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from zmesh._zsock import AsyncSocket, configure

pytestmark = pytest.mark.anyio


async def test_a_part_that_cannot_be_sent_is_refused_before_any_part_goes() -> None:
    ctx = zmq.Context.instance()
    server = configure(ctx.socket(zmq.ROUTER))
    server.bind("tcp://127.0.0.1:*")
    dealer = configure(ctx.socket(zmq.DEALER))
    dealer.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))
    client = AsyncSocket(dealer, asyncio.get_running_loop(), None)
    try:
        strided = memoryview(bytearray(b"0123456789"))[::2]  # no one block to send
        with pytest.raises(BufferError):
            client.send([b"head", strided])
        client.send([b"next", b"intact"])
        assert server.poll(5000)
        # Nothing of the refused message went out, so the next one arrives
        # whole and alone, not glued onto a half-sent one.
        assert server.recv_multipart()[1:] == [b"next", b"intact"]
        assert not server.poll(200)
    finally:
        client.close()
        server.close(linger=0)
