"""Judging health and folding history (``zmesh status``, ``ps``, ``top``), on fixed snapshots."""

from __future__ import annotations

import io

from rich.console import Console

from zmesh._shared import stats as _stats
from zmesh._shared.state import Status
from zmesh._wire import messages as w
from zmesh.top._app import apply_key
from zmesh.top._collect import AgentSample, EventRecord, Snapshot
from zmesh.top._health import base_name, find_meshes, judge
from zmesh.top._render import Screen, render
from zmesh.top._view import Options, derive

NOW = 1_700_000_000.0
HOST = _stats.HostStatistics("box", 1, 100.0, 8, 25.0, 16 << 30, 4 << 30, [0.5, 0.4, 0.3])
KILLED = "killed by SIGKILL"


def rank(r: int, status: str, gen: int = 1, reason: str = "") -> w.RankState:
    return w.RankState(r, Status(status), gen, reason, pid=100 + r)


def mesh(name: str, *ranks: w.RankState, owner: str = "owner") -> w.MeshReport:
    return w.MeshReport(name, owner, Status.RUNNING, list(ranks))


def agent(
    *meshes: w.MeshReport,
    services: tuple[_stats.ServiceSummary, ...] = (),
    stopped: tuple[str, ...] = (),
    ended: dict[str, float] | None = None,
    state: str = "ok",
    label: str = "a",
) -> AgentSample:
    st = w.Stats(label, "e", 1, NOW, 1.0, HOST, "tcp://a:1", list(meshes), [], list(services))
    return AgentSample(
        f"tcp://{label}:1", label, state, NOW, NOW, st, None, [], list(stopped), ended or {}
    )


def snap(*agents: AgentSample, events: tuple[EventRecord, ...] = ()) -> Snapshot:
    return Snapshot(NOW, 10.0, list(agents), list(events))


def svc(healthy: int, desired: int = 2, state: str = "OK") -> _stats.ServiceSummary:
    return _stats.ServiceSummary("scorer", healthy, desired, 1, f"rank is Failed: {KILLED}", state)


def test_all_running_is_healthy() -> None:
    h = judge(snap(agent(mesh("train-0a1b2c3d", rank(0, "Running"), rank(1, "Initializing")))))
    assert (h.state, h.exit_code, h.problems) == ("healthy", 0, [])


def test_a_failed_rank_of_a_live_mesh_is_a_problem() -> None:
    h = judge(snap(agent(mesh("train-0a1b2c3d", rank(0, "Running"), rank(1, "Failed", 1, KILLED)))))
    assert h.exit_code == 1 and h.state == "degraded"
    assert h.problems == [f"train-0a1b2c3d[1] on a is Failed: {KILLED}"]


def test_a_dead_mesh_nobody_stopped_is_a_problem_until_its_owner_stops_it() -> None:
    dead = mesh("solo-0a1b2c3d", rank(0, "Failed", 1, KILLED))
    assert judge(snap(agent(dead))).exit_code == 1
    h = judge(snap(agent(dead, stopped=("solo-0a1b2c3d",))))
    assert h.exit_code == 0 and h.history == {("a", "solo-0a1b2c3d")}


def test_a_mesh_stopped_by_its_owner_is_history() -> None:
    stopped = mesh("train-0a1b2c3d", rank(0, "Stopped"), rank(1, "Stopping"))
    h = judge(snap(agent(stopped)))
    assert h.exit_code == 0 and h.verdicts == {("a", "train-0a1b2c3d"): "history"}


def test_a_service_replica_counts_only_while_it_is_being_replaced() -> None:
    old = mesh("scorer-r0-0a1b2c3d", rank(0, "Failed", 1, KILLED))
    new = mesh("scorer-r0-99887766", rank(0, "Running"))
    other = mesh("scorer-r1-55555555", rank(0, "Running"))
    replacing = judge(snap(agent(old, other, services=(svc(1, state="DEGRADED"),))))
    assert replacing.exit_code == 1
    assert any("service scorer: 1/2" in p for p in replacing.problems)
    healed = judge(snap(agent(old, new, other, services=(svc(2),))))
    assert healed.exit_code == 0, healed.problems
    assert ("a", "scorer-r0-0a1b2c3d") in healed.history
    # The service reports to one agent, its old replica died on another.
    two = judge(snap(agent(old, label="b"), agent(new, other, services=(svc(2),))))
    assert two.exit_code == 0, two.problems


def test_a_dead_generation_superseded_by_a_running_one_is_history() -> None:
    old = mesh("counter-0a1b2c3d", rank(0, "Failed", 1, KILLED))
    new = mesh("counter-99887766", rank(0, "Running"))
    h = judge(snap(agent(old, label="b"), agent(new)))
    assert h.exit_code == 0 and h.history == {("b", "counter-0a1b2c3d")}
    # Another owner's mesh of the same name replaces nothing.
    theirs = mesh("counter-99887766", rank(0, "Running"), owner="someone else")
    assert judge(snap(agent(old, theirs))).exit_code == 1
    # Within one mesh, only a rank's newest generation is judged.
    h = judge(snap(agent(mesh("counter-0a1b2c3d", rank(0, "Running", gen=3)))))
    assert h.exit_code == 0


def test_an_unreachable_agent_exits_2() -> None:
    ok = agent(mesh("train-0a1b2c3d", rank(0, "Running")))
    lost = agent(mesh("x-0a1b2c3d", rank(0, "Running")), state="lost", label="b")
    never = AgentSample("tcp://c:1", "tcp://c:1", "connecting")
    for h in (judge(snap(ok, lost)), judge(snap(ok, never))):
        assert h.exit_code == 2 and h.state == "unreachable"
    assert "agent b (tcp://b:1) is lost" in judge(snap(ok, lost)).problems


def test_ps_and_top_fold_history_and_age_it_out() -> None:
    live = mesh("train-0a1b2c3d", rank(0, "Running"), rank(1, "Running"))
    stopped = mesh("old-11111111", rank(0, "Stopped"), rank(1, "Stopped"))
    older = mesh("older-22222222", rank(0, "Stopped"))
    ended = {"old-11111111": NOW - 60, "older-22222222": NOW - 3600}
    s = snap(agent(live, stopped, older, ended=ended))
    view = derive(s)
    assert [p.mesh for p in view.procs] == ["train-0a1b2c3d"] * 2
    assert view.header.procs_total == 2 and view.header.history == 2  # older aged out
    shown = derive(s, Options(show_history=True))
    assert {p.mesh for p in shown.procs if p.history} == {"old-11111111"}
    kept_long = derive(s, Options(show_history=True, keep=2 * 3600))
    assert {p.mesh for p in kept_long.procs if p.history} == {"old-11111111", "older-22222222"}
    # Seen dead but never stamped (a one-shot ps): never aged out.
    assert derive(snap(agent(live, older))).header.history == 1


def test_the_failed_counter_covers_the_window_only() -> None:
    events = (
        EventRecord(NOW - 3, "a", "Failed", "x-0a1b2c3d", 0, 1, KILLED, -9),
        EventRecord(NOW - 3, "a", "Failed", "x-0a1b2c3d", 0, 1, KILLED, -9),  # heard twice
        EventRecord(NOW - 400, "a", "Failed", "y-0a1b2c3d", 0, 1, KILLED, -9),
        EventRecord(NOW - 2, "a", "Stopped", "z-0a1b2c3d", 0, 1),
    )
    s = snap(agent(mesh("train-0a1b2c3d", rank(0, "Running"))), events=events)
    assert derive(s).header.failed == 1
    assert derive(s, Options(keep=600)).header.failed == 2


def test_top_draws_the_fold_and_h_unfolds_it() -> None:
    live = mesh("train-0a1b2c3d", rank(0, "Running"))
    stopped = mesh("old-11111111", rank(0, "Stopped"), rank(1, "Stopped"))
    s = snap(agent(live, stopped, ended={"old-11111111": NOW - 10}))
    screen = Screen(focus=1)

    def draw() -> str:
        console = Console(record=True, width=100, file=io.StringIO(), color_system=None)
        console.print(render(derive(s, screen.options()), screen, 24))
        return console.export_text()

    out = draw()
    assert "+2 history" in out.splitlines()[0] and "procs 1/1" in out.splitlines()[0]
    assert "2 history rows folded (H shows them)" in out and "old-11111111" not in out
    assert apply_key(screen, "H", derive(s, screen.options()), 10)
    out = draw()
    assert out.count("old-11111111") == 2 and "folded" not in out


def test_find_meshes_takes_the_users_name() -> None:
    s = snap(
        agent(
            mesh("counter-0a1b2c3d", rank(0, "Failed")),
            mesh("counter-99887766", rank(0, "Running")),
            mesh("scorer-r0-11111111", rank(0, "Running")),
            mesh("scorer-r1-22222222", rank(0, "Running")),
            mesh("gone-33333333", rank(0, "Stopped")),
        )
    )
    assert base_name("counter-0a1b2c3d") == "counter"
    assert find_meshes(s, "counter-0a1b2c3d") == ["counter-0a1b2c3d"]  # the full name
    assert find_meshes(s, "counter") == ["counter-99887766"]  # the live one
    assert find_meshes(s, "scorer") == ["scorer-r0-11111111", "scorer-r1-22222222"]
    assert find_meshes(s, "gone") == ["gone-33333333"]
    assert find_meshes(s, "nosuch") == []
