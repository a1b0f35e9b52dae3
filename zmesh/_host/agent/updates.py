"""What a ``CreateOrUpdate`` with a changed spec does to a running mesh.

``plan`` is a pure function of the old and the new spec (no procs, no
sockets), which ``update`` carries out on an agent's ``ProcTable``:

* ranks in the new spec only are started (the mesh grows);
* ranks in the old spec only are stopped, and leave the mesh once reaped
  (it shrinks);
* if anything else a proc is started with changed (its ``main``, its
  environment, the host's index), every rank that stays rolls to a new
  generation: stopped, then started again once reaped.

The dims may change with the ranks (growing 2 procs to 4 is dims
``{procs: 4}``); ranks that stay keep running with the dims they have.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import msgspec

from zmesh._host.agent.proctable import Mesh, ProcTable
from zmesh._shared.state import MeshView, Rank
from zmesh._wire import messages as w


@dataclass(frozen=True)
class Plan:
    """The ranks to start, to stop for good, and to restart in a new generation."""

    add: list[int]
    remove: list[int]
    roll: list[int]


def plan(old: w.ProcSpec, new: w.ProcSpec) -> Plan:
    """How to take a mesh from ``old`` to ``new`` (same owner: checked before)."""
    before, after = set(old.ranks), set(new.ranks)
    stays = [r for r in new.ranks if r in before]
    changed = _what_procs_get(old) != _what_procs_get(new)
    return Plan(
        add=[r for r in new.ranks if r not in before],
        remove=sorted(before - after),
        roll=stays if changed else [],
    )


def create(table: ProcTable, name: str, spec: w.ProcSpec, key: str = "") -> Mesh:
    """Add a mesh and start one proc per rank of ``spec``.

    ``key`` is the mesh's key (``zmesh._shared.ownership``): its procs get it,
    and accept a spawn or a stop of their actors only with it.

    A name used before (by a stopped mesh) goes on from its generations:
    nothing of the new mesh is taken for the old one's. A rank that
    cannot be started is Failed; the others still start.
    """
    mesh = Mesh(name, spec, MeshView(name, spec.ranks), key=key)
    old = table.meshes.get(name)
    if old is not None:
        mesh.generation = old.generation + 1
        mesh.retired = dict(old.retired)
        for rank in spec.ranks:
            last = old.view.ranks.get(rank, Rank(generation=mesh.retired.pop(rank, 0)))
            mesh.view.ranks[rank] = Rank(generation=last.generation)
    table.meshes[name] = mesh
    for rank in spec.ranks:
        table.spawn_or_fail(mesh, rank)
    return mesh


def update(table: ProcTable, mesh: Mesh, spec: w.ProcSpec) -> None:
    """Take a running mesh to a changed spec in place (see ``updates.plan``)."""
    todo = plan(mesh.spec, spec)
    mesh.spec = spec
    mesh.generation += 1
    now = time.monotonic()
    for rank in todo.remove + todo.roll:
        proc = mesh.procs.get(rank)
        if proc is not None and not proc.reaped:
            table.stop_proc(mesh, rank, proc, "", now)
        elif rank in todo.roll:  # nothing runs: its next generation now
            table.spawn_or_fail(mesh, rank)
        else:
            table.retire(mesh, rank)
    for rank in todo.add:
        # Back after a shrink: on from its last generation (its logs stay apart).
        mesh.view.ranks.setdefault(rank, Rank(generation=mesh.retired.pop(rank, 0)))
        table.spawn_or_fail(mesh, rank)


def _what_procs_get(spec: w.ProcSpec) -> w.ProcSpec:
    return msgspec.structs.replace(spec, ranks=[0], dims={})
