"""An actor that dies in a proc of several actors (``actors_per_proc``) reaches
supervision as a proc's only actor does.

Each way an actor dies while its proc lives (a ``BaseException`` from a sync
or async endpoint, a ``broadcast`` that raises, an explicit response port's
endpoint that raises, ``abort``) gives the spawner one ``MeshFailure`` that
names the dead actor's rank in its actor mesh, its host and its proc's log:
here, ``zmesh.unhandled_fault_hook`` (or a ``supervision_events()`` iterator).
Its calls fail with ``SupervisionError``; its neighbours in the proc serve.
A proc's death (``kill -9``, ``SystemExit``) is one failure of the proc,
whatever it hosted. Real procs, real ``kill -9``; each case is run against a
mesh of one actor per proc too, the reference.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

import zmesh
from zmesh import Port
from zmesh._client.calls import runtime as _runtime

from _helpers import pid_alive, wait_for, wait_until

PROCS = 2


class Worker(zmesh.Actor):
    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    def rank(self) -> int:
        return zmesh.current_rank().rank

    @zmesh.endpoint
    async def arank(self) -> int:
        return zmesh.current_rank().rank

    @zmesh.endpoint
    def interrupt(self) -> None:
        raise KeyboardInterrupt("pressed")

    @zmesh.endpoint
    async def ainterrupt(self) -> None:
        raise KeyboardInterrupt("pressed")

    @zmesh.endpoint
    def boom(self) -> None:
        raise ValueError("bad input")

    @zmesh.endpoint(explicit_response_port=True)
    async def refuse(self, port: Port[int]) -> None:
        raise RuntimeError("no answer")

    @zmesh.endpoint
    def abort(self) -> None:
        zmesh.context().actor_instance.abort("lost the lease")

    @zmesh.endpoint
    def exit(self) -> None:
        raise SystemExit(3)


# How each way kills actor ``one`` (a one-actor slice of the mesh), and what
# the failure then says.
def _interrupt(one: Any) -> None:
    with pytest.raises(zmesh.SupervisionError, match="KeyboardInterrupt: pressed"):
        one.interrupt.call_one().get(timeout=30)


def _ainterrupt(one: Any) -> None:
    with pytest.raises(zmesh.SupervisionError, match="KeyboardInterrupt: pressed"):
        one.ainterrupt.call_one().get(timeout=30)


def _broadcast(one: Any) -> None:
    one.boom.broadcast()


def _port(one: Any) -> None:
    with pytest.raises(zmesh.SupervisionError, match="RuntimeError: no answer"):
        one.refuse.call_one().get(timeout=30)


def _abort(one: Any) -> None:
    with pytest.raises(zmesh.SupervisionError, match="lost the lease"):
        one.abort.call_one().get(timeout=30)


WAYS = {
    "interrupt": (_interrupt, "KeyboardInterrupt: pressed"),
    "ainterrupt": (_ainterrupt, "KeyboardInterrupt: pressed"),
    "broadcast": (_broadcast, "ValueError: bad input"),
    "explicit_port": (_port, "RuntimeError: no answer"),
    "abort": (_abort, "ActorAborted: lost the lease"),
}


def _one(mesh: Any, rank: int) -> Any:
    """The slice of ``mesh`` that is its actor ``rank`` alone."""
    return mesh.flatten("a").slice(a=rank)


def _spawn(per: int) -> Any:
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": PROCS})
    return procs.spawn("doomed", Worker, actors_per_proc=per)


@pytest.mark.parametrize("per", [1, 4])
@pytest.mark.parametrize("way", sorted(WAYS))
def test_an_actor_that_dies_alone_is_one_failure_naming_its_rank(
    faults: list[zmesh.MeshFailure], way: str, per: int
) -> None:
    mesh = _spawn(per)
    pids = mesh.pid.call().get(timeout=60).values()
    victim = per + per // 2  # on the second proc; not its first actor when grouped
    kill, why = WAYS[way]
    kill(_one(mesh, victim))
    wait_for(lambda: faults, 20, f"the hook, for an actor killed by {way} (actors_per_proc={per})")
    # Its calls fail, typed and at once, naming its rank.
    with pytest.raises(zmesh.SupervisionError) as info:
        _one(mesh, victim).pid.call_one().get(timeout=30)
    assert info.value.rank == victim and why in str(info.value)
    for endpoint in ("rank", "arank"):  # a fan-out too: no part runs on the dead actor
        with pytest.raises(zmesh.SupervisionError) as info:
            getattr(mesh, endpoint).call().get(timeout=30)
        assert info.value.rank == victim and why in str(info.value)
    # Every other actor serves, on the same live procs.
    others = [r for r in range(PROCS * per) if r != victim]
    assert [_one(mesh, r).rank.call_one().get(timeout=30) for r in others] == others
    assert all(pid_alive(p) for p in pids)
    (failure,) = faults  # once, however many calls met the dead actor since
    assert failure.mesh_name == "doomed"
    assert failure.rank == victim and failure.crashed_ranks == [victim]
    assert failure.host and failure.status is zmesh.Status.FAILED
    assert failure.log_path.endswith(f".{victim // per}.g1.log"), failure.log_path
    assert why in failure.report()
    where = "'gpus': 1/2" + (f", 'actors': {victim % per}/{per}" if per > 1 else "")
    assert f"test_group_supervision.Worker doomed{{'hosts': 0/1, {where}}}" in failure.report()
    # The mesh's state is its procs': both still run.
    assert {r.status for r in mesh.state().ranks.values()} == {zmesh.Status.RUNNING}


@pytest.mark.parametrize("per", [1, 4])
def test_a_stopped_group_is_no_failure(faults: list[zmesh.MeshFailure], per: int) -> None:
    mesh = _spawn(per)
    neighbour = zmesh.this_host().spawn_procs(per_host={"gpus": 1}).spawn("n", Worker)
    mesh.pid.call().get(timeout=60)
    mesh.stop().get(timeout=30)
    with pytest.raises(zmesh.ActorStoppedError):
        _one(mesh, 0).pid.call_one().get(timeout=30)
    # (a round trip after the stop: a watch answered with a failure would be in by now)
    neighbour.pid.call_one().get(timeout=30)
    assert faults == []


@pytest.mark.parametrize("per", [1, 4])
@pytest.mark.parametrize("how", ["kill -9", "SystemExit"])
def test_a_procs_death_is_one_failure_of_the_proc(
    faults: list[zmesh.MeshFailure], per: int, how: str
) -> None:
    mesh = _spawn(per)
    pids = mesh.pid.call().get(timeout=60).values()
    victim_pid = pids[per]  # the second proc
    if how == "kill -9":
        os.kill(victim_pid, signal.SIGKILL)
    else:
        # (its caller hears of the SystemExit; the proc then exits)
        with pytest.raises((zmesh.ActorError, zmesh.SupervisionError), match="SystemExit"):
            _one(mesh, per).exit.call_one().get(timeout=30)
    wait_for(lambda: faults, 20, f"the hook, for a proc's death ({how})")
    # Every actor of the dead proc fails with its own rank; the others serve.
    for r in range(per, 2 * per):
        with pytest.raises(zmesh.SupervisionError) as info:
            _one(mesh, r).pid.call_one().get(timeout=30)
        assert info.value.rank == r
    assert [_one(mesh, r).rank.call_one().get(timeout=30) for r in range(per)] == list(range(per))
    (failure,) = faults  # one failure: the proc's, not one per actor it hosted
    assert failure.mesh_name == mesh.proc_mesh and failure.rank == 1
    assert failure.log_path.endswith(".1.g1.log")
    assert mesh.state().ranks[1].status is zmesh.Status.FAILED


@pytest.mark.anyio
async def test_supervision_events_of_a_group_yield_its_dead_actor() -> None:
    mesh = Worker.options(procs=PROCS, actors_per_proc=4).as_actor()
    await mesh
    victim = 6

    async def first() -> zmesh.SupervisionEvent:
        async for event in mesh.supervision_events():
            return event
        raise AssertionError("the event stream ended")

    try:
        watcher = asyncio.ensure_future(first())
        with pytest.raises(zmesh.SupervisionError):
            await _one(mesh, victim).ainterrupt.call_one()
        event = await asyncio.wait_for(watcher, 20)
        assert event.rank == victim and "KeyboardInterrupt: pressed" in event.reason
        # A slice without that actor hears nothing of it; one with it does.
        assert await _one(mesh, victim - 1).rank.call_one() == victim - 1
    finally:
        await mesh.stop()


@pytest.mark.anyio
async def test_a_sibling_meshs_iterator_takes_no_death_of_another(
    faults: list[zmesh.MeshFailure],
) -> None:
    """Two actor meshes on the same procs: iterating one's ``supervision_events()``
    neither yields the other's dead actor nor keeps it from the hook."""
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": PROCS})
    doomed = procs.spawn("doomed", Worker, actors_per_proc=4)
    sibling = procs.spawn("sibling", Worker, actors_per_proc=4)
    await doomed
    await sibling
    seen: list[zmesh.SupervisionEvent] = []

    async def listen() -> None:
        async for event in sibling.supervision_events():
            seen.append(event)

    task = asyncio.ensure_future(listen())
    try:
        rt, _ = _runtime.current()
        await wait_until(lambda: rt.controller.listeners.get(procs.proc_mesh), 10, "listening")
        with pytest.raises(zmesh.SupervisionError):
            await _one(doomed, 6).ainterrupt.call_one()
        await asyncio.to_thread(wait_for, lambda: faults, 20, "the hook")
        assert [(f.mesh_name, f.rank) for f in faults] == [("doomed", 6)]
        assert await _one(sibling, 6).arank.call_one() == 6  # (a round trip more)
        assert seen == []
    finally:
        task.cancel()
        await procs.stop()


@pytest.mark.anyio
async def test_a_slices_iterator_does_not_keep_another_procs_death_from_the_hook(
    faults: list[zmesh.MeshFailure],
) -> None:
    """``supervision_events()`` of a slice without the dead proc neither
    yields its death nor keeps it from the hook (it did, for a proc's death)."""
    mesh = _spawn(1)
    pids = (await mesh.pid.call()).values()
    seen: list[zmesh.SupervisionEvent] = []

    async def listen() -> None:
        async for event in mesh.slice(gpus=0).supervision_events():
            seen.append(event)

    task = asyncio.ensure_future(listen())
    try:
        rt, _ = _runtime.current()
        await wait_until(lambda: rt.controller.listeners.get(mesh.proc_mesh), 10, "listening")
        os.kill(pids[1], signal.SIGKILL)
        await asyncio.to_thread(wait_for, lambda: faults, 20, "the hook")
        assert [(f.mesh_name, f.rank) for f in faults] == [(mesh.proc_mesh, 1)]
        assert seen == []
    finally:
        task.cancel()


class Owner(zmesh.Actor):
    """Spawns a group of workers on procs of its own; handles their failures."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str]] = []
        procs = zmesh.this_host().spawn_procs(per_host={"gpus": 1})
        self.kids = procs.spawn("kid", Worker, actors_per_proc=4)

    def __supervise__(self, failure: zmesh.MeshFailure) -> bool:
        self.seen.append((failure.mesh_name, failure.rank, failure.report()))
        return True

    @zmesh.endpoint
    def break_kid(self, rank: int) -> None:
        self.kids.flatten("a").slice(a=rank).boom.broadcast()

    @zmesh.endpoint
    def seen_failures(self) -> list[tuple[str, int, str]]:
        return list(self.seen)


def test_an_owner_actor_supervises_a_dead_actor_of_its_group(
    faults: list[zmesh.MeshFailure],
) -> None:
    owner = zmesh.this_host().spawn_procs(per_host={"gpus": 1}).spawn("owner", Owner)
    owner.break_kid.call_one(2).get(timeout=60)
    seen = wait_for(lambda: owner.seen_failures.call_one().get(timeout=10), 20, "__supervise__")
    ((mesh_name, rank, report),) = seen
    assert (mesh_name, rank) == ("kid", 2)
    assert "'actors': 2/4" in report and "ValueError: bad input" in report
    assert faults == []  # handled where it was spawned
