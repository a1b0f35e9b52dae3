"""Properties of the supervision state machine (zmesh/_state.py), by hypothesis.

Random sequences of reports, in any order and with repeats, must never move
a rank backwards (its generation never decreases; a terminal status is
frozen for its generation), must report each failure exactly once per
``(mesh, rank, generation)``, and a snapshot of the agent's truth must bring
any client view, however it got there, back to that truth.
"""

from __future__ import annotations

import os
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zmesh._shared.state import FailureDedup, MeshView, Rank, Status, mesh_status

# ZMESH_PROPERTY_SCALE=20 searches twenty times longer (the suite keeps it short).
SCALE = int(os.environ.get("ZMESH_PROPERTY_SCALE", "1"))
FAST = settings(
    max_examples=150 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

MESHES = ["m", "n"]
RANKS = [0, 1, 2]

ranks_st = st.builds(
    Rank,
    status=st.sampled_from(list(Status)),
    generation=st.integers(0, 4),
    reason=st.sampled_from(["", "killed by SIGKILL", "no heartbeat", "lost"]),
    pid=st.sampled_from([0, 11, 12]),
    addr=st.sampled_from(["", "tcp://a:1", "tcp://a:2"]),
    log_path=st.sampled_from(["", "/l1", "/l2"]),
    exit_code=st.sampled_from([None, 0, 1, -9]),
)
reports_st = st.lists(
    st.tuples(st.sampled_from(MESHES), st.sampled_from(RANKS), ranks_st), max_size=60
)


def assert_not_backwards(before: Rank, after: Rank) -> None:
    """``after`` follows ``before`` in one rank's life."""
    assert after.generation >= before.generation, (before, after)
    if before.status.terminal and after.generation == before.generation:
        assert after == before, f"a frozen generation changed: {before} -> {after}"


# ------------------------------------------------------------ any reports


@FAST
@given(reports_st)
def test_no_report_moves_a_rank_backwards(reports: list[tuple[str, int, Rank]]) -> None:
    views = {m: MeshView(m, RANKS) for m in MESHES}
    for mesh, rank, new in reports:
        view = views[mesh]
        before = view.ranks[rank]
        got = view.apply(rank, new)
        after = view.ranks[rank]
        assert_not_backwards(before, after)
        # apply says exactly when (and to what) the rank changed
        if got is None:
            assert after is before
        else:
            assert got == after != before
            assert (after.status, after.generation) == (new.status, new.generation)
        # the mesh is never healthier than its worst rank
        assert view.status is mesh_status(r.status for r in view.ranks.values())


@FAST
@given(reports_st)
def test_each_failure_reported_exactly_once_per_generation(
    reports: list[tuple[str, int, Rank]],
) -> None:
    """As the controller does it: a changed state that is a failure, through the dedup."""
    views = {m: MeshView(m, RANKS) for m in MESHES}
    dedup = FailureDedup()
    reported: list[tuple[str, int, int]] = []
    failed: set[tuple[str, int, int]] = set()  # generations seen in a failure status
    for mesh, rank, new in reports:
        state = views[mesh].apply(rank, new)
        if state is None:
            continue
        if state.status.failure:
            failed.add((mesh, rank, state.generation))
            if dedup.first(mesh, rank, state.generation):
                reported.append((mesh, rank, state.generation))
    assert len(reported) == len(set(reported)), reported
    assert set(reported) == failed


@FAST
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("first"), st.sampled_from(MESHES), st.sampled_from(RANKS),
                      st.integers(0, 3)),
            st.tuples(st.just("forget"), st.sampled_from(MESHES)),
        ),
        max_size=80,
    )
)  # fmt: skip
def test_failure_dedup_is_a_set_per_mesh(ops: list[tuple]) -> None:
    dedup = FailureDedup()
    model: set[tuple[str, int, int]] = set()
    for op in ops:
        if op[0] == "first":
            key = op[1:]
            assert dedup.first(*key) is (key not in model)
            model.add(key)
        else:
            dedup.forget(op[1])
            model = {k for k in model if k[0] != op[1]}


# ------------------------------------------------------------ an agent's truth


class Truth:
    """What an agent knows of one mesh, made the way HostAgent makes it:
    every transition goes through the agent's own MeshView, and what changed
    is what the agent publishes."""

    def __init__(self, ranks: list[int]) -> None:
        self.view = MeshView("m", ranks)
        self.history: list[tuple[int, Rank]] = []  # the events, in publication order

    def step(self, rank: int, what: str) -> None:
        cur = self.view.ranks[rank]
        gen = cur.generation
        new: Rank | None = None
        if what == "spawn" and (gen == 0 or cur.status.terminal):
            new = Rank(Status.INITIALIZING, gen + 1, pid=100 + gen, log_path=f"/g{gen + 1}")
        elif what == "hello":
            new = Rank(Status.RUNNING, gen, pid=100 + gen - 1, addr=f"tcp://p:{gen}")
        elif what == "stop":
            new = replace(cur, status=Status.STOPPING, reason="")
        elif what == "reap":
            stopping = cur.status is Status.STOPPING
            new = Rank(Status.STOPPED if stopping else Status.FAILED, gen,
                       reason="exited with code 0" if stopping else "killed by SIGKILL",
                       exit_code=0 if stopping else -9)  # fmt: skip
        elif what == "hang" and cur.status is Status.RUNNING:
            new = Rank(Status.TIMEOUT, gen, reason="no heartbeat for 2.0s")
        if new is not None and new.generation > 0 and self.view.apply(rank, new) is not None:
            self.history.append((rank, self.view.ranks[rank]))


truth_st = st.lists(
    st.tuples(st.sampled_from(RANKS),
              st.sampled_from(["spawn", "hello", "hello", "stop", "reap", "hang"])),
    max_size=40,
)  # fmt: skip


@FAST
@given(truth_st, st.data())
def test_a_snapshot_brings_any_view_back_to_the_truth(
    script: list[tuple[int, str]], data: st.DataObject
) -> None:
    """The client heard some of the agent's events, in any order, some twice,
    and guessed Unknown during silences; then it reads the agent's state."""
    truth = Truth(RANKS)
    for rank, what in script:
        truth.step(rank, what)
    heard = data.draw(
        st.lists(
            st.one_of(
                st.sampled_from(truth.history) if truth.history else st.nothing(),
                st.tuples(st.sampled_from(RANKS), st.just("unknown")),
            ),
            max_size=30,
        )
    )
    client = MeshView("m", RANKS)
    dedup = FailureDedup()
    reported: list[tuple[int, int]] = []

    def hear(rank: int, new: Rank) -> None:
        before = client.ranks[rank]
        state = client.apply(rank, new)
        assert_not_backwards(before, client.ranks[rank])
        if state is not None and state.status.failure and dedup.first("m", rank, state.generation):
            reported.append((rank, state.generation))

    for rank, item in heard:
        if item == "unknown":  # Controller.judge, as a lost agent makes it
            cur = client.ranks[rank]
            if not cur.status.terminal:
                hear(rank, replace(cur, status=Status.UNKNOWN, reason="agent unreachable"))
        else:
            assert isinstance(item, Rank)
            hear(rank, item)
    for rank, state in truth.view.ranks.items():  # the snapshot (GetState)
        hear(rank, state)
    assert client.ranks == truth.view.ranks
    assert len(reported) == len(set(reported))
    for rank, state in client.ranks.items():
        if state.status.failure:
            assert (rank, state.generation) in reported
