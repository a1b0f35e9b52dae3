#!/usr/bin/env python
"""Where a sync ``.get()`` round trip's time goes beyond raw pyzmq's.

Run from the repository root: ``python tools/bench_sync.py [ROUNDS]``.

Three callers in one thread with no event loop, alternating in chunks of 10
calls (so a shared machine's drift hits all three):

* **raw**: a blocking DEALER ``send`` + ``recv`` to ``tools/raw_echo.py``
  (the sync row's baseline in ``tools/bench.py``);
* **raw client -> proc**: the same blocking DEALER, but speaking zmesh's
  envelope to a zmesh proc (one ``Call`` encoded per call, the reply
  received as bytes and not decoded): the proc's share;
* **zmesh**: ``ref.echo.call_one(x).get()``, the lane (``zmesh._client.calls.lanes``).

"raw client -> proc" over raw is what the proc adds; zmesh over
"raw client -> proc" is what the calling side adds.
"""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import zmq

import zmesh
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec
from zmesh._wire.security import secure_client
from zmesh._wire.zsock import configure

PAYLOAD = b"x" * 64
CHUNK = 10
CHUNKS = 300


class Echo(zmesh.Actor):
    @zmesh.endpoint
    async def echo(self, x: bytes) -> bytes:
        return x


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    echo = Path(__file__).with_name("raw_echo.py")
    srv = subprocess.Popen(
        [sys.executable, str(echo)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert srv.stdout is not None and srv.stdin is not None
    ctx: zmq.Context[Any] = zmq.Context.instance()
    raw: zmq.Socket[Any] = ctx.socket(zmq.DEALER)
    raw.connect(srv.stdout.readline().strip())
    mesh = Echo.options(procs=1).as_actor().get(timeout=60)
    ref = mesh._refs[0]
    sock: zmq.Socket[Any] = configure(ctx.socket(zmq.DEALER), data=True)
    proc = secure_client(sock, addr=ref.addr)
    proc.connect(ref.addr)
    encode = Codec(w.CLIENT_INBOX).encode_envelope
    ids = itertools.count(1 << 40)  # far from the lane's own ids: its own connection anyway
    actor = mesh.actor

    def call_raw() -> None:
        raw.send(PAYLOAD)
        raw.recv()

    def call_proc() -> None:
        proc.send(encode(w.Call(next(ids), actor, "echo", w.Payload((PAYLOAD,)), 0.0)))
        proc.recv()

    def call_zmesh() -> None:
        mesh.echo.call_one(PAYLOAD).get(timeout=30)

    sides = {"raw": call_raw, "raw client -> proc": call_proc, "zmesh": call_zmesh}
    try:
        for fn in sides.values():
            for _ in range(300):
                fn()
        pc = time.perf_counter_ns
        for r in range(rounds):
            samples: dict[str, list[int]] = {name: [] for name in sides}
            for c in range(CHUNKS):
                names = list(sides) if c % 2 == 0 else list(reversed(sides))
                for name in names:
                    fn, out = sides[name], samples[name]
                    for _ in range(CHUNK):
                        t = pc()
                        fn()
                        out.append(pc() - t)
            p50 = {name: statistics.median(s) / 1000 for name, s in samples.items()}
            base = p50["raw"]
            print(
                f"round {r + 1}: "
                + "  ".join(f"{n} {v:.0f} µs ({v / base:.2f}x)" for n, v in p50.items())
            )
    finally:
        proc.close(linger=0)
        raw.close(linger=0)
        srv.stdin.close()
        srv.wait(timeout=10)
        mesh.stop().get(timeout=30)
        zmesh.shutdown()


if __name__ == "__main__":
    main()
