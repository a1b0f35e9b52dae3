"""What a type checker sees of actor meshes. mypy checks it (tests/test_quality.py).

Each ``assert_type`` is a claim about inference; each ``# type: ignore[code]``
marks a call that must be an error: ``warn_unused_ignores`` fails the check
if it is not. Nothing here runs.
"""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import zmesh
from zmesh import Future, ItemStream, MeshState, Point, ValueMesh

if TYPE_CHECKING:
    from typing_extensions import assert_type


class Counter(zmesh.Actor):
    def __init__(self, start: int = 0) -> None:
        self.n = start

    @zmesh.endpoint
    def incr(self, by: int) -> int:
        self.n += by
        return self.n

    @zmesh.endpoint
    async def aincr(self, by: int = 1) -> int:
        return self.n + by

    @zmesh.endpoint(concurrent=True, retry=False)
    async def peek(self) -> str:
        return str(self.n)

    @zmesh.concurrent_endpoint
    def scaled(self, x: float, *, scale: float = 1.0) -> float:
        return x * scale

    @zmesh.concurrent_endpoint(retry=False)
    def raw(self) -> bytes:
        return b""

    @zmesh.endpoint
    def untyped(self, x):
        return x


class Talker(zmesh.Actor):
    @zmesh.endpoint
    def tokens(self, n: int) -> Iterator[str]:
        yield from ("a", "b")[:n]

    @zmesh.endpoint(window=8)
    async def chunks(self, n: int) -> AsyncIterator[bytes]:
        yield b"x" * n

    @zmesh.endpoint(batch=4, batch_wait=0.01)
    async def embed(self, xs: list[int]) -> list[float]:
        return [float(x) for x in xs]

    @zmesh.endpoint(explicit_response_port=True)
    def later(self, port: zmesh.Port[int], x: int) -> None:
        port.send(x)


async def adverbs(mesh: zmesh.ActorMesh[Counter]) -> None:
    assert_type(mesh, Counter)  # ActorMesh[Counter] is Counter to a checker
    assert_type(mesh.incr.call_one(1), Future[int])
    assert_type(await mesh.incr.call_one(1), int)
    assert_type(mesh.incr.call_one(1).get(timeout=5), int)
    assert_type(mesh.incr.choose(1), Future[int])
    assert_type(mesh.incr.call(1), Future[ValueMesh[int]])
    assert_type(mesh.incr.broadcast(1), None)
    assert_type(mesh.incr.options(timeout=1.0).call_one(by=2), Future[int])
    assert_type(mesh.aincr.call_one(), Future[int])  # async def: its result, not a coroutine
    assert_type(mesh.peek.call_one(), Future[str])
    assert_type(mesh.scaled.call_one(2.0, scale=0.5), Future[float])
    assert_type(mesh.raw.call_one(), Future[bytes])
    values = await mesh.incr.call(1)
    for point, value in values:
        assert_type(point, Point)
        assert_type(value, int)
    assert_type(values.values(), list[int])
    assert_type(values.reduce(max), int)
    assert_type(values.reduce(lambda acc, v: [*acc, v], list[int]()), list[int])
    values.reduce(lambda acc, v: acc + v, "")  # type: ignore[operator]
    async for reply in mesh.incr.stream(1):
        assert_type(reply, int)
    for reply in mesh.incr.stream(1):
        assert_type(reply, int)
    total = zmesh.Accumulator(mesh.incr, 0, operator.add).accumulate(1)
    assert_type(total, Future[int])
    zmesh.send(mesh.incr, (1,))


def wrong_calls(mesh: Counter) -> None:
    mesh.incr.call_one("x")  # type: ignore[arg-type]
    mesh.incr.call("x")  # type: ignore[arg-type]
    mesh.incr.choose("x")  # type: ignore[arg-type]
    mesh.incr.broadcast("x")  # type: ignore[arg-type]
    mesh.incr.stream("x")  # type: ignore[arg-type]
    mesh.incr.call_one()  # type: ignore[call-arg]
    mesh.incr.call_one(1, 2)  # type: ignore[call-arg]
    mesh.incr.call_one(step=1)  # type: ignore[call-arg]
    mesh.scaled.call_one(1.0, scale="big")  # type: ignore[arg-type]
    mesh.incr.options(timeout="soon")  # type: ignore[arg-type]
    mesh.no_such_endpoint  # type: ignore[attr-defined]  # noqa: B018
    zmesh.Accumulator(mesh.incr, 0, operator.add).accumulate("x")  # type: ignore[arg-type]
    n: str = mesh.incr.call_one(1).get()  # type: ignore[assignment]
    del n


def untyped_endpoints_are_any(mesh: Counter) -> None:
    # A method without annotations is a plain endpoint of anything.
    mesh.untyped.call_one("anything").get().whatever  # noqa: B018


async def streams(talker: Talker) -> None:
    assert_type(talker.tokens.call_one(2), ItemStream[str])
    async for token in talker.tokens.call_one(2):
        assert_type(token, str)
    for token in talker.tokens.call_one(2):
        assert_type(token, str)
    assert_type(talker.tokens.choose(2), ItemStream[str])
    for point, token in talker.tokens.call(2):
        assert_type(point, Point)
        assert_type(token, str)
    assert_type(talker.chunks.options(window=2).call_one(3), ItemStream[bytes])
    talker.tokens.call_one("two")  # type: ignore[arg-type]
    await talker.tokens.call_one(2)  # type: ignore[misc]  # a stream, not a future


async def batched_and_ported(talker: Talker) -> None:
    # A batch endpoint takes a list and returns one; callers send one item each.
    assert_type(talker.embed.call_one(3), Future[float])
    assert_type(await talker.embed(3), float)
    talker.embed.call_one([3])  # type: ignore[arg-type]
    # An explicit response port endpoint answers what its port is typed with.
    assert_type(talker.later.call_one(1), Future[int])
    assert_type(talker.later.call(1), Future[ValueMesh[int]])
    talker.later.call_one("x")  # type: ignore[arg-type]


async def spawning(procs: zmesh.ProcMesh) -> None:
    assert_type(Counter.options(procs=2).as_actor(5), Counter)
    assert_type(await Counter.options().as_actor(), Counter)
    assert_type(Counter.options().as_actor().get(timeout=30), Counter)
    assert_type(await Counter.options().spawn(), Counter)
    assert_type(Counter.options().spawn().get(timeout=30), Counter)
    Counter.options().as_service().incr  # type: ignore[attr-defined]  # noqa: B018  (await it)
    assert_type(procs.spawn("counter", Counter, 0), Counter)
    assert_type(zmesh.this_proc().spawn("counter", Counter), Counter)
    assert_type(zmesh.get_or_spawn_controller("c", Counter), zmesh.Future[Counter])
    talker = zmesh.this_host().spawn_procs(per_host={"procs": 2}).spawn("talker", Talker)
    assert_type(talker.tokens.call_one(1), ItemStream[str])


async def handles(mesh: Counter) -> None:
    one = mesh.slice(procs=0)
    assert_type(one, Counter)
    assert_type(one.incr(1), Future[int])  # a direct call on one actor
    assert_type(await one.incr(1), int)
    assert_type(mesh.flatten("all"), Counter)
    assert_type(await mesh, Counter)
    assert_type(mesh.initialized, Future[None])
    assert_type(mesh.stop(), Future[None])
    assert_type(mesh.state(), MeshState)
    assert_type(mesh.size(), int)
    assert_type(mesh.sizes, dict[str, int])
    assert_type(len(mesh), int)
    assert_type(mesh.points(), list[Point])
    async for event in mesh.supervision_events():
        assert_type(event, zmesh.SupervisionEvent)
    mesh.slice(procs="0")  # type: ignore[arg-type]
