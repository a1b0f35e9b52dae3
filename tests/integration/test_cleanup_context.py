"""``__cleanup__`` runs as the actor: its rank, name, context and own endpoints.

Each cleanup reports where it ran to a ``Notes`` actor hosted by the test's
own process (``this_proc()``), through a call as an endpoint would make it
(``.get()`` from a sync cleanup, ``await`` from an async one), so a cleanup
run outside the actor's context (or on the proc's event loop, where
``.get()`` cannot block) leaves no note.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import zmesh

from _helpers import run_python, wait_for


class Notes(zmesh.Actor):
    """What the cleanups said, in the test's process."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    @zmesh.endpoint
    def note(self, line: str) -> None:
        self.lines.append(line)

    @zmesh.endpoint
    def seen(self) -> list[str]:
        return list(self.lines)


class Witness(zmesh.Actor):
    def __init__(self, notes: Notes) -> None:
        self.notes = notes

    @zmesh.endpoint
    def whoami(self) -> str:
        me = zmesh.context().actor_instance
        return f"{zmesh.current_actor_name()} {zmesh.current_rank().rank} {me.actor_id}"

    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    def __cleanup__(self, exc: BaseException | None) -> None:
        # Its own endpoint through self, then a call as a sync endpoint makes one.
        self.notes.note.call_one(f"sync {self.whoami()} {exc!r}").get(timeout=5)


class AsyncWitness(Witness):
    async def __cleanup__(self, exc: BaseException | None) -> None:  # type: ignore[override]
        self.logger.info("cleaning up %s", self.whoami())
        await self.notes.note.call_one(f"async {self.whoami()} {exc!r}")


@pytest.fixture(scope="module")
def notes() -> Iterator[Notes]:
    mesh = zmesh.this_proc().spawn("notes", Notes)
    yield mesh
    mesh.stop().get(timeout=10)


def _expected(kind: str, mesh: Witness) -> set[str]:
    """The notes each actor of ``mesh`` will leave."""
    return {f"{kind} {who} None" for who in mesh.whoami.call().get(timeout=30).values()}


def test_cleanup_of_a_stopped_mesh_runs_as_each_actor_before_stop_returns(notes: Notes) -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"procs": 2})
    try:
        one = procs.spawn("one", Witness, notes)
        many = procs.spawn("many", AsyncWitness, notes, actors_per_proc=2)
        want = _expected("sync", one) | _expected("async", many)
        assert len(want) == 2 + 4
        before = set(notes.seen.call_one().get(timeout=10))
        one.stop().get(timeout=10)
        many.stop().get(timeout=10)
        # stop() answers once each actor's __cleanup__ has run.
        assert set(notes.seen.call_one().get(timeout=10)) - before == want
    finally:
        procs.stop().get(timeout=10)


def test_cleanup_of_a_stopped_proc_runs_as_each_actor(notes: Notes) -> None:
    procs = zmesh.this_host().spawn_procs(per_host={"procs": 2})
    try:
        one = procs.spawn("solo", AsyncWitness, notes)
        many = procs.spawn("crowd", Witness, notes, actors_per_proc=3)
        want = _expected("async", one) | _expected("sync", many)
        assert len(want) == 2 + 6
        before = set(notes.seen.call_one().get(timeout=10))
    finally:
        procs.stop().get(timeout=10)  # SIGTERM to each proc: every actor cleans up
    wait_for(
        lambda: set(notes.seen.call_one().get(timeout=10)) - before == want,
        5,
        "every actor's cleanup, as that actor",
    )


def test_cleanup_of_an_actor_in_the_client_runs_as_that_actor(notes: Notes) -> None:
    here = zmesh.this_proc().spawn("here", Witness, notes)
    (who,) = here.whoami.call().get(timeout=30).values()
    before = set(notes.seen.call_one().get(timeout=10))
    here.stop().get(timeout=10)
    assert set(notes.seen.call_one().get(timeout=10)) - before == {f"sync {who} None"}


AT_EXIT = """
import sys
import zmesh

class Remote(zmesh.Actor):
    @zmesh.endpoint
    def double(self, x: int) -> int:
        return 2 * x

class Sync(zmesh.Actor):
    def __init__(self, remote) -> None:
        self.remote = remote

    @zmesh.endpoint
    def use(self, remote) -> int:
        self.remote = remote
        return 1

    def __cleanup__(self, exc) -> None:  # as the actor, and may call others
        got = self.remote.double.call_one(21).get(timeout=10)
        print("sync", zmesh.current_actor_name(), exc, got, flush=True)

class Async(Sync):
    async def __cleanup__(self, exc) -> None:
        print("async", zmesh.current_actor_name(), exc, await self.remote.double.call_one(4),
              flush=True)

if __name__ == "__main__":
    remote = Remote.options().as_actor().get(timeout=60)
    here = zmesh.this_proc()
    kept = [here.spawn("s", Sync, remote), here.spawn("a", Async, remote)]
    gone = here.spawn("gone", Sync, remote)
    gone.stop().get(timeout=10)  # its cleanup runs now, and not again at exit
    zmesh.shutdown()  # leaves the client's own actors running
    remote = Remote.options().as_actor().get(timeout=60)  # that one was stopped
    print("after shutdown", [k.use.call_one(remote).get(timeout=10) for k in kept], flush=True)
    sys.exit(0 if sys.argv[1] == "exit" else 3)
"""


@pytest.mark.parametrize("how", ["exit", "exit-with-status"])
def test_cleanup_of_the_clients_own_actors_runs_at_its_exit(tmp_path: Path, how: str) -> None:
    script = tmp_path / "at_exit.py"
    script.write_text(AT_EXIT)
    done = run_python([str(script), how], 90, cwd=str(tmp_path))
    assert done.returncode == (0 if how == "exit" else 3), done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "sync gone None 42", lines
    assert lines[1] == "after shutdown [1, 1]", lines
    assert sorted(lines[2:]) == ["async a None 8", "sync s None 42"], done.stdout + done.stderr
