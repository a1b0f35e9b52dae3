"""Token streaming from a 2-replica generator service, surviving a replica kill.

A toy "language model" streams tokens from an async generator endpoint. It
runs as a service of two replicas: ``svc.generate(prompt)`` streams from one
replica the service's router picks, and the client prints each token as it
arrives. While that replica is still "prefilling" (before its first token)
the client kills it with SIGKILL: the request moves to the other replica
without the reader seeing anything but the delay, and every token arrives
once, in order. (A replica lost after the first token would end the stream
with ``zmesh.StreamInterruptedError`` instead: re-running the request would
repeat tokens the reader already has.)

Run: python examples/token_stream.py
Look for: "killed replica N before its first token", the tokens as they
arrive, "tokens: 12" and "moved to another replica: 1" at the end.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import zmesh

WORDS = "the quick brown fox jumps over the lazy dog and runs away".split()


class TinyLM(zmesh.Actor):
    """Streams one token at a time, after a "prefill" pause."""

    def __init__(self) -> None:
        self.prefilling = 0

    @zmesh.endpoint
    async def generate(self, prompt: str, prefill: float = 0.5) -> AsyncIterator[str]:
        self.prefilling += 1
        try:
            await asyncio.sleep(prefill)  # the first token takes a while
        finally:
            self.prefilling -= 1
        for word in WORDS:
            await asyncio.sleep(0.02)
            yield word

    @zmesh.endpoint(concurrent=True)  # answers even while a stream is open
    async def status(self) -> tuple[int, int]:
        """This replica's pid, and how many requests it is prefilling."""
        return os.getpid(), self.prefilling


async def prefilling_replica(svc: zmesh.Service) -> tuple[int, int]:
    """``(index, pid)`` of the replica the router gave the request to."""
    while True:
        for i in range(len(svc)):
            replica = svc.replica(i)
            if replica is not None:
                pid, prefilling = await replica.status.call_one()
                if prefilling:
                    return i, pid
        await asyncio.sleep(0.01)


async def main() -> None:
    svc = await TinyLM.options(replicas=2).spawn()
    tokens: zmesh.ItemStream[str] = svc.generate("tell me a story")
    index, pid = await asyncio.wait_for(prefilling_replica(svc), 10)
    os.kill(pid, signal.SIGKILL)
    print(f"killed replica {index} before its first token")
    count = 0
    async for token in tokens:
        print(token, end=" ", flush=True)
        count += 1
    print(f"\ntokens: {count}")
    print(f"moved to another replica: {svc.statistics().retried}")
    await svc.stop()


if __name__ == "__main__":
    asyncio.run(main())
