"""Handles are values: an ActorMesh passed to another actor can be called from there."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh

from _keptagents import stop_meshes
from integration._fabric import Notebook


class Target(Notebook):
    def __init__(self) -> None:
        self.notes: list[str] = []

    @zmesh.endpoint
    async def echo(self, x: Any) -> Any:
        return x

    @zmesh.endpoint
    def where(self) -> tuple[int, int]:
        return zmesh.current_rank().rank, os.getpid()

    @zmesh.endpoint
    def explode(self) -> None:
        raise KeyError("inner")


class Relay(zmesh.Actor):
    def __init__(self, target: zmesh.ActorMesh[Target] | None = None) -> None:
        self.target = target  # a handle can also arrive through __init__

    @zmesh.endpoint
    async def relay(self, target: zmesh.ActorMesh[Target], x: Any) -> Any:
        return await target.echo.call_one(x)

    @zmesh.endpoint
    def relay_sync(self, target: zmesh.ActorMesh[Target], x: Any) -> Any:
        return target.echo.call_one(x).get(timeout=10)

    @zmesh.endpoint
    async def fan_out(self, target: zmesh.ActorMesh[Target]) -> list[tuple[int, int]]:
        return (await target.where.call()).values()

    @zmesh.endpoint
    def fan_out_sync(self, target: zmesh.ActorMesh[Target]) -> list[tuple[int, int]]:
        return target.where.call().get(timeout=10).values()

    @zmesh.endpoint
    async def stream(self, target: zmesh.ActorMesh[Target]) -> list[tuple[int, int]]:
        return sorted([v async for v in target.where.stream()])

    @zmesh.endpoint
    def stream_sync(self, target: zmesh.ActorMesh[Target]) -> list[tuple[int, int]]:
        return sorted(target.where.stream())

    @zmesh.endpoint
    async def tell_then_ask(self, target: zmesh.ActorMesh[Target], token: str) -> list[list[str]]:
        target.note.broadcast(token)
        return (await target.seen.call()).values()

    @zmesh.endpoint
    async def choose(self, target: zmesh.ActorMesh[Target]) -> tuple[int, int]:
        return await target.where.choose()

    @zmesh.endpoint
    async def via_init(self, x: Any) -> Any:
        assert self.target is not None
        return await self.target.slice(procs=0).echo.call_one(x)

    @zmesh.endpoint
    async def give_back(self, target: zmesh.ActorMesh[Target]) -> zmesh.ActorMesh[Target]:
        return target

    @zmesh.endpoint
    async def inner_error(self, target: zmesh.ActorMesh[Target]) -> str:
        try:
            await target.slice(procs=0).explode.call_one()
        except zmesh.ActorError as err:
            return f"{err.remote_type}|{err.rank}"
        return "no error"


@pytest.fixture(autouse=True)
def _stop_everything() -> Iterator[None]:
    yield  # the module meshes outlive single tests; the fixture below stops them


@pytest.fixture(scope="module")
def meshes() -> Iterator[tuple[zmesh.ActorMesh[Relay], zmesh.ActorMesh[Target]]]:
    target = Target.options(procs=2).as_actor().get(timeout=60)
    relay = Relay.options().as_actor(target).get(timeout=60)
    yield relay, target
    stop_meshes()


Meshes = tuple[zmesh.ActorMesh[Relay], zmesh.ActorMesh[Target]]


@pytest.mark.anyio
async def test_async_endpoint_awaits_a_passed_handle(meshes: Meshes) -> None:
    relay, target = meshes
    one = target.slice(procs=1)
    assert await relay.relay.call_one(one, {"k": [1, 2]}) == {"k": [1, 2]}
    assert await relay.relay.call_one(one, b"z" * 200_000) == b"z" * 200_000


def test_sync_endpoint_gets_from_a_passed_handle(meshes: Meshes) -> None:
    relay, target = meshes
    assert relay.relay_sync.call_one(target.slice(procs=0), "hi").get(timeout=20) == "hi"


def test_fan_out_through_a_handle(meshes: Meshes) -> None:
    relay, target = meshes
    direct = target.where.call().get(timeout=10).values()
    assert [r for r, _ in direct] == [0, 1]
    assert relay.fan_out.call_one(target).get(timeout=20) == direct
    assert relay.fan_out_sync.call_one(target).get(timeout=20) == direct
    assert relay.stream.call_one(target).get(timeout=20) == direct
    assert relay.stream_sync.call_one(target).get(timeout=20) == direct
    assert relay.choose.call_one(target).get(timeout=20) in direct


def test_a_sliced_handle_keeps_its_slice(meshes: Meshes) -> None:
    relay, target = meshes
    direct = target.where.call().get(timeout=10).values()
    assert relay.fan_out.call_one(target.slice(procs=1)).get(timeout=20) == [direct[1]]


def test_order_holds_for_an_actor_sender(meshes: Meshes) -> None:
    relay, target = meshes
    token = "from-relay"
    seen = relay.tell_then_ask.call_one(target, token).get(timeout=20)
    assert all(token in s for s in seen)


def test_handle_passed_to_init(meshes: Meshes) -> None:
    relay, _ = meshes
    assert relay.via_init.call_one(3.5).get(timeout=20) == 3.5


def test_handle_returned_from_an_endpoint(meshes: Meshes) -> None:
    relay, target = meshes
    back = relay.give_back.call_one(target.slice(procs=1)).get(timeout=20)
    assert isinstance(back, zmesh.ActorMesh)
    assert len(back) == 1
    assert back.echo.call_one("round trip").get(timeout=10) == "round trip"


def test_errors_through_a_handle(meshes: Meshes) -> None:
    relay, target = meshes
    assert relay.inner_error.call_one(target).get(timeout=20) == "KeyError|0"
