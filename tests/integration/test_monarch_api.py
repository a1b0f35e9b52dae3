"""Monarch's actor API on zmesh: this_proc, context, points, ValueMesh, hooks, cleanup."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zmesh

from _helpers import run_python, session_pids, wait_for


class Where(zmesh.Actor):
    def __init__(self) -> None:
        self.born_in = os.getpid()

    @zmesh.endpoint
    def where(self) -> dict[str, Any]:
        ctx = zmesh.context()
        inst = ctx.actor_instance
        return {
            "pid": os.getpid(),
            "rank": inst.rank.rank,
            "coords": dict(zmesh.current_rank()),
            "name": inst.name,
            "actor_name": zmesh.current_actor_name(),
            "size": zmesh.current_size(),
            "message_rank": ctx.message_rank.rank,
            "actor_id": inst.actor_id,
        }

    @zmesh.endpoint
    def log(self, line: str) -> None:
        self.logger.warning(line)

    @zmesh.concurrent_endpoint
    async def nap(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    @zmesh.endpoint
    def spawn_here(self) -> int:
        # this_proc() inside an actor: its own proc.
        mesh = zmesh.this_proc().spawn("inner", Where)
        return mesh.where.call_one().get(timeout=30)["pid"]


def test_this_proc_runs_actors_in_the_calling_process() -> None:
    here = zmesh.this_proc()
    assert isinstance(here, zmesh.ProcMesh) and len(here) == 1
    mesh = here.spawn("where", Where)
    info = mesh.where.call_one().get(timeout=30)
    assert info["pid"] == os.getpid() and info["name"] == "where"
    assert zmesh.this_proc() is here  # one per client
    mesh.stop().get(timeout=10)
    with pytest.raises(zmesh.ActorStoppedError):
        mesh.where.call_one().get(timeout=10)
    here.stop().get(timeout=10)  # the client is not stopped by it
    assert zmesh.this_proc().spawn("again", Where).where.call_one().get(timeout=30)["pid"] == (
        os.getpid()
    )


def test_context_points_and_value_mesh() -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("where", Where)
    vm = mesh.where.call().get(timeout=60)
    pids = [v["pid"] for v in vm.values()]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    for rank, (point, info) in enumerate(vm):  # (Point, value), as in Monarch
        assert isinstance(point, zmesh.Point) and point.rank == rank
        assert dict(point) == {"hosts": 0, "gpus": rank} == info["coords"]
        assert info["size"] == {"hosts": 1, "gpus": 2}
        assert info["name"] == info["actor_name"] == "where"
        assert info["message_rank"] == rank
        assert info["actor_id"].endswith(f"/where[{rank}]")
    assert vm.item(hosts=0, gpus=1) == vm.values()[1]
    assert vm.size() == 2 and vm.size("gpus") == 2 and vm.sizes == {"hosts": 1, "gpus": 2}
    assert vm.extent == zmesh.Extent(["hosts", "gpus"], [1, 2])
    assert vm.flatten("all").sizes == {"all": 2}
    assert mesh.extent == procs.extent == {"hosts": 1, "gpus": 2}
    assert mesh.size() == 2 and mesh.size("gpus") == 2
    flat = mesh.flatten("all")
    assert flat.sizes == {"all": 2} and flat.slice(all=1).where.call_one().get(10)["rank"] == 1
    point = zmesh.Point(3, {"hosts": 2, "gpus": 2})
    assert (
        mesh.slice(**zmesh.Point(1, {"hosts": 1, "gpus": 2})).where.call_one().get(10)["rank"] == 1
    )
    assert (point["hosts"], point.gpus, len(point), list(point)) == (1, 1, 2, ["hosts", "gpus"])
    # In the client, context() is the client's.
    assert zmesh.context().actor_instance.name == "client"
    assert zmesh.current_actor_name() == "client"
    # An actor's own proc hosts a second actor.
    assert mesh.slice(gpus=0).spawn_here.call_one().get(timeout=60) == pids[0]
    # concurrent_endpoint: two naps overlap.
    t0 = time.monotonic()
    one = mesh.slice(gpus=1)
    naps = [one.nap.call_one(0.5), one.nap.call_one(0.5)]
    assert [f.get(timeout=10) for f in naps] == [0.5, 0.5]
    assert time.monotonic() - t0 < 0.9
    procs.stop().get(timeout=10)


def test_actor_logger_writes_to_the_procs_log() -> None:
    mesh = Where.options().as_actor()
    mesh.log.call_one("a line from the logger").get(timeout=60)
    path = mesh.state().ranks[0].log_path
    wait_for(lambda: "a line from the logger" in Path(path).read_text(), 5, "the line in the log")
    assert isinstance(Where().logger, logging.Logger)
    mesh.stop().get(timeout=10)


def test_get_or_spawn_controller_returns_the_same_actor() -> None:
    first = zmesh.get_or_spawn_controller("registry", Where).get(timeout=60)
    got: list[Any] = []
    t = threading.Thread(
        target=lambda: got.append(zmesh.get_or_spawn_controller("registry", Where).get(60))
    )
    t.start()
    t.join()
    assert got[0] is first
    assert zmesh.get_or_spawn_controller("registry", Where).get(timeout=10) is first
    a = first.where.call_one().get(timeout=60)["pid"]
    assert got[0].where.call_one().get(timeout=10)["pid"] == a
    with pytest.raises(ValueError, match="registry"):
        zmesh.get_or_spawn_controller("registry", Cleaner, "x")
    zmesh.shutdown_context().get(timeout=30)
    again = zmesh.get_or_spawn_controller("registry", Where).get(timeout=60)  # procs gone: anew
    assert again is not first
    assert again.where.call_one().get(timeout=60)["pid"] != a


class Asker(zmesh.Actor):
    """Asks the job's registry from its proc, as a Monarch actor does."""

    def __init__(self, root: str = "none") -> None:
        self.root = root

    @zmesh.endpoint
    def root_of(self) -> str:
        return self.root

    @zmesh.endpoint
    async def ask(self, name: str, root: str) -> str:
        mesh = await zmesh.get_or_spawn_controller(name, Asker, root=root)
        return mesh.proc_mesh  # which procs it runs on


def test_get_or_spawn_controller_is_one_registry_for_the_job() -> None:
    """A controller spawned on an actor's ask, in a proc of the job, is the one the
    root client gets for that name, and the other way round (Monarch's rule)."""
    first = zmesh.get_or_spawn_controller("first", Asker).get(timeout=60)
    where = first.ask.call_one("second", "first").get(timeout=90)
    second = zmesh.get_or_spawn_controller("second", Asker).get(timeout=60)
    assert second.root_of.call_one().get(timeout=30) == "first"  # the actor's, not a new one
    assert second.proc_mesh == where
    assert first.ask.call_one("first", "x").get(timeout=60) == first.proc_mesh
    zmesh.shutdown_context().get(timeout=30)


CHILD_CLIENT = """
import sys
import zmesh
from test_monarch_api import Asker

first = zmesh.get_or_spawn_controller("first", Asker, root="child").get(timeout=60)
where = first.ask.call_one("second", "child").get(timeout=90)
second = zmesh.get_or_spawn_controller("second", Asker).get(timeout=60)
print(second.root_of.call_one().get(timeout=30), second.proc_mesh == where)
zmesh.shutdown()
"""


def test_a_client_started_by_a_job_is_a_job_of_its_own() -> None:
    """A client whose environment carries this job's registry (a subprocess
    of ours) keeps its own: its actors' asks and its own agree."""
    zmesh.get_or_spawn_controller("first", Asker).get(timeout=60)  # our registry is made
    assert os.environ.get("ZMESH_CONTROLLERS")  # and what a subprocess inherits
    here = str(Path(__file__).parent)
    done = run_python(["-c", CHILD_CLIENT], 150, cwd=here)
    assert done.stdout.split()[-2:] == ["child", "True"], done.stdout + done.stderr
    zmesh.shutdown_context().get(timeout=30)


# ------------------------------------------------------------ supervision


class Child(zmesh.Actor):
    @zmesh.endpoint
    def crash(self) -> None:
        os._exit(3)


class Parent(zmesh.Actor):
    def __init__(self, asynchronous: bool) -> None:
        self.asynchronous = asynchronous
        self.failures: list[str] = []

    def __supervise__(self, failure: zmesh.MeshFailure) -> Any:
        if not self.asynchronous:
            self.failures.append(f"sync {type(failure).__name__} {failure.rank} {failure.reason}")
            return True

        async def later() -> bool:
            await asyncio.sleep(0)
            self.failures.append(f"async {failure.mesh_name == failure.mesh} {failure.reason}")
            return True

        return later()

    @zmesh.endpoint
    async def crash_a_child(self) -> None:
        child = await Child.options().as_actor()
        child.crash.broadcast()

    @zmesh.endpoint
    async def seen(self) -> list[str]:
        return list(self.failures)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_supervise_gets_a_mesh_failure(asynchronous: bool) -> None:
    parent = Parent.options().as_actor(asynchronous)
    parent.crash_a_child.call_one().get(timeout=60)
    seen = wait_for(lambda: parent.seen.call_one().get(timeout=10), 10, "__supervise__")
    want = "sync MeshFailure 0" if not asynchronous else "async True"
    assert seen == [f"{want} exited with code 3"]
    assert parent.seen.call_one().get(timeout=10) == seen  # the parent lives on
    parent.stop().get(timeout=10)


def test_unhandled_fault_hook_is_called_and_the_client_goes_on() -> None:
    failures: list[zmesh.MeshFailure] = []
    zmesh.unhandled_fault_hook = failures.append  # type: ignore[assignment]
    try:
        child = Child.options(procs=2).as_actor()
        child.slice(procs=1).crash.broadcast()
        wait_for(lambda: failures, 10, "the hook")
        (failure,) = failures
        assert isinstance(failure, zmesh.MeshFailure)
        assert (failure.mesh, failure.rank) == (child.proc_mesh, 1)
        assert failure.log_path and "exited with code 3" in failure.report()
        with pytest.raises(zmesh.SupervisionError):
            child.slice(procs=1).crash.call_one().get(timeout=10)
    finally:
        del zmesh.unhandled_fault_hook  # back to zmesh's default
    assert zmesh.unhandled_fault_hook.__module__ == "zmesh._client.control.faults"


# ------------------------------------------------------------ __cleanup__


class Cleaner(zmesh.Actor):
    def __init__(self, path: str) -> None:
        self.path = path

    def __cleanup__(self, exc: BaseException | None) -> None:
        with open(self.path, "a") as f:
            f.write(f"cleaned {os.getpid()} {exc!r}\n")

    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    def exit(self) -> None:
        sys.exit(4)


class AsyncCleaner(Cleaner):
    async def __cleanup__(self, exc: BaseException | None) -> None:  # type: ignore[override]
        await asyncio.sleep(0.01)
        with open(self.path, "a") as f:
            f.write(f"async {os.getpid()}\n")


@pytest.fixture
def marks(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "cleaned.txt"
    path.touch()
    yield path


def test_cleanup_runs_when_actors_or_procs_stop(marks: Path) -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"procs": 2})
    a = procs.spawn("a", Cleaner, str(marks))
    pids = a.pid.call().get(timeout=60).values()
    a.stop().get(timeout=10)  # the actors stop, the procs stay
    wait_for(lambda: marks.read_text().count("cleaned") == 2, 5, "both cleanups")
    assert {int(line.split()[1]) for line in marks.read_text().splitlines()} == set(pids)
    b = procs.spawn("b", AsyncCleaner, str(marks))
    b.pid.call().get(timeout=60)
    procs.stop().get(timeout=10)  # SIGTERM to the procs: cleanup first
    wait_for(lambda: marks.read_text().count("async") == 2, 5, "the async cleanups")
    one = Cleaner.options().as_actor(str(marks))
    with pytest.raises(zmesh.ActorError):
        one.exit.call_one().get(timeout=60)
    wait_for(lambda: "SystemExit(4)" in marks.read_text(), 5, "the cleanup of an exiting proc")


OWNER = """
import sys
import zmesh

class Cleaner(zmesh.Actor):
    def __init__(self, path):
        self.path = path

    def __cleanup__(self, exc):
        with open(self.path, "a") as f:
            f.write("owner gone\\n")

    @zmesh.endpoint
    def pid(self):
        import os
        return os.getpid()

mesh = Cleaner.options(procs=2).as_actor(sys.argv[1])
print(mesh.pid.call().get(timeout=60).values(), flush=True)
"""


def test_cleanup_runs_when_the_owner_exits(tmp_path: Path, marks: Path) -> None:
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    before = session_pids()
    res = subprocess.run(
        [sys.executable, str(script), str(marks)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    wait_for(lambda: marks.read_text().count("owner gone") == 2, 10, "cleanups after owner exit")
    wait_for(lambda: session_pids() <= before, 10, "the owner's agent and procs to go")


class Store(zmesh.Actor):
    @zmesh.endpoint  # Monarch allows the name; to a checker it overrides the handle's .get
    def get(self, key: str) -> str:  # type: ignore[override]
        return key.upper()


def test_an_endpoint_named_get_is_called_as_in_monarch() -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 1})
    store = procs.spawn("store", Store)
    store.initialized.get(timeout=60)
    assert store.get.call_one("k").get(timeout=30) == "K"
    procs.stop().get(timeout=10)


def test_a_spawn_on_a_stopped_proc_mesh_says_so_as_monarch_does() -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 1})
    procs.spawn("store", Store).initialized.get(timeout=60)
    procs.stop().get(timeout=10)
    late = procs.spawn("late", Store)
    with pytest.raises(zmesh.ActorStoppedError, match="`ProcMesh` has already been stopped"):
        late.initialized.get(timeout=30)
    assert issubclass(zmesh.ActorStoppedError, zmesh.SupervisionError)
    assert issubclass(zmesh.SupervisionError, RuntimeError)  # Monarch's callers catch these


class Maker(zmesh.Actor):
    @zmesh.endpoint
    def make(self) -> Any:
        # Returned while it still spawns: the reply waits for it, as in Monarch.
        return zmesh.this_host().spawn_procs(per_host={"gpus": 1}).spawn("made", Store)


def test_an_endpoint_returns_a_mesh_that_is_still_spawning() -> None:
    maker = Maker.options().as_actor()
    made = maker.make.call_one().get(timeout=60)
    assert made.get.call_one("x").get(timeout=30) == "X"
    maker.stop().get(timeout=10)


@pytest.mark.anyio
async def test_stream_in_a_loop_is_monarchs_iterator_of_awaitables() -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 2})
    store = procs.spawn("store", Store)  # still spawning: the stream waits in its gate
    # (typed as values: a checker cannot tell a loop from plain code)
    early: Any = store.get.stream("a")
    assert sorted([await x for x in early]) == ["A", "A"]
    await store.initialized
    later: Any = store.get.stream("b")
    assert sorted([await x for x in later]) == ["B", "B"]
    assert sorted([v async for v in store.get.stream("c")]) == ["C", "C"]  # zmesh's form too
    await procs.stop()


class Tally(zmesh.Actor):
    def __init__(self, start: int) -> None:
        self.n = start

    @zmesh.endpoint
    def incr(self) -> None:
        self.n += 1

    @zmesh.endpoint
    def value(self) -> int:
        return self.n


def test_an_accumulator_on_a_mesh_still_spawning_reads_its_actors_when_up() -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 2})
    tally = procs.spawn("tally", Tally, 1)
    tally.incr.broadcast()
    acc = zmesh.Accumulator(tally.value, 0, lambda a, b: a + b)
    assert acc.accumulate().get(timeout=60) == 4  # it returned its identity, 0
    procs.stop().get(timeout=10)


class BrokenOnArrival:
    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        raise RuntimeError("__setstate__ error: cannot be rebuilt")


def test_arguments_that_fail_to_unpickle_in_the_actor_are_an_actor_error() -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"gpus": 1})
    store = procs.spawn("store", Store)
    with pytest.raises(zmesh.ActorError, match="__setstate__ error") as info:
        store.get.call_one(BrokenOnArrival()).get(timeout=60)  # type: ignore[arg-type]
    assert info.value.remote_type == "RuntimeError"
    procs.stop().get(timeout=10)
