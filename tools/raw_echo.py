#!/usr/bin/env python
"""The raw baseline's server: a pyzmq ROUTER echo written the fast way.

asyncio + ``loop.add_reader`` on ``ZMQ_FD``, ``NOBLOCK`` sends and receives,
``EVENTS`` re-checked after every operation (``ZMQ_FD`` is edge-triggered),
``copy=False`` both ways. It imports nothing but asyncio and pyzmq, prints its
address, and exits when its stdin closes. ``tools/bench.py`` starts one for
the round-trip rows and one per target for the raw fan-out rows.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from typing import Any

import zmq


async def serve() -> None:
    loop = asyncio.get_running_loop()
    ctx: zmq.Context[Any] = zmq.Context.instance()
    sock: zmq.Socket[Any] = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.bind("tcp://127.0.0.1:*")
    pending: deque[list[Any]] = deque()
    done = loop.create_future()

    def on_ready() -> None:
        while True:
            ev = sock.getsockopt(zmq.EVENTS)
            while pending and ev & zmq.POLLOUT:
                try:
                    sock.send_multipart(pending[0], zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                pending.popleft()
                ev = sock.getsockopt(zmq.EVENTS)
            if not ev & zmq.POLLIN:
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue
            if pending:
                pending.append(frames)
                continue
            try:
                sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pending.append(frames)

    def stdin_closed() -> None:
        if not done.done():
            done.set_result(None)

    fd = sock.getsockopt(zmq.FD)
    loop.add_reader(fd, on_ready)
    loop.add_reader(sys.stdin.fileno(), stdin_closed)
    print(sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    on_ready()
    await done
    loop.remove_reader(fd)  # before close: a callback must never see a closed socket
    sock.close(linger=0)


if __name__ == "__main__":
    asyncio.run(serve())
