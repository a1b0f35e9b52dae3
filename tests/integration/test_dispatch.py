"""The one dispatch of the adverbs: each kind of call leaves by the exit its table says.

``EndpointRef._send`` (zmesh._client.handles.adverbs) picks one transport
(zmesh._client.calls.transport) per call. These call real procs and record,
by wrapping the transports' methods (which still do the work), which one
each call reached: a new path that skips the table fails here.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import zmesh
import zmesh.testing
from zmesh import Port
from zmesh._client.calls import tree as _tree
from zmesh._client.calls.lanes import Lane
from zmesh._client.calls.runtime import Runtime
from zmesh._client.calls.synccall import SyncCall
from zmesh._client.calls.tree import Tree
from zmesh._client.handles import adverbs
from zmesh._client.handles.localranks import LocalRanks

from _helpers import (
    keep_module_meshes,  # noqa: F401  (a fixture: the meshes outlive tests)
    stop_meshes,
)


class Echo(zmesh.Actor):
    @zmesh.endpoint
    async def echo(self, x: int = 0) -> int:
        return x

    @zmesh.endpoint
    async def items(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    @zmesh.endpoint(explicit_response_port=True)
    async def answer(self, port: Port[int], x: int) -> None:
        port.send(x)


# (class, method name) of every transport verb, and the other exits.
SPIED = [
    (Runtime, "submit"), (Runtime, "fan_out"), (Runtime, "call"), (Lane, "submit"),
    (Lane, "call"), (Tree, "fan_out"), (LocalRanks, "submit"), (LocalRanks, "fan_out"),
]  # fmt: skip


@pytest.fixture(scope="module")
def meshes() -> Iterator[tuple[zmesh.ActorMesh[Echo], zmesh.ActorMesh[Echo]]]:
    one = Echo.options().as_actor().get(timeout=60)
    group = Echo.options(procs=1, actors_per_proc=2).as_actor().get(timeout=60)
    yield one, group
    stop_meshes()


@pytest.fixture
def reached(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The transport verbs (and other exits) calls reach, in order, from any thread."""
    seen: list[str] = []
    for cls, name in SPIED:
        real = getattr(cls, name)

        def spy(*a: Any, _real: Any = real, _name: str = f"{cls.__name__}.{name}") -> Any:
            seen.append(_name)
            return _real(*a)

        monkeypatch.setattr(cls, name, spy)
    for name in ("explicit_call", "open_stream"):
        real = getattr(adverbs, name)

        def exit_spy(*a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            seen.append(_name)
            return _real(*a, **kw)

        monkeypatch.setattr(adverbs, name, exit_spy)
    return seen


def _until_lane(m: zmesh.ActorMesh[Echo]) -> None:
    """Call until a sync call takes the lane (a new mesh's first calls take the I/O path)."""
    deadline = time.monotonic() + 10
    while not isinstance(m.echo.call_one(1), SyncCall):
        assert time.monotonic() < deadline, "calls never took the lane"
        time.sleep(0.01)


@pytest.mark.anyio
async def test_on_a_loop_one_actor_is_the_runtimes_submit_and_many_its_fan_out(
    meshes: tuple[zmesh.ActorMesh[Echo], zmesh.ActorMesh[Echo]], reached: list[str]
) -> None:
    one, group = meshes
    assert await one.echo.call_one(1) == 1
    assert reached == ["Runtime.submit", "Runtime.call"]
    reached.clear()
    assert await group.slice(actors=1).echo.call_one(2) == 2  # one actor of a group
    assert reached == ["Runtime.submit", "Runtime.call"]
    reached.clear()
    assert (await group.echo.call(3)).values() == [3, 3]
    assert reached == ["Runtime.fan_out"]
    reached.clear()
    group.echo.broadcast(4)
    assert reached == ["Runtime.fan_out"]
    reached.clear()
    assert await group.echo.choose(5) == 5  # picked on the loop, then sent
    assert reached == ["Runtime.call"]


def test_from_a_thread_one_actor_is_the_lane_and_many_the_runtimes_fan_out(
    meshes: tuple[zmesh.ActorMesh[Echo], zmesh.ActorMesh[Echo]], reached: list[str]
) -> None:
    one, _ = meshes
    _until_lane(one)
    reached.clear()
    fut = one.echo.call_one(1)  # the common call: the lane in one step
    assert isinstance(fut, SyncCall) and fut.get(timeout=10) == 1
    assert reached == ["Lane.call"]
    reached.clear()
    assert one.echo.call_one(x=2).get(timeout=10) == 2  # a keyword: the lane's submit
    assert reached == ["Lane.submit", "Lane.call"]
    reached.clear()
    assert one.echo.call(3).get(timeout=10).values() == [3]
    assert reached == ["Runtime.fan_out"]
    reached.clear()
    one.echo.broadcast(4)
    one.echo.call_one(x=0).get(timeout=10)  # (the broadcast has gone out before it)
    assert "Runtime.fan_out" in reached


def test_a_wide_mesh_fans_out_on_the_tree(
    meshes: tuple[zmesh.ActorMesh[Echo], zmesh.ActorMesh[Echo]],
    reached: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, group = meshes
    monkeypatch.setattr(_tree, "MODE", "tree")  # every mesh is wide
    assert group.echo.call(1).get(timeout=10).values() == [1, 1]
    assert reached == ["Tree.fan_out"]
    reached.clear()
    group.echo.broadcast(2)
    group.echo.call(0).get(timeout=10)
    assert reached == ["Tree.fan_out", "Tree.fan_out"]


def test_streams_and_response_ports_leave_by_their_own_exits(
    meshes: tuple[zmesh.ActorMesh[Echo], zmesh.ActorMesh[Echo]], reached: list[str]
) -> None:
    one, group = meshes
    assert list(one.items.call_one(3)) == [0, 1, 2]
    assert reached == ["open_stream"]
    reached.clear()
    assert one.answer.call_one(7).get(timeout=10) == 7
    assert group.answer.call(8).get(timeout=10).values() == [8, 8]
    assert reached == ["explicit_call", "explicit_call"]
    reached.clear()
    with pytest.raises(TypeError, match="response port"):
        group.answer.choose(1)
    assert reached == []


def test_the_in_process_mesh_is_a_transport_of_its_own(reached: list[str]) -> None:
    with zmesh.testing.local_mesh(Echo, procs=2) as mesh:
        assert mesh.slice(procs=0).echo.call_one(1).get(timeout=10) == 1
        assert reached == ["LocalRanks.submit"]
        reached.clear()
        mesh.echo.broadcast(2)
        assert reached == ["LocalRanks.fan_out", "LocalRanks.submit", "LocalRanks.submit"]
