"""Spawning again under the same name updates a running proc mesh in place.

Through the public API, with the embedded agent: ``spawn_procs(name=...)``
names the mesh exactly; a second spawn under that name grows it (the first
procs keep running, the new ranks answer calls) or shrinks it (the ranks
left out stop: the client sees them Stopped in their generation, and calls
to them fail with ``ActorStoppedError``). ``zmesh get NAME --json`` shows
the mesh generation going up with each update, and a stopped name spawned
again starts at higher generations.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh
from zmesh import testing
from zmesh._client.control.controller import Controller
from zmesh._shared.state import Status
from zmesh._wire import messages as w

from _helpers import connected, own_runtime_dir, wait_for, wait_gone


class Who(zmesh.Actor):
    @zmesh.endpoint
    def who(self) -> tuple[int, int]:
        return zmesh.current_rank().rank, os.getpid()


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A registry of our own: ``zmesh get`` finds this test's embedded agent only."""
    zmesh.shutdown()  # the embedded agent starts again, registered here
    with own_runtime_dir(monkeypatch, prefix="zu-") as path:
        try:
            yield path
        finally:
            zmesh.shutdown()


def zmesh_get(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zmesh", "get", name, "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def got(name: str) -> dict[str, Any]:
    done = zmesh_get(name)
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def pids_of(mesh: zmesh.ActorMesh[Who]) -> dict[int, int]:
    return dict(mesh.who.call().get(timeout=60).values())


@pytest.fixture
def heard(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, Status, int]]:
    """Every rank state the client's controller hears from an agent (events and snapshots)."""
    out: list[tuple[str, int, Status, int]] = []
    real = Controller.apply

    def apply(self: Controller, agent: Any, mesh: str, rs: w.RankState) -> None:
        out.append((mesh, rs.rank, Status(rs.status), rs.generation))
        real(self, agent, mesh, rs)

    monkeypatch.setattr(Controller, "apply", apply)
    return out


def test_spawning_again_under_a_name_grows_and_shrinks_the_mesh(
    runtime_dir: str, heard: list[tuple[str, int, Status, int]]
) -> None:
    name = f"workers-{secrets.token_hex(2)}"  # not a random-suffix name: ours exactly
    host = zmesh.this_host()
    procs = host.spawn_procs(per_host={"procs": 2}, name=name).get(timeout=60)
    assert procs.name == name
    two = procs.spawn("who", Who)
    before = pids_of(two)
    assert sorted(before) == [0, 1]
    first = got(name)
    assert first["name"] == name and first["generation"] == 1
    assert [r["rank"] for r in first["ranks"]] == [0, 1]
    assert {r["rank"]: r["pid"] for r in first["ranks"]} == before
    assert all(r["status"] == "Running" and r["log"] and r["host"] for r in first["ranks"])

    # Grow 2 -> 4: the first two procs keep running; the old handle follows.
    grown = host.spawn_procs(per_host={"procs": 4}, name=name).get(timeout=60)
    assert grown.sizes == procs.sizes == {"hosts": 1, "procs": 4}
    four = grown.spawn("who4", Who)
    after = pids_of(four)
    assert sorted(after) == [0, 1, 2, 3]
    assert {r: after[r] for r in (0, 1)} == before
    assert pids_of(two) == before  # an actor mesh keeps the procs it was spawned on
    assert sorted(pids_of(procs.spawn("who-old", Who))) == [0, 1, 2, 3]
    g2 = got(name)
    assert g2["generation"] == 2 and [r["rank"] for r in g2["ranks"]] == [0, 1, 2, 3]

    # Shrink 4 -> 2: ranks 2 and 3 stop; the client sees them Stopped in generation 1.
    shrunk = host.spawn_procs(per_host={"procs": 2}, name=name).get(timeout=60)
    assert shrunk.sizes == procs.sizes == {"hosts": 1, "procs": 2}
    wait_gone([after[2], after[3]], 20, "the procs the mesh shrank away from")
    state = four.state()
    for rank in (2, 3):  # the agent said so, in the rank's generation
        seen = [(st, g) for m, r, st, g in list(heard) if m == name and r == rank]
        assert (Status.STOPPING, 1) in seen and (Status.STOPPED, 1) in seen, seen
        assert (state.ranks[rank].status, state.ranks[rank].generation) == (Status.STOPPED, 1)
        with pytest.raises(zmesh.ActorStoppedError):
            four.slice(procs=rank).who.call().get(timeout=30)
    assert all(state.ranks[r].status == Status.RUNNING for r in (0, 1))
    assert dict(four.slice(procs=slice(0, 2)).who.call().get(timeout=60).values()) == before
    g3 = got(name)
    assert g3["generation"] == 3 and [r["rank"] for r in g3["ranks"]] == [0, 1]

    # And grow again: ranks 2 and 3 come back as new procs, in their next generation.
    again = host.spawn_procs(per_host={"procs": 3}, name=name).get(timeout=60)
    back = pids_of(again.spawn("who3", Who))
    assert sorted(back) == [0, 1, 2] and back[2] != after[2]
    assert again.state().ranks[2].generation == 2
    procs.stop().get(timeout=10)


def test_a_stopped_name_spawns_again_at_a_higher_generation(runtime_dir: str) -> None:
    name = f"again-{secrets.token_hex(2)}"
    host = zmesh.this_host()
    procs = host.spawn_procs(per_host={"procs": 2}, name=name).get(timeout=60)
    old = procs.spawn("who", Who)
    pids = pids_of(old)
    assert got(name)["generation"] == 1
    procs.stop().get(timeout=10)
    wait_gone(pids.values(), 20, "the stopped procs")

    fresh = host.spawn_procs(per_host={"procs": 2}, name=name).get(timeout=60)
    mesh = fresh.spawn("who", Who)
    now = pids_of(mesh)
    assert sorted(now) == [0, 1] and not set(now.values()) & set(pids.values())
    assert all(st.generation == 2 for st in fresh.state().ranks.values())

    def running() -> dict[str, Any] | None:
        data = got(name)
        return data if all(r["status"] == "Running" for r in data["ranks"]) else None

    data = wait_for(running, 30, "the new mesh Running")
    assert data["generation"] == 2
    with pytest.raises(zmesh.ActorStoppedError):  # the old handle's actors are gone
        old.who.call().get(timeout=30)
    fresh.stop().get(timeout=10)


def test_zmesh_get_without_such_a_mesh_fails_in_one_line(runtime_dir: str) -> None:
    zmesh.this_host().spawn_procs(name=f"some-{secrets.token_hex(2)}").get(timeout=60)
    done = zmesh_get("nosuch")
    assert done.returncode != 0 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no mesh named 'nosuch'" in lines[0], done.stderr


def test_without_a_name_every_spawn_is_a_new_mesh() -> None:
    host = zmesh.this_host()
    a = host.spawn_procs().get(timeout=60)
    b = host.spawn_procs().get(timeout=60)
    assert a.name != b.name and a.name.startswith("procs-") and len(b) == 1
    a.stop().get(timeout=10)
    b.stop().get(timeout=10)


def test_a_mesh_over_two_hosts_updates_per_host_but_is_not_resized(
    cluster: list[testing.AgentProcess],
) -> None:
    name = f"wide-{secrets.token_hex(2)}"
    with connected([a.control for a in cluster]):
        hosts = zmesh.connect([a.control for a in cluster])
        procs = hosts.spawn_procs(per_host={"procs": 1}, name=name).get(timeout=60)
        mesh = procs.spawn("who", Who)
        before = pids_of(mesh)
        assert sorted(before) == [0, 1]
        # The same spec again: nothing changes, the handle is the same mesh.
        same = hosts.spawn_procs(per_host={"procs": 1}, name=name).get(timeout=60)
        assert same.sizes == {"hosts": 2, "procs": 1} and pids_of(same.spawn("w", Who)) == before
        with pytest.raises(zmesh.SpawnError, match="spans 2 hosts"):
            hosts.spawn_procs(per_host={"procs": 2}, name=name).get(timeout=60)
        assert pids_of(mesh) == before and procs.sizes == {"hosts": 2, "procs": 1}


def test_a_changed_proc_spec_rolls_every_rank_to_a_new_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"roll-{secrets.token_hex(2)}"
    host = zmesh.this_host()
    procs = host.spawn_procs(per_host={"procs": 2}, name=name).get(timeout=60)
    old = procs.spawn("who", Who)
    before = pids_of(old)
    # What procs start with changed (their ZMESH_ environment): every rank restarts.
    monkeypatch.setenv("ZMESH_TEST_ROLL", "1")
    rolled = host.spawn_procs(per_host={"procs": 2}, name=name).get(timeout=60)
    assert all(st.generation == 2 for st in rolled.state().ranks.values())
    now = pids_of(rolled.spawn("who", Who))
    assert sorted(now) == [0, 1] and not set(now.values()) & set(before.values())
    with pytest.raises(zmesh.ActorStoppedError):  # the old actors went with their procs
        old.who.call().get(timeout=30)
    procs.stop().get(timeout=10)
