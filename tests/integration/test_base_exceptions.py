"""Endpoints that raise a ``BaseException`` that is not an ``Exception``, in an
actor that keeps zmesh's older rule (``survive_errors = True``; by default,
as in Monarch, such an exception kills the actor: tests/integration/test_actor_death.py).

``KeyboardInterrupt``, ``GeneratorExit``, a user's own ``BaseException``
subclass, a ``CancelledError`` that is no cancellation of the actor: each
fails its call with ``ActorError`` and the actor keeps serving. ``SystemExit``
fails its call too, then the proc exits as ``sys.exit`` says, which its owner
sees as a failure of the rank. No call ever hangs.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncGenerator, Iterator

import pytest

import zmesh

from _helpers import pid_alive, wait_for
from _keptagents import stop_meshes


class Fatal(BaseException):
    """A user's own BaseException subclass."""


RAISED: dict[str, BaseException] = {
    "custom": Fatal("the end of the world"),
    "keyboard": KeyboardInterrupt("pressed"),
    "generator-exit": GeneratorExit("raised by hand"),
    "cancelled": asyncio.CancelledError("a task of the user's was cancelled"),
}


class Raiser(zmesh.Actor):
    survive_errors = True

    def __init__(self) -> None:
        self.calls = 0

    @zmesh.endpoint
    def raise_sync(self, kind: str) -> None:
        self.calls += 1
        raise RAISED[kind]

    @zmesh.endpoint
    async def raise_async(self, kind: str) -> None:
        self.calls += 1
        await asyncio.sleep(0)  # raised after a suspension, from the mailbox task
        raise RAISED[kind]

    @zmesh.endpoint
    async def raise_at_once(self, kind: str) -> None:
        self.calls += 1
        raise RAISED[kind]  # raised before any suspension (the eager path)

    @zmesh.endpoint
    async def raise_awaited(self, kind: str) -> None:
        self.calls += 1

        def fail() -> None:
            raise RAISED[kind]

        # A future that fails with it: the task throws it into the endpoint.
        await asyncio.get_running_loop().run_in_executor(None, fail)

    @zmesh.endpoint
    def exit_sync(self, code: int) -> None:
        sys.exit(code)

    @zmesh.endpoint
    async def exit_async(self, code: int) -> None:
        raise SystemExit(code)

    @zmesh.endpoint
    async def count(self) -> int:
        self.calls += 1
        return self.calls

    @zmesh.endpoint
    def pid(self) -> int:
        import os

        return os.getpid()


@pytest.fixture(scope="module")
def raiser() -> Iterator[zmesh.ActorMesh[Raiser]]:
    mesh = Raiser.options().as_actor().get(timeout=60)
    yield mesh
    stop_meshes()


@pytest.fixture(autouse=True)
def _stop_everything() -> Iterator[None]:
    yield  # the module's mesh outlives single tests


def _type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


@pytest.mark.parametrize("endpoint", ["raise_sync", "raise_async", "raise_at_once"])
@pytest.mark.parametrize("kind", list(RAISED))
def test_a_base_exception_fails_the_call_and_the_actor_serves_on(
    raiser: zmesh.ActorMesh[Raiser], endpoint: str, kind: str
) -> None:
    before = raiser.count.call_one().get(timeout=10)
    with pytest.raises(zmesh.ActorError) as info:
        getattr(raiser, endpoint).call_one(kind).get(timeout=10)
    assert info.value.remote_type == _type_name(RAISED[kind])
    assert str(RAISED[kind]) in info.value.remote_message
    # The same actor answers the next calls, in order, at once.
    assert raiser.count.call_one().get(timeout=10) == before + 2
    assert raiser.count.call_one().get(timeout=10) == before + 3


@pytest.mark.parametrize("kind", list(RAISED))
def test_an_awaited_future_failing_with_a_base_exception(
    raiser: zmesh.ActorMesh[Raiser], kind: str
) -> None:
    before = raiser.count.call_one().get(timeout=10)
    # Queued behind a slow call, and alone: both of the actor's paths.
    slow = raiser.raise_awaited.call_one(kind)
    queued = raiser.raise_awaited.call_one(kind)
    for fut in (slow, queued):
        with pytest.raises(zmesh.ActorError) as info:
            fut.get(timeout=10)
        assert info.value.remote_type == _type_name(RAISED[kind])
    assert raiser.count.call_one().get(timeout=10) == before + 3


def test_a_base_exception_from_a_broadcast_leaves_the_actor_serving(
    raiser: zmesh.ActorMesh[Raiser],
) -> None:
    before = raiser.count.call_one().get(timeout=10)
    for kind in RAISED:
        raiser.raise_at_once.broadcast(kind)
        raiser.raise_async.broadcast(kind)
    assert raiser.count.call_one().get(timeout=10) == before + 2 * len(RAISED) + 1


@pytest.mark.parametrize("endpoint", ["exit_sync", "exit_async"])
def test_system_exit_fails_the_call_then_the_proc_exits_visibly(endpoint: str) -> None:
    mesh = Raiser.options().as_actor().get(timeout=60)
    try:
        pid = mesh.pid.call_one().get(timeout=10)
        with pytest.raises(zmesh.ActorError, match="SystemExit") as info:
            getattr(mesh, endpoint).call_one(3).get(timeout=10)
        assert info.value.remote_type == "SystemExit"
        wait_for(lambda: not pid_alive(pid), 10, "the proc to exit")
        # Later calls fail at once with the reason; none of them hangs.
        t0 = time.monotonic()
        with pytest.raises(zmesh.SupervisionError, match="exited with code 3"):
            mesh.count.call_one().get(timeout=10)
        assert time.monotonic() - t0 < 5
        state = mesh.state()
        assert state.status == zmesh.Status.FAILED
        assert state.ranks[0].exit_code == 3
    finally:
        mesh.stop().get(timeout=10)


@pytest.mark.anyio
async def test_system_exit_is_a_supervision_event() -> None:
    mesh = await Raiser.options().as_actor()
    try:
        events = mesh.supervision_events()
        with pytest.raises(zmesh.ActorError, match="SystemExit"):
            await mesh.exit_async.call_one(0)  # even sys.exit(0): nobody asked it to stop
        ev = await asyncio.wait_for(events.__anext__(), 10)
        assert ev.status == zmesh.Status.FAILED and ev.exit_code == 0
        assert "exited with code 0" in ev.reason
        assert isinstance(events, AsyncGenerator)  # so that it can be closed early
        await events.aclose()
    finally:
        await mesh.stop()


class ExitInInit(zmesh.Actor):
    def __init__(self, how: str) -> None:
        if how == "exit":
            sys.exit(4)
        raise Fatal("no")


@pytest.mark.parametrize("how", ["exit", "custom"])
def test_a_base_exception_in_init_is_a_spawn_error_at_once(how: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(zmesh.SpawnError, match=r"SystemExit|Fatal"):
        ExitInInit.options().as_actor(how).get(timeout=30)
    assert time.monotonic() - t0 < 20
