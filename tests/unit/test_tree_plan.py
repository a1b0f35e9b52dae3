"""The tree's plan: which hosts' parts go through which top relay (no sockets)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from zmesh._client import tree as _tree


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


@pytest.mark.parametrize("mode", ["auto", "tree"])
def test_several_actors_per_proc_keep_the_grouped_path(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    # A relay forwards per-proc requests; a multi-actor mesh sends one grouped
    # message per proc instead (zmesh._client.grouping), whatever the mode.
    monkeypatch.setattr(_tree, "MODE", mode)
    ref: Any = types.SimpleNamespace(index=0)
    grouped: Any = types.SimpleNamespace(
        full_dims={"hosts": 16, "procs": 8, "actors": 32}, _refs=[ref]
    )
    assert not _tree.wide(grouped)
    flat: Any = types.SimpleNamespace(full_dims={"a": 4096}, _refs=[ref])  # flattened
    assert not _tree.wide(flat)
