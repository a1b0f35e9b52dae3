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

import pytest

import zmesh

from _helpers import wait_for


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
