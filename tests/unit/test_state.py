"""The supervision state machine (zmesh/_state.py), driven directly."""

from __future__ import annotations

import itertools

import pytest

from zmesh._shared.state import FailureDedup, MeshView, Rank, Status, advance, mesh_status

ALL = list(Status)
TERMINAL = [Status.STOPPED, Status.FAILED, Status.TIMEOUT]
LIVE = [Status.NOT_EXIST, Status.INITIALIZING, Status.RUNNING, Status.STOPPING, Status.UNKNOWN]


def test_status_classification() -> None:
    assert {s for s in ALL if s.terminal} == set(TERMINAL)
    assert {s for s in ALL if s.failure} == {Status.FAILED, Status.TIMEOUT, Status.UNKNOWN}
    assert str(Status.FAILED) == "Failed"
    assert Status("Timeout") is Status.TIMEOUT


# ------------------------------------------------------------ generations


@pytest.mark.parametrize("old", ALL)
@pytest.mark.parametrize("current", ALL)
def test_older_generation_never_overwrites_newer(current: Status, old: Status) -> None:
    cur = Rank(current, generation=3, reason="now")
    assert advance(cur, Rank(old, generation=2, reason="stale")) is None
    assert advance(cur, Rank(old, generation=0)) is None


def test_older_generation_ignored_by_view() -> None:
    view = MeshView("m", [0])
    assert view.apply(0, Rank(Status.RUNNING, 2, pid=22)) is not None
    assert view.apply(0, Rank(Status.FAILED, 1, reason="killed by SIGKILL")) is None
    assert view.ranks[0] == Rank(Status.RUNNING, 2, pid=22)


@pytest.mark.parametrize("frozen", TERMINAL)
@pytest.mark.parametrize("later", ALL)
def test_terminal_status_is_frozen_for_its_generation(frozen: Status, later: Status) -> None:
    cur = Rank(frozen, generation=1, reason="first word", log_path="/l")
    assert advance(cur, Rank(later, generation=1, reason="second word", pid=7)) is None


def test_timeout_stays_timeout_when_the_proc_wakes_up() -> None:
    """SIGSTOP -> Timeout; SIGCONT brings heartbeats/hello back: still Timeout."""
    view = MeshView("m", [0])
    view.apply(0, Rank(Status.RUNNING, 1, pid=10, addr="tcp://x:1"))
    assert view.apply(0, Rank(Status.TIMEOUT, 1, reason="no heartbeat for 2.0s")) is not None
    assert view.apply(0, Rank(Status.RUNNING, 1, pid=10, addr="tcp://x:1")) is None
    assert view.apply(0, Rank(Status.FAILED, 1, reason="killed by SIGKILL")) is None
    assert view.ranks[0].status is Status.TIMEOUT
    assert view.ranks[0].reason == "no heartbeat for 2.0s"


@pytest.mark.parametrize("frozen", TERMINAL)
@pytest.mark.parametrize("new", ALL)
def test_newer_generation_replaces_frozen_one(frozen: Status, new: Status) -> None:
    cur = Rank(frozen, generation=1, reason="dead", pid=5, addr="tcp://a:1", log_path="/g1")
    nxt = Rank(new, generation=2, pid=6, log_path="/g2")
    assert advance(cur, nxt) == nxt  # nothing of the old generation leaks in


def test_newer_generation_does_not_inherit_old_facts() -> None:
    cur = Rank(Status.RUNNING, 1, pid=5, addr="tcp://a:1", log_path="/g1", reason="r")
    nxt = Rank(Status.INITIALIZING, 2)
    assert advance(cur, nxt) == nxt


# ------------------------------------------------------------ same generation


def test_same_generation_progress_keeps_known_facts() -> None:
    cur = Rank(Status.INITIALIZING, 1, pid=9, log_path="/l")
    nxt = advance(cur, Rank(Status.RUNNING, 1, addr="tcp://a:1"))
    assert nxt == Rank(Status.RUNNING, 1, pid=9, addr="tcp://a:1", log_path="/l")
    # a failure report keeps pid/addr/log learnt before
    dead = advance(nxt, Rank(Status.FAILED, 1, reason="killed by SIGKILL", exit_code=-9))
    assert dead is not None
    assert (dead.status, dead.reason, dead.exit_code) == (Status.FAILED, "killed by SIGKILL", -9)
    assert (dead.pid, dead.addr, dead.log_path) == (9, "tcp://a:1", "/l")


def test_repeat_of_current_state_is_ignored() -> None:
    cur = Rank(Status.RUNNING, 1, pid=9, addr="tcp://a:1")
    assert advance(cur, Rank(Status.RUNNING, 1)) is None
    assert advance(cur, cur) is None


@pytest.mark.parametrize("real", [s for s in ALL if s is not Status.UNKNOWN])
def test_unknown_is_replaced_by_a_real_report_of_same_generation(real: Status) -> None:
    cur = Rank(Status.UNKNOWN, 4, reason="agent unreachable", pid=3, log_path="/l")
    nxt = advance(cur, Rank(real, 4, reason="" if real is Status.RUNNING else "real"))
    assert nxt is not None
    assert nxt.status is real
    assert nxt.generation == 4
    assert nxt.pid == 3 and nxt.log_path == "/l"
    if real is Status.RUNNING:
        # the guess's reason does not survive into a healthy state
        assert nxt.reason == ""


def test_unknown_then_running_then_failed() -> None:
    view = MeshView("m", [0])
    view.apply(0, Rank(Status.RUNNING, 1, addr="tcp://a:1"))
    assert view.apply(0, Rank(Status.UNKNOWN, 1, reason="lost")) is not None
    assert view.apply(0, Rank(Status.RUNNING, 1)) is not None
    assert view.ranks[0].status is Status.RUNNING
    assert view.apply(0, Rank(Status.FAILED, 1, reason="exited with code 1")) is not None
    assert view.ranks[0].status is Status.FAILED


# ------------------------------------------------------------ mesh status

_SEVERITY_ORDER = [
    Status.FAILED,
    Status.TIMEOUT,
    Status.UNKNOWN,
    Status.STOPPED,
    Status.STOPPING,
    Status.NOT_EXIST,
    Status.INITIALIZING,
    Status.RUNNING,
]


def test_mesh_status_empty_is_not_exist() -> None:
    assert mesh_status([]) is Status.NOT_EXIST
    assert MeshView("m", []).status is Status.NOT_EXIST


@pytest.mark.parametrize("combo", list(itertools.combinations_with_replacement(ALL, 3)))
def test_mesh_never_healthier_than_worst_rank(combo: tuple[Status, ...]) -> None:
    got = mesh_status(combo)
    assert got in combo
    worst = min(combo, key=_SEVERITY_ORDER.index)
    assert got is worst
    # order of ranks does not matter
    assert mesh_status(reversed(combo)) is got


def test_one_failed_rank_makes_mesh_failed() -> None:
    view = MeshView("m", range(8))
    for r in range(8):
        view.apply(r, Rank(Status.RUNNING, 1))
    assert view.status is Status.RUNNING
    view.apply(5, Rank(Status.UNKNOWN, 1))
    assert view.status is Status.UNKNOWN
    view.apply(3, Rank(Status.TIMEOUT, 1))
    assert view.status is Status.TIMEOUT
    view.apply(6, Rank(Status.FAILED, 1))
    assert view.status is Status.FAILED
    # a respawned generation of rank 6 running again: the mesh is as bad as rank 3
    view.apply(6, Rank(Status.RUNNING, 2))
    assert view.status is Status.TIMEOUT


def test_view_apply_reports_changes_only() -> None:
    view = MeshView("m", [0, 1])
    assert view.ranks == {0: Rank(), 1: Rank()}
    st = view.apply(1, Rank(Status.INITIALIZING, 1, pid=4))
    assert st == view.ranks[1] == Rank(Status.INITIALIZING, 1, pid=4)
    assert view.apply(1, Rank(Status.INITIALIZING, 1)) is None
    # a rank the view did not list yet starts from NotExist
    assert view.apply(7, Rank(Status.RUNNING, 1)) is not None
    assert 7 in view.ranks


# ------------------------------------------------------------ dedup


def test_failure_dedup_reports_each_rank_generation_once() -> None:
    d = FailureDedup()
    assert d.first("m", 0, 1)
    assert not d.first("m", 0, 1)
    assert not d.first("m", 0, 1)
    assert d.first("m", 0, 2)  # new generation
    assert d.first("m", 1, 1)  # another rank
    assert d.first("n", 0, 1)  # another mesh
    assert not d.first("n", 0, 1)


def test_failure_dedup_forget_is_per_mesh() -> None:
    d = FailureDedup()
    d.first("m", 0, 1)
    d.first("n", 0, 1)
    d.forget("m")
    assert d.first("m", 0, 1)
    assert not d.first("n", 0, 1)


def test_dedup_with_view_one_report_per_generation_whatever_the_sources() -> None:
    """Failed then Timeout then Unknown for one generation: one report."""
    view = MeshView("m", [0])
    d = FailureDedup()
    reports = []
    heard = [
        Rank(Status.RUNNING, 1),
        Rank(Status.UNKNOWN, 1, reason="agent lost"),
        Rank(Status.FAILED, 1, reason="killed by SIGKILL"),
        Rank(Status.FAILED, 1, reason="killed by SIGKILL"),  # replayed from a snapshot
        Rank(Status.TIMEOUT, 1, reason="late"),
        Rank(Status.UNKNOWN, 1, reason="agent lost again"),
        Rank(Status.RUNNING, 2),
        Rank(Status.FAILED, 2, reason="exited with code 1"),
        Rank(Status.FAILED, 1, reason="very late replay"),
    ]
    for rank_state in heard:
        st = view.apply(0, rank_state)
        if st is not None and st.status.failure and d.first("m", 0, st.generation):
            reports.append((st.generation, st.status))
    assert reports == [(1, Status.UNKNOWN), (2, Status.FAILED)]
    assert view.ranks[0].status is Status.FAILED and view.ranks[0].generation == 2
