"""What a ``CreateOrUpdate`` with a changed spec does to a running mesh.

A pure function of the old and the new spec (no procs, no sockets), which
``ProcTable.update`` carries out:

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

from dataclasses import dataclass

import msgspec

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


def _what_procs_get(spec: w.ProcSpec) -> w.ProcSpec:
    return msgspec.structs.replace(spec, ranks=[0], dims={})
