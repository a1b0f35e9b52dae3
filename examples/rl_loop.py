"""zmesh RL-style loop: generators roll out, a learner trains and ships weights.

A mesh of generator actors plays a 4-armed bandit (standing in for a
simulator or an inference engine) with the current policy; the client gathers
their trajectories with ``stream`` as they finish; a singleton learner takes
the batch, takes a policy-gradient step and broadcasts the new weights, as
``bytes``, straight to the generators through the mesh handle it was given.

Run: python examples/rl_loop.py
"""

from __future__ import annotations

import asyncio
import math
import random
import struct
import time
from typing import Any

import zmesh

ARMS = 4
PAYOFF = (0.2, 0.4, 0.6, 0.8)  # chance that each arm pays 1
GENERATORS = 4
STEPS = 64  # steps per trajectory
ITERATIONS = 12


def pack(logits: list[float]) -> bytes:
    return struct.pack(f"<{ARMS}d", *logits)


def unpack(weights: bytes) -> list[float]:
    return list(struct.unpack(f"<{ARMS}d", weights))


def softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


class Generator(zmesh.Actor):
    """Plays the bandit with the latest weights it was sent."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed + zmesh.current_rank().rank)
        self.logits = [0.0] * ARMS
        self.version = 0

    @zmesh.endpoint
    def set_weights(self, weights: bytes, version: int) -> None:
        if version > self.version:
            self.logits, self.version = unpack(weights), version

    @zmesh.endpoint
    def rollout(self, steps: int) -> dict[str, Any]:
        probs = softmax(self.logits)
        actions = self.rng.choices(range(ARMS), weights=probs, k=steps)
        rewards = [float(self.rng.random() < PAYOFF[a]) for a in actions]
        return {"version": self.version, "actions": actions, "rewards": rewards}


class Learner(zmesh.Actor):
    """Owns the policy: REINFORCE with a mean baseline, then ships the weights."""

    def __init__(self, generators: zmesh.ActorMesh[Generator], lr: float) -> None:
        self.generators = generators  # a handle is a value: call it from here
        self.lr = lr
        self.logits = [0.0] * ARMS
        self.version = 0

    @zmesh.endpoint
    async def train(self, batch: list[dict[str, Any]]) -> dict[str, Any]:
        actions = [a for t in batch for a in t["actions"]]
        rewards = [r for t in batch for r in t["rewards"]]
        baseline = sum(rewards) / len(rewards)
        probs = softmax(self.logits)
        grad = [0.0] * ARMS
        for a, r in zip(actions, rewards, strict=True):
            for k in range(ARMS):
                grad[k] += (r - baseline) * ((k == a) - probs[k])
        self.logits = [
            x + self.lr * g / len(actions) for x, g in zip(self.logits, grad, strict=True)
        ]
        self.version += 1
        # Fire and forget: every generator gets the new weights, no reply.
        self.generators.set_weights.broadcast(pack(self.logits), self.version)
        return {"version": self.version, "reward": baseline, "probs": softmax(self.logits)}


async def main() -> None:
    t0 = time.monotonic()
    generators = await Generator.options(procs=GENERATORS, name="generator").as_actor(seed=7)
    learner = await Learner.options(name="learner").as_actor(generators, lr=4.0)
    print(f"{generators} and {learner} up in {time.monotonic() - t0:.1f}s")

    for it in range(1, ITERATIONS + 1):
        batch = []
        async for trajectory in generators.rollout.stream(STEPS):  # as each finishes
            batch.append(trajectory)
        stats = await learner.train.call_one(batch)
        # The learner's broadcast and our next rollout come from different
        # senders, so they are not ordered: a batch may mix policy versions
        # (off-policy lag), which the versions printed show.
        versions = sorted({t["version"] for t in batch})
        probs = " ".join(f"{p:.2f}" for p in stats["probs"])
        print(
            f"iter {it:2d}: reward {stats['reward']:.2f}  "
            f"rolled out with policy v{versions}  new policy v{stats['version']} [{probs}]"
        )

    await learner.stop()
    await generators.stop()
    print(f"done in {time.monotonic() - t0:.1f}s")


if __name__ == "__main__":
    asyncio.run(main())
