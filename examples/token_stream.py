"""Token streaming from a generator endpoint, surviving a replica kill before the first token.

Two replicas of a toy "language model" stream tokens with an async generator
endpoint. The client starts a request on replica 0 and kills it (kill -9)
while it is still "prefilling"; the stream fails with SupervisionError before
any token, so the request moves to replica 1, and the client prints the
tokens as they arrive. A failure after the first token would be raised
instead: re-running the request would repeat tokens the reader already has.

Run: python examples/token_stream.py
Look for: "failover: replica 0 died before the first token", the tokens
as they arrive, and "tokens: 12" at the end.
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

    @zmesh.endpoint
    async def generate(self, prompt: str, prefill: float = 0.5) -> AsyncIterator[str]:
        await asyncio.sleep(prefill)  # the first token takes a while
        for word in WORDS:
            await asyncio.sleep(0.02)
            yield word

    @zmesh.endpoint(concurrent=True)  # answers even while a stream is open
    async def pid(self) -> int:
        return os.getpid()


async def stream_with_failover(
    replicas: list[zmesh.ActorMesh[TinyLM]], prompt: str
) -> AsyncIterator[str]:
    """Tokens for ``prompt`` from the first replica that gets one out.

    A replica that dies before its first token costs nothing but time: the
    request moves on. After the first token, its failure is the caller's.
    """
    for i, replica in enumerate(replicas):
        started = False
        stream: zmesh.ItemStream[str] = replica.generate.call_one(prompt)
        try:
            async for token in stream:
                started = True
                yield token
            return
        except zmesh.SupervisionError:
            if started:
                raise
            print(f"failover: replica {i} died before the first token")
    raise zmesh.ServiceError("every replica failed before its first token")


async def main() -> None:
    replicas = [await TinyLM.options(name=f"lm{i}").as_actor() for i in range(2)]
    victim = await replicas[0].pid.call_one()

    async def kill_soon() -> None:
        await asyncio.sleep(0.2)  # replica 0 is prefilling now
        os.kill(victim, signal.SIGKILL)

    killer = asyncio.create_task(kill_soon())
    count = 0
    async for token in stream_with_failover(replicas, "tell me a story"):
        print(token, end=" ", flush=True)
        count += 1
    await killer
    print(f"\ntokens: {count}")
    for r in replicas:
        await r.stop()


if __name__ == "__main__":
    asyncio.run(main())
