"""The tree's plan: which hosts' parts go through which top relay (no sockets)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from zmesh._client.calls import tree as _tree


def plan(t: _tree.Tree, hosts: list[int]) -> dict[str, list[str]]:
    groups = {f"h{h}": [h] for h in hosts}
    return {top: [a for a, _ in parts] for top, parts in t._plan("m", groups).items()}


def new_tree() -> _tree.Tree:
    rt: Any = object()  # the plan needs no runtime
    return _tree.Tree(rt)


def test_sixteen_hosts_go_through_four_top_relays_of_four() -> None:
    t = new_tree()
    p = plan(t, list(range(16)))
    assert p == {f"h{4 * i}": [f"h{4 * i + j}" for j in range(4)] for i in range(4)}


def test_a_host_keeps_its_top_relay_in_every_later_fanout() -> None:
    # (so its messages always take the same way, in order)
    t = new_tree()
    plan(t, list(range(16)))
    assert plan(t, [5, 6, 12]) == {"h4": ["h5", "h6"], "h12": ["h12"]}


def test_two_hosts_are_one_message() -> None:
    assert plan(new_tree(), [0, 1]) == {"h0": ["h0", "h1"]}


def test_branch_one_is_one_level(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tree, "BRANCH", 1)
    assert plan(new_tree(), [0, 1, 2]) == {"h0": ["h0"], "h1": ["h1"], "h2": ["h2"]}


def test_several_actors_per_proc_are_wide_by_their_procs(monkeypatch: pytest.MonkeyPatch) -> None:
    # A multi-actor mesh's fan-out is one GroupCall per proc, and those go
    # through the relays like any per-proc request: the procs count, not the actors.
    monkeypatch.setattr(_tree, "MODE", "auto")
    ref: Any = types.SimpleNamespace(index=0)
    grouped: Any = types.SimpleNamespace(
        full_dims={"hosts": 16, "procs": 8, "actors": 32}, _refs=[ref]
    )
    assert _tree.wide(grouped)  # 128 procs on 16 hosts
    few: Any = types.SimpleNamespace(full_dims={"hosts": 2, "procs": 2, "actors": 64}, _refs=[ref])
    assert not _tree.wide(few)  # 4 procs, however many actors
    monkeypatch.setattr(_tree, "MODE", "direct")
    assert not _tree.wide(grouped)
