"""Actors that greet and then talk to each other, written as a Monarch program.

The same program runs on Monarch with ``from monarch.actor import`` in
place of ``from zmesh import``: meshes come back at once from
``spawn_procs``/``spawn``, and a mesh still spawning can be handed to
another actor.
"""

import asyncio

from zmesh import Actor, current_rank, endpoint, this_host

WORKERS = 4


class Greeter(Actor):
    def __init__(self):
        self.rank = current_rank().rank

    @endpoint
    async def greet(self, text):
        print(f"greeter {self.rank} got {text!r}", flush=True)
        return self.rank


def make_greeters():
    procs = this_host().spawn_procs(per_host={"gpus": WORKERS})
    return procs.spawn("greeter", Greeter), procs


class Player(Actor):
    def __init__(self, label):
        self.label = label
        self.inbox = []

    @endpoint
    async def meet(self, other):
        # The actor at my own coordinates in the other mesh is my partner.
        self.partner = other.slice(**current_rank())
        self.me = current_rank().rank

    @endpoint
    async def serve(self, text):
        await self.partner.receive.call(f"{self.label}:{self.me} says {text}")

    @endpoint
    async def receive(self, text):
        self.inbox.append(text)
        print(f"{self.label}:{current_rank().rank} received {text!r}", flush=True)

    @endpoint
    async def received(self):
        return list(self.inbox)


async def main():
    greeters, _procs = make_greeters()
    await greeters.greet.call("hello from the script")
    ranks = await asyncio.gather(
        *(greeters.slice(gpus=i).greet.call_one(f"just you, {i}") for i in range(WORKERS))
    )
    print("ranks", ranks, flush=True)

    left = this_host().spawn_procs(per_host={"gpus": 2}).spawn("left", Player, "left")
    right = this_host().spawn_procs(per_host={"gpus": 2}).spawn("right", Player, "right")
    await asyncio.gather(left.meet.call(right), right.meet.call(left))
    await left.serve.call("ping")
    await right.serve.call("pong")
    print("left inbox", (await left.received.call()).values(), flush=True)
    print("right inbox", (await right.received.call()).values(), flush=True)
    print("ping pong done", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
