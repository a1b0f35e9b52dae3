"""Failures belong to actors and go up the tree, as in Monarch.

An endpoint's ``Exception`` with a caller is that caller's ``ActorError`` and
the actor lives; one with nowhere to go (a ``broadcast``), or any
``BaseException``, kills the actor alone: its proc and the other actors on it
go on, its calls raise ``SupervisionError`` in Monarch's words, and one
``MeshFailure`` per dead rank goes to whoever spawned it: the spawning
actor's ``__supervise__`` (a falsy return or an exception fails that actor
too, chained), or in the client ``zmesh.unhandled_fault_hook``. Real procs,
real ``kill -9``.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from typing import Any

import pytest

import zmesh

from _helpers import pid_alive, wait_for


class Worker(zmesh.Actor):
    @zmesh.endpoint
    def boom(self) -> None:
        raise ValueError("bad input")

    @zmesh.endpoint
    def interrupt(self) -> None:
        raise KeyboardInterrupt("pressed")

    @zmesh.endpoint
    async def ainterrupt(self) -> None:
        raise KeyboardInterrupt("pressed")

    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    def abort(self, reason: str | None) -> None:
        zmesh.context().actor_instance.abort(reason)


class Owner(zmesh.Actor):
    """Spawns a mesh of workers on procs of its own; handles their failures or not."""

    def __init__(self, handles: str) -> None:
        self.handles = handles  # "yes", "no" or "raise"
        self.seen: list[str] = []
        self.kids = zmesh.this_host().spawn_procs(per_host={"gpus": 1}).spawn("kid", Worker)

    def __supervise__(self, failure: zmesh.MeshFailure) -> bool:
        self.seen.append(failure.report())
        if self.handles == "raise":
            raise RuntimeError("supervisor gave up")
        return self.handles == "yes"

    @zmesh.endpoint
    def kid_pid(self) -> int:
        return self.kids.pid.call_one().get(timeout=30)

    @zmesh.endpoint
    def break_kid(self) -> None:
        self.kids.boom.broadcast()

    @zmesh.endpoint
    def seen_failures(self) -> list[str]:
        return list(self.seen)

    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def break_kid_and_wait(self, seconds: float) -> str:
        self.kids.boom.broadcast()
        await asyncio.sleep(seconds)  # its kid's failure kills it meanwhile
        return "survived"


def test_an_exception_with_a_caller_is_an_actor_error_and_the_actor_lives(
    faults: list[zmesh.MeshFailure],
) -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 1})
    worker = procs.spawn("worker", Worker)
    with pytest.raises(zmesh.ActorError, match="bad input"):
        worker.boom.call_one().get(timeout=60)
    assert worker.pid.call_one().get(timeout=30) > 0
    assert faults == []


def test_a_broadcast_exception_kills_the_actor_alone(faults: list[zmesh.MeshFailure]) -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 2})
    doomed = procs.spawn("doomed", Worker)
    neighbour = procs.spawn("neighbour", Worker)
    pids = doomed.pid.call().get(timeout=60).values()
    doomed.boom.broadcast()
    wait_for(lambda: len(faults) == 2, 20, "one MeshFailure per dead rank")
    assert sorted(f.rank for f in faults) == [0, 1]
    assert {f.mesh_name for f in faults} == {"doomed"}
    first = min(faults, key=lambda f: f.rank)
    assert first.crashed_ranks == [0]
    assert "and all its descendants have failed: ValueError: bad input" in first.report()
    with pytest.raises(zmesh.SupervisionError) as info:
        doomed.slice(gpus=1).pid.call_one().get(timeout=30)
    assert isinstance(info.value, RuntimeError)  # as Monarch's is
    want = (
        "Endpoint call doomed.pid() failed, The actor test_actor_death.Worker "
        "doomed{'hosts': 0/1, 'gpus': 1/2} and all its descendants have failed: "
        "ValueError: bad input"
    )
    assert str(info.value).startswith(want)
    assert "mesh=" in str(info.value) and "log=" in str(info.value)  # zmesh's suffix stays
    # The procs, and the other actors on them, go on.
    assert neighbour.pid.call().get(timeout=30).values() == pids
    assert all(pid_alive(p) for p in pids)
    assert len(faults) == 2  # once per rank


def test_a_base_exception_kills_the_actor_even_with_a_caller(
    faults: list[zmesh.MeshFailure],
) -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 1})
    worker = procs.spawn("worker", Worker)
    with pytest.raises(zmesh.SupervisionError, match="KeyboardInterrupt: pressed"):
        worker.interrupt.call_one().get(timeout=60)
    wait_for(lambda: faults, 20, "the hook")
    with pytest.raises(zmesh.SupervisionError):
        worker.pid.call_one().get(timeout=30)


@pytest.mark.parametrize("endpoint", ["interrupt", "ainterrupt"])
def test_a_base_exception_kills_each_actor_of_a_group_fan_out_too(
    faults: list[zmesh.MeshFailure], endpoint: str
) -> None:
    # Idle actors of one proc run a fan-out's parts at once (the group fast
    # path, zmesh._host.proc.groupfast): the rule is the mailbox's all the same.
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 1})
    group = procs.spawn("group", Worker, actors_per_proc=2)
    (pid,) = set(group.pid.call().get(timeout=60).values())
    with pytest.raises(zmesh.SupervisionError, match="KeyboardInterrupt: pressed"):
        getattr(group, endpoint).call().get(timeout=30)
    for k in range(2):  # each actor is dead; (their proc lives: a neighbour answers)
        with pytest.raises(zmesh.SupervisionError, match="KeyboardInterrupt: pressed"):
            group.slice(actors=k).pid.call_one().get(timeout=30)
    assert procs.spawn("neighbour", Worker).pid.call_one().get(timeout=60) == pid


def test_survive_errors_keeps_zmeshs_older_rule(faults: list[zmesh.MeshFailure]) -> None:
    class Sturdy(Worker):
        survive_errors = True

    sturdy = zmesh.this_host().spawn_procs(per_host={"gpus": 1}).spawn("sturdy", Sturdy)
    pid = sturdy.pid.call_one().get(timeout=60)
    sturdy.boom.broadcast()
    with pytest.raises(zmesh.ActorError, match="KeyboardInterrupt"):
        sturdy.interrupt.call_one().get(timeout=30)
    assert sturdy.pid.call_one().get(timeout=30) == pid
    assert faults == []


def _owner(handles: str) -> tuple[Any, Any, int]:
    """An owner actor with a sibling on its proc: (owner, sibling, the kid's pid)."""
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 1})
    owner = procs.spawn("owner", Owner, handles)
    sibling = procs.spawn("sibling", Worker)
    return owner, sibling, owner.kid_pid.call_one().get(timeout=60)


def test_a_handled_failure_stops_at_the_owner(faults: list[zmesh.MeshFailure]) -> None:
    owner, _, kid_pid = _owner("yes")
    owner_pid = owner.pid.call_one().get(timeout=30)
    os.kill(kid_pid, signal.SIGKILL)
    seen = wait_for(lambda: owner.seen_failures.call_one().get(timeout=10), 20, "__supervise__")
    assert "killed by SIGKILL" in seen[0]
    owner.break_kid.call_one().get(timeout=30)  # (no kid left to break: nothing more)
    assert owner.pid.call_one().get(timeout=30) == owner_pid
    assert faults == []


@pytest.mark.parametrize("handles", ["no", "raise"])
def test_an_unhandled_kill_goes_up_the_tree_to_the_client(
    faults: list[zmesh.MeshFailure], handles: str
) -> None:
    """kid proc (kill -9) -> owner actor (__supervise__ falsy or raising: it dies,
    its proc lives) -> client (unhandled_fault_hook), with a chained report."""
    owner, sibling, kid_pid = _owner(handles)
    os.kill(kid_pid, signal.SIGKILL)
    wait_for(lambda: faults, 20, "the client's hook")
    (failure,) = faults
    assert failure.mesh_name == "owner"
    report = failure.report()
    assert "The actor test_actor_death.Owner owner{'hosts': 0/1, 'gpus': 0/1}" in report
    assert "the process of mesh" in report and "killed by SIGKILL" in report
    with pytest.raises(zmesh.SupervisionError, match=r"Endpoint call owner\.pid"):
        owner.pid.call_one().get(timeout=30)
    assert sibling.pid.call_one().get(timeout=30) > 0  # its proc lives: only the actor failed


def test_an_unhandled_actor_death_chains_through_the_owner(
    faults: list[zmesh.MeshFailure],
) -> None:
    """kid actor (broadcast raises) -> owner actor (falsy) -> client, every level named."""
    owner, sibling, _ = _owner("no")
    owner.break_kid.call_one().get(timeout=30)
    wait_for(lambda: faults, 20, "the client's hook")
    report = faults[0].report()
    assert "The actor test_actor_death.Owner owner" in report
    assert "The actor test_actor_death.Worker kid{'hosts': 0/1, 'gpus': 0/1}" in report
    assert "ValueError: bad input" in report
    assert sibling.pid.call_one().get(timeout=30) > 0


def test_a_call_in_flight_fails_when_its_actor_fails_meanwhile(
    faults: list[zmesh.MeshFailure],
) -> None:
    """The owner's kid dies, the owner does not handle it and fails too, while
    a call of the owner runs: that call fails with the owner's death, as
    Monarch's does, not with the value it returns later."""
    owner, sibling, _ = _owner("raise")
    with pytest.raises(zmesh.SupervisionError) as info:
        owner.break_kid_and_wait.call_one(3.0).get(timeout=60)
    text = str(info.value)
    assert text.startswith("Endpoint call owner.break_kid_and_wait() failed, The actor"), text
    # ...with why: what its __supervise__ raised, and the kid's failure it was handling.
    assert "__supervise__ raised RuntimeError: supervisor gave up, handling: " in text, text
    assert "ValueError: bad input" in text, text
    wait_for(lambda: faults, 20, "the client's hook")
    assert sibling.pid.call_one().get(timeout=30) > 0


class BadInit(zmesh.Actor):
    def __init__(self) -> None:
        raise ValueError("no config")

    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


def test_a_failing_init_is_a_mesh_failure_per_rank_and_a_spawn_error(
    faults: list[zmesh.MeshFailure],
) -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 2})
    bad = procs.spawn("bad_init", BadInit)
    wait_for(lambda: len(faults) == 2, 20, "one MeshFailure per rank")
    assert sorted(f.rank for f in faults) == [0, 1]
    for failure in faults:
        assert failure.mesh_name == "bad_init"
        assert "test_actor_death.BadInit bad_init failed to start" in str(failure)
        assert "ValueError: no config" in str(failure)
        assert failure.log_path.endswith(f".{failure.rank}.g1.log")
    with pytest.raises(zmesh.SpawnError, match="no config"):
        bad.slice(gpus=1).pid.call_one().get(timeout=30)


@pytest.mark.parametrize("reason", [None, "lost the lease"])
def test_abort_kills_the_actor_with_its_reason(
    faults: list[zmesh.MeshFailure], reason: str | None
) -> None:
    worker = zmesh.this_host().spawn_procs(per_host={"gpus": 1}).spawn("worker", Worker)
    with pytest.raises(zmesh.SupervisionError, match=reason or "no reason provided"):
        worker.abort.call_one(reason).get(timeout=60)
    wait_for(lambda: faults, 20, "the hook")
    assert f"ActorAborted: {reason or 'no reason provided'}" in faults[0].report()


class Sleeper(zmesh.Actor):
    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def nap(self) -> None:
        await asyncio.sleep(60)


@pytest.mark.anyio
async def test_a_dead_procs_calls_fail_in_monarchs_words(faults: list[zmesh.MeshFailure]) -> None:
    """kill -9 of a proc: the call on it and every later one (await, .get(),
    call_one, call) say which actor and endpoint, as Monarch does, with
    zmesh's reason and context after; a stopped mesh's calls too."""
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 2})
    victim = procs.spawn("victim", Sleeper)
    bystander = procs.spawn("bystander", Sleeper)
    await bystander  # up on both procs before one dies (else its spawn fails instead)
    pids = (await victim.pid.call()).values()
    napping = victim.slice(gpus=1).nap.call_one()
    os.kill(pids[1], signal.SIGKILL)
    actor = "The actor test_actor_death.Sleeper victim{'hosts': 0/1, 'gpus': 1/2}"
    died = "and all its descendants have failed: the process of mesh"
    with pytest.raises(zmesh.SupervisionError) as info:
        await napping
    text = str(info.value)
    assert text.startswith(f"Endpoint call victim.nap() failed, {actor} {died}"), text
    assert "killed by SIGKILL" in text and "rank=1" in text and "log=" in text
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(zmesh.SupervisionError, match=r"Endpoint call victim\.pid\(\) failed"):
        await victim.pid.call()
    with pytest.raises(zmesh.SupervisionError, match=re.escape(f"{actor} {died}")):
        await asyncio.to_thread(victim.slice(gpus=1).pid.call_one().get, 30)
    await bystander.slice(gpus=0).pid.call_one()  # the live proc serves
    await bystander.stop()
    with pytest.raises(zmesh.ActorStoppedError, match=r"bystander\.pid\(\) failed, Supervision"):
        await bystander.slice(gpus=0).pid.call_one()
    await procs.stop()


class Foster(zmesh.Actor):
    """Spawns its kids on procs its owner handed it, as a Monarch actor does."""

    def __init__(self, procs: zmesh.ProcMesh) -> None:
        self.procs = procs
        self.seen: list[str] = []
        self.kids = procs.spawn("fostered", Worker)

    def __supervise__(self, failure: zmesh.MeshFailure) -> bool:
        self.seen.append(failure.report())
        return True

    @zmesh.endpoint
    def kid_pids(self) -> list[int]:
        return self.kids.pid.call().get(timeout=30).values()

    @zmesh.endpoint
    def break_kids(self) -> None:
        self.kids.boom.broadcast()

    @zmesh.endpoint
    def seen_failures(self) -> list[str]:
        return list(self.seen)

    @zmesh.endpoint
    def spawn_and_stop(self) -> str:
        more = self.procs.spawn("more", Worker)
        more.pid.call().get(timeout=30)
        more.stop().get(timeout=30)
        try:
            more.pid.call().get(timeout=30)
        except zmesh.ActorStoppedError as exc:
            return type(exc).__name__
        return "still running"


def test_an_actor_spawns_on_procs_its_owner_handed_it(faults: list[zmesh.MeshFailure]) -> None:
    """The owner hands a ProcMesh to its actor (a spawn argument): the actor
    spawns there, stops what it spawned, and supervises it; the procs stay the
    owner's. (A plain pickle of the handle gives nothing: tests/security.)"""
    home = zmesh.this_host().spawn_procs(per_host={"gpus": 1})
    lent = zmesh.this_host().spawn_procs(per_host={"gpus": 2})
    foster = home.spawn("foster", Foster, lent)
    kid_pids = foster.kid_pids.call_one().get(timeout=60)
    assert len(kid_pids) == 2 and os.getpid() not in kid_pids
    assert foster.spawn_and_stop.call_one().get(timeout=60) == "ActorStoppedError"
    foster.break_kids.call_one().get(timeout=30)
    wait_for(lambda: len(foster.seen_failures.call_one().get(timeout=10)) == 2, 20, "supervise")
    reports = foster.seen_failures.call_one().get(timeout=10)
    assert all("The actor test_actor_death.Worker fostered" in r for r in reports), reports
    assert faults == []  # handled by the actor that spawned them, not the procs' owner
    again = lent.spawn("again", Worker)  # the owner's procs are still its own
    assert again.pid.call().get(timeout=30).values() == kid_pids
