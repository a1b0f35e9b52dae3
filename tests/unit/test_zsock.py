"""AsyncSocket's sends on real ZeroMQ sockets: a bad part never corrupts the stream."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import zmq

from zmesh._wire.zsock import HWM, MAX_MSG_SIZE, AsyncSocket, configure

pytestmark = pytest.mark.anyio


async def test_a_part_that_cannot_be_sent_is_refused_before_any_part_goes() -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
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


async def test_a_paused_socket_reads_nothing_until_resumed_and_loses_nothing() -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    loop = asyncio.get_running_loop()
    got: list[bytes] = []
    server = configure(ctx.socket(zmq.ROUTER), data=True)
    server.bind("tcp://127.0.0.1:*")
    reader = AsyncSocket(server, loop, lambda frames: got.append(frames[1]), router=True)
    dealer = configure(ctx.socket(zmq.DEALER), data=True)
    dealer.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        reader.pause()
        for i in range(100):
            dealer.send(b"%d" % i)
        await asyncio.sleep(0.3)  # time enough to arrive; nothing is read
        assert got == []
        reader.resume()
        deadline = loop.time() + 5
        while len(got) < 100 and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert got == [b"%d" % i for i in range(100)]
    finally:
        reader.close()
        dealer.close(linger=0)


async def test_a_dropped_connection_is_reported_by_the_monitor() -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    loop = asyncio.get_running_loop()
    server = configure(ctx.socket(zmq.ROUTER), data=True)
    server.bind("tcp://127.0.0.1:*")
    dealer = configure(ctx.socket(zmq.DEALER), data=True)
    dealer.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))
    client = AsyncSocket(dealer, loop, None)
    dropped = asyncio.Event()
    client.watch_disconnects(dropped.set)
    try:
        client.send([b"hello"])
        assert server.poll(5000)
        server.recv_multipart()
        server.close(linger=0)  # the peer goes away
        await asyncio.wait_for(dropped.wait(), 5)
    finally:
        client.close()


def test_call_sockets_have_no_zmtp_heartbeats_and_control_sockets_do() -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    data = configure(ctx.socket(zmq.DEALER), data=True)
    control = configure(ctx.socket(zmq.DEALER))
    try:
        assert data.getsockopt(zmq.HEARTBEAT_IVL) == 0
        assert data.getsockopt(zmq.TCP_KEEPALIVE) == 1
        assert control.getsockopt(zmq.HEARTBEAT_IVL) == 100
        assert control.getsockopt(zmq.HEARTBEAT_TIMEOUT) == 500
        for s in (data, control):
            assert s.getsockopt(zmq.MAXMSGSIZE) == MAX_MSG_SIZE
            assert s.getsockopt(zmq.RCVHWM) == HWM
    finally:
        data.close(linger=0)
        control.close(linger=0)


async def test_a_shared_socket_sends_from_another_thread_and_reads_on() -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    loop = asyncio.get_running_loop()
    got: asyncio.Queue[list[Any]] = asyncio.Queue()
    router = configure(ctx.socket(zmq.ROUTER))
    router.bind("tcp://127.0.0.1:*")
    server = AsyncSocket(router, loop, got.put_nowait, router=True, batch=True)
    server.share()
    dealer = configure(ctx.socket(zmq.DEALER))
    dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        dealer.send(b"one")
        ident, body = await asyncio.wait_for(got.get(), 5)
        assert body == b"one"
        sent = await asyncio.to_thread(server.send_from_thread, [ident, b"back"], lambda: True)
        refused = await asyncio.to_thread(server.send_from_thread, [ident, b"no"], lambda: False)
        assert (sent, refused) == (True, False)  # a failed claim sends nothing
        assert dealer.poll(5000) and dealer.recv() == b"back"
        assert not dealer.poll(200)
        server.recheck()  # (as the loop does after a send from the thread)
        dealer.send(b"two")
        assert (await asyncio.wait_for(got.get(), 5))[1] == b"two"
    finally:
        server.close()
        dealer.close(linger=0)


async def test_a_send_from_another_thread_that_takes_the_edge_wakes_the_loop() -> None:
    # ZMQ_FD is edge-triggered: the thread's send processes the socket's
    # pending commands, a message's arrival among them, and the loop's
    # descriptor goes quiet. Input waiting after the send must wake the loop.
    ctx: zmq.Context[Any] = zmq.Context.instance()
    loop = asyncio.get_running_loop()
    got: asyncio.Queue[list[Any]] = asyncio.Queue()
    router = configure(ctx.socket(zmq.ROUTER))
    router.bind("tcp://127.0.0.1:*")
    server = AsyncSocket(router, loop, got.put_nowait, router=True, batch=True)
    server.share()
    dealer = configure(ctx.socket(zmq.DEALER))
    dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        dealer.send(b"one")
        ident, _ = await asyncio.wait_for(got.get(), 5)
        sent = threading.Event()

        def answer() -> None:
            time.sleep(0.3)  # "two" has arrived by now; the loop is held
            server.send_from_thread([ident, b"back"], lambda: True)
            sent.set()

        thread = threading.Thread(target=answer)
        thread.start()
        dealer.send(b"two")
        sent.wait(10)  # holds the loop's thread, so only the thread touches the socket
        thread.join()
        assert (await asyncio.wait_for(got.get(), 3))[1] == b"two"
    finally:
        server.close()
        dealer.close(linger=0)
