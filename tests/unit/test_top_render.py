"""``zmesh top``'s view and rendering, on fixed snapshots, with a recorded console."""

from __future__ import annotations

import io

import msgspec
from rich.console import Console

from zmesh._shared import stats as _stats
from zmesh._shared.state import Status
from zmesh._wire import messages as w
from zmesh.top._app import apply_key, parse_keys
from zmesh.top._collect import AgentSample, EventRecord, Snapshot
from zmesh.top._render import Screen, render
from zmesh.top._view import Options, derive, sort_rows, unhealthy

NOW = 1_700_000_000.0
HOST = _stats.HostStatistics("box", 1, 100.0, 8, 25.0, 16 << 30, 4 << 30, [0.5, 0.4, 0.3])


def hist(bucket: int, n: int) -> list[int]:
    h = [0] * _stats.BUCKETS
    h[bucket] = n
    return h


def proc(
    mesh: str, rank: int, t: float, eps: dict[str, tuple[int, int, int]], actor: str = "counter"
) -> _stats.ProcStatistics:
    """``eps``: endpoint -> (calls, errors, latency bucket)."""
    endpoints = [
        _stats.EndpointStatistics(name, c, e, 0, 0, 0, hist(b, c))
        for name, (c, e, b) in eps.items()
    ]
    actors = [_stats.ActorStatistics(actor, "Counter", 0, 0, endpoints)]
    return _stats.ProcStatistics(mesh, rank, 1, 1000 + rank, t, 12.0, 30 << 20, 60.0, 0, 0, actors)


def agent_stats(
    label: str, t: float, procs: list[_stats.ProcStatistics], failed: tuple[int, ...] = ()
) -> w.Stats:
    meshes: dict[str, list[w.RankState]] = {}
    for p in procs:
        meshes.setdefault(p.mesh, []).append(w.RankState(p.rank, Status.RUNNING, 1, pid=p.pid))
    for r in failed:
        meshes.setdefault("train", []).append(
            w.RankState(r, Status.FAILED, 1, "killed by SIGKILL", exit_code=-9)
        )
    states = [w.MeshReport(name, "me", Status.RUNNING, ranks) for name, ranks in meshes.items()]
    return w.Stats(label, "e1", 3, t, 1.0, HOST, f"tcp://{label}:1", states, procs)


def snapshot(age: float = 0.2, lost: bool = False) -> Snapshot:
    """Two agents; 10 s between samples; ``train`` rank 3 failed on host b."""
    base_a = agent_stats(
        "a", NOW - 10, [proc("train", 0, NOW - 10, {"step": (100, 0, 10), "eval": (0, 0, 0)})]
    )
    new_a = agent_stats(
        "a", NOW, [proc("train", 0, NOW, {"step": (600, 0, 10), "eval": (50, 0, 12)})]
    )
    base_b = agent_stats("b", NOW - 10, [proc("train", 1, NOW - 10, {"step": (0, 0, 10)})])
    new_b = agent_stats(
        "b",
        NOW,
        [proc("train", 1, NOW, {"step": (500, 20, 14)}), proc("serve", 0, NOW, {"get": (0, 0, 0)})],
        failed=(3,),
    )
    gone = [proc("train", 3, NOW - 5, {"step": (5, 0, 10)})]
    agents = [
        AgentSample("tcp://a:1", "a", "ok", NOW - 0.1, NOW - 0.2, new_a, base_a),
        AgentSample(
            "tcp://b:1", "b", "lost" if lost else "ok", NOW - age, NOW - age, new_b, base_b, gone
        ),
    ]
    events = [
        EventRecord(NOW - 3, "b", "Failed", "train", 3, 1, "killed by SIGKILL", -9),
        EventRecord(NOW - 30, "a", "Initializing", "train", 0, 1),
    ]
    return Snapshot(NOW, 10.0, agents, events)


def draw(
    snap: Snapshot,
    screen: Screen | None = None,
    width: int = 100,
    height: int | None = None,
    opts: Options | None = None,
) -> str:
    screen = screen or Screen()
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    console.print(render(derive(snap, opts or screen.options()), screen, height))
    return console.export_text()


def line_with(text: str, word: str) -> str:
    return next(ln for ln in text.splitlines() if word in ln)


def test_rates_and_percentiles_come_from_the_window() -> None:
    view = derive(snapshot())
    total, *rows = view.endpoints
    by = {r.key: r for r in rows}
    step = by[("train", "counter", "step")]
    assert step.calls == 100.0  # (600 - 100) / 10 s on a, plus (500 - 0) / 10 s on b
    assert step.errors == 2.0
    assert step.ranks == 2
    assert total.actor == "Total" and total.calls == 105.0 and total.errors == 2.0
    lo, _hi = _stats.bucket_bounds(10)
    assert step.p50 is not None and lo <= step.p50 <= _stats.bucket_bounds(14)[1]
    assert view.header.calls == 105.0
    assert view.header.actors_alive == 3 and view.header.failed == 1


def test_columns_are_present_and_in_order() -> None:
    out = draw(snapshot())
    for pane_header, cols in [
        ("address", ["host", "address", "procs", "cpu", "mem", "load", "seen", "state"]),
        (
            "pid",
            ["host", "mesh", "rank", "pid", "state", "cpu", "rss", "rst", "up", "exit"],
        ),
        ("endpoint", ["actor", "endpoint", "calls/s", "p50", "p99", "err/s", "inflight", "queue"]),
        (
            "replicas",
            ["service", "replicas", "state", "gen", "rst", "inflight", "queue", "calls/s", "p50"],
        ),
    ]:
        ln = line_with(out, pane_header)
        positions = [ln.index(c) for c in cols]
        assert positions == sorted(positions), (cols, ln)


def test_total_row_is_first_and_sums_the_rows() -> None:
    out = draw(snapshot())
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if "calls/s" in ln and "endpoint" in ln)
    assert lines[head + 2].split()[:2] == ["Total", "105.0"]
    assert "counter" in lines[head + 3]


def test_header_counts_and_failed_rank() -> None:
    out = draw(snapshot())
    first = out.splitlines()[0]
    assert "agents 2/2" in first and "procs 3/4" in first and "+1 failed" in first
    assert "calls/s 105.0" in out and "err/s 2.00" in out and "over 10s" in out
    assert "STALE" not in out
    failed = line_with(draw(snapshot(), width=120), "killed by SIGKILL")
    assert "Failed" in failed and "train" in failed
    assert "exited code=-9 on b: killed by SIGKILL" in out


def test_stale_marker_when_data_is_older_than_three_intervals() -> None:
    out = draw(snapshot(age=3.5))
    assert "STALE" in out.splitlines()[1]
    assert "STALE" in line_with(out, "tcp://b:1")
    assert "STALE" not in draw(snapshot(age=2.5)).splitlines()[1]
    lost = draw(snapshot(lost=True))
    assert "lost" in line_with(lost, "tcp://b:1") and "STALE" in lost


def test_errors_only_keeps_what_is_wrong() -> None:
    view = derive(snapshot(), Options(errors_only=True))
    assert [r.key for r in view.endpoints[1:]] == [("train", "counter", "step")]
    assert [(p.mesh, p.rank) for p in view.procs] == [("train", 3)]
    assert [e.kind for e in view.events] == ["Failed"]
    out = draw(snapshot(), Screen(errors_only=True))
    assert "errors-only" in out and "eval" not in out


def test_filter_matches_names() -> None:
    view = derive(snapshot(), Options(filter="SERVE"))
    assert [r.key for r in view.endpoints[1:]] == [("serve", "counter", "get")]
    assert [p.mesh for p in view.procs] == ["serve"]


def test_sort_is_stable_with_a_name_tie_break() -> None:
    view = derive(snapshot())
    rows = view.endpoints[1:]
    # All have in_flight 0: sorting by it keeps name order, whatever came first.
    col = 5
    once = sort_rows(rows, "actors", col)
    assert [r.key for r in once] == sorted(r.key for r in rows)
    assert [r.key for r in sort_rows(list(reversed(rows)), "actors", col)] == [r.key for r in once]
    by_calls = [r.key for r in sort_rows(rows, "actors", 1)]
    assert by_calls[0] == ("train", "counter", "step")
    assert by_calls[1:] == [("serve", "counter", "get"), ("train", "counter", "eval")][::-1] or (
        by_calls[1:] == [("train", "counter", "eval"), ("serve", "counter", "get")]
    )
    out = draw(snapshot(), Screen(sort={"actors": 1}))
    assert "calls/s▼" in out


def test_interactive_frame_fits_80x24() -> None:
    for focus in range(5):
        out = draw(snapshot(), Screen(focus=focus), width=80, height=24)
        lines = out.rstrip("\n").split("\n")
        assert len(lines) == 24, (focus, len(lines), out)
        assert all(len(ln) <= 80 for ln in lines)
        assert "q quit" in lines[-1]


def test_help_and_filter_prompt() -> None:
    assert "widen / narrow" in draw(snapshot(), Screen(help=True), width=80, height=24)
    out = draw(snapshot(), Screen(editing=True, filter="tra"), width=80, height=24)
    assert "filter: tra" in out.splitlines()[-1]


def test_keys_change_the_screen() -> None:
    view = derive(snapshot())
    screen = Screen()
    keys = list(parse_keys(b"\x1b[Bj\tk/se\x7frv\re>< +-?x"))
    assert keys[:4] == ["down", "j", "tab", "k"]
    for k in keys:
        assert apply_key(screen, k, view, 10)
    assert screen.focus == 3 and screen.filter == "srv" and not screen.editing
    assert screen.errors_only and screen.paused and not screen.help
    assert screen.sort == {"services": 0} and screen.window == 10.0
    assert not apply_key(screen, "q", view, 10)


def test_status_is_unhealthy_with_a_failed_rank_or_a_lost_agent() -> None:
    assert any("train[3]" in p and "Failed" in p for p in unhealthy(snapshot()))
    healthy = Snapshot(NOW, 10.0, [snapshot().agents[0]])
    assert unhealthy(healthy) == []
    assert any("lost" in p for p in unhealthy(snapshot(lost=True)))


def _batched(t: float, calls: int, batches: int) -> _stats.ProcStatistics:
    embed = _stats.EndpointStatistics(
        "embed", calls, 0, 0, 0, 0, hist(10, calls), batches=batches, batched=calls
    )
    actors = [_stats.ActorStatistics("embedder", "Embedder", 0, 0, [embed])]
    return _stats.ProcStatistics("emb", 0, 1, 77, t, 1.0, 30 << 20, 60.0, 0, 0, actors)


def test_batched_endpoints_show_their_batches_and_mean_batch_size() -> None:
    # 10 s apart: 96 more calls in 12 more batches -> a mean batch of 8 over the window.
    base = agent_stats("a", NOW - 10, [_batched(NOW - 10, 32, 8)])
    new = agent_stats("a", NOW, [_batched(NOW, 128, 20)])
    snap = Snapshot(NOW, 10.0, [AgentSample("tcp://a:1", "a", "ok", NOW, NOW, new, base)], [])
    total, row = derive(snap).endpoints
    assert (row.batches_total, row.mean_batch) == (20, 8.0)
    assert total.batches_total == 20
    plain = derive(snapshot()).endpoints[1]
    assert (plain.batches_total, plain.mean_batch) == (0, None)
    assert "batches" not in draw(snapshot())  # no batched endpoint: no batching columns
    out = draw(snap, width=120)
    head = line_with(out, "endpoint")
    cols = ["calls/s", "inflight", "queue", "batches", "batch"]
    assert [head.index(c) for c in cols] == sorted(head.index(c) for c in cols), head
    assert line_with(out, "emb/embedder").split()[-2:] == ["20", "8.0"]
    sorted_by_batch = derive(snap, Options(sort={"actors": 8})).endpoints
    assert sorted_by_batch[1].endpoint == "embed"


def test_two_services_of_one_name_are_two_rows_in_top_and_in_the_agent() -> None:
    from zmesh._host.agent.statsbook import StatsBook

    book = StatsBook()
    for sid, healthy in [("embedder-aaa", 2), ("embedder-bbb", 1)]:
        book.record_service(_stats.ServiceSummary("embedder", healthy, 2, id=sid))
    _, services = book.current([])
    assert sorted(s.id for s in services) == ["embedder-aaa", "embedder-bbb"]
    stats = msgspec.structs.replace(agent_stats("a", NOW, []), services=services)
    snap = Snapshot(NOW, 10.0, [AgentSample("tcp://a:1", "a", "ok", NOW, NOW, stats, None)], [])
    rows = derive(snap).services
    assert sorted((r.name, r.id, r.healthy) for r in rows) == [
        ("embedder", "embedder-aaa", 2),
        ("embedder", "embedder-bbb", 1),
    ]
    assert derive(snap).header.services_degraded == 1


LONG = "a-very-long-mesh-name-for-embedding-service-9f3e2a1b"


def _long_named() -> Snapshot:
    """One proc of a long-named mesh on a long-named host, a 7-digit pid, slow calls."""

    def one(t: float, calls: int) -> _stats.ProcStatistics:
        ep = _stats.EndpointStatistics(
            "generate_streaming_tokens", calls, 12, 4, 3, 0, hist(20, calls)
        )
        actors = [_stats.ActorStatistics("embedder_actor", "E", 3, 0, [ep])]
        return _stats.ProcStatistics(
            LONG, 0, 1, 4194301, t, 12.0, 300 << 20, 108000.0, 0, 0, actors
        )

    label = "worker-node-long-label-07"
    new, base = (
        agent_stats(label, NOW, [one(NOW, 5000)]),
        agent_stats(label, NOW - 10, [one(NOW - 10, 10)]),
    )
    sample = AgentSample("tcp://192.168.100.200:47411", label, "ok", NOW, NOW, new, base)
    return Snapshot(NOW, 10.0, [sample], [])


def test_an_80x24_frame_keeps_units_pids_and_every_column_with_long_names() -> None:
    for focus, heads in [(0, "host address procs cpu mem load seen state"),
                         (1, "host mesh rank pid state cpu rss rst up exit"),
                         (2, "actor endpoint calls/s p50 p99 err/s inflight queue")]:  # fmt: skip
        out = draw(_long_named(), Screen(focus=focus), width=80, height=24)
        lines = out.rstrip("\n").split("\n")
        assert len(lines) == 24 and all(len(ln) <= 80 for ln in lines), out
        head = lines[next(n for n, ln in enumerate(lines) if ln.startswith("────")) - 1]
        assert head.split() == heads.split(), out  # every column, none cut
        if focus == 1:
            row = line_with(out, "4194301").split()  # the pid whole
            assert row[1].startswith("a-very-") and row[1].endswith("9f3e2a1b") and "…" in row[1]
            assert row[2:] == ["0", "4194301", "Running", "12%", "300M", "0", "1d06h"], row
        if focus == 2:
            row = line_with(out, "a-very-").split()
            assert row[-6:] == ["499.0", "805.3ms", "1.07s", "0", "4", "3"], row  # units kept
            assert row[1].startswith("generate") and "…" in row[0] + row[1]


def test_a_200x50_frame_shows_long_names_whole() -> None:
    out = draw(_long_named(), Screen(focus=2), width=200, height=50)
    assert all(len(ln) <= 200 for ln in out.splitlines())
    row = line_with(out, LONG).split()
    assert row[:2] == [f"{LONG}/embedder_actor", "generate_streaming_tokens"], row
    out = draw(_long_named(), Screen(focus=1), width=200, height=50)
    assert "worker-node-long-label-07" in out and "…" not in line_with(out, LONG)


def _service_snapshot(
    max_concurrent: int = 100, serial: tuple[str, ...] = ("generate",)
) -> Snapshot:
    """A 2-replica ``llm`` service (replica 1 restarted once); each proc runs 1, queues 3."""
    from zmesh._client.calls.runtime import ProcRef
    from zmesh._service.client import TableRow, encode_table

    meshes = ["llm-r0-6e850f69", "llm-r1-0fa30381"]

    def one(mesh: str, t: float, calls: int) -> _stats.ProcStatistics:
        ep = _stats.EndpointStatistics("generate", calls, 0, 1, 3, 0, hist(16, calls))
        actors = [_stats.ActorStatistics("llm", "Llm", 3, 3, [ep])]
        return _stats.ProcStatistics(mesh, 0, 1, 4100, t, 5.0, 30 << 20, 60.0, 0, 0, actors)

    table = [
        TableRow(i, 1 + i, "HEALTHY", "llm", [ProcRef(m, 0, 1 + i, "tcp://x:1", "tcp://a:1", "a")],
                 restarts=i, last_failure="killed by SIGKILL" if i else "")
        for i, m in enumerate(meshes)
    ]  # fmt: skip
    summary = _stats.ServiceSummary(
        "llm", 2, 2, 1, "killed by SIGKILL", "OK", "llm-1", encode_table(table),
        max_concurrent=max_concurrent, serial=list(serial),
    )  # fmt: skip
    new = agent_stats("a", NOW, [one(m, NOW, 200) for m in meshes])
    new = msgspec.structs.replace(new, services=[summary])
    base = agent_stats("a", NOW - 10, [one(m, NOW - 10, 10) for m in meshes])
    return Snapshot(NOW, 10.0, [AgentSample("tcp://a:1", "a", "ok", NOW, NOW, new, base)], [])


def test_services_pane_shows_each_replica_and_warns_of_a_serial_endpoint() -> None:
    (svc,) = derive(_service_snapshot()).services
    assert [(r.index, r.generation, r.in_flight, r.queue) for r in svc.replicas] == [
        (0, 1, 1, 3),
        (1, 2, 1, 3),
    ]
    assert svc.replicas[0].calls == 19.0 and svc.replicas[0].p50 is not None
    assert "generate is not concurrent" in svc.warning and "not 100" in svc.warning
    for width, height in [(80, 24), (200, 50)]:
        out = draw(_service_snapshot(), Screen(focus=3), width=width, height=height)
        lines = out.rstrip("\n").split("\n")
        assert len(lines) == height and all(len(ln) <= width for ln in lines), out
        assert line_with(out, "llm ").split()[:3] == ["llm", "2/2", "OK"], out
        for i, mesh in enumerate(["llm-r0-6e850f69", "llm-r1-0fa30381"]):
            row = line_with(out, mesh).split()
            assert row[:8] == [mesh, "a", "HEALTHY", str(1 + i), str(i), "1", "3", "19.0"], out
            assert row[8].endswith("ms"), out  # p50, with its unit
        warning = line_with(out, "! llm:")
        assert "generate is not concurrent: 1 request at a time per replica, not 100" in warning
    # Nothing to warn of: one request at a time allowed, or every endpoint concurrent.
    for snap in (_service_snapshot(max_concurrent=1), _service_snapshot(serial=())):
        assert derive(snap).services[0].warning == ""
        assert "!" not in draw(snap, Screen(focus=3), width=80, height=24)


def test_enter_on_a_replica_row_shows_that_replica() -> None:
    from zmesh.top._actions import open_detail

    view = derive(_service_snapshot())
    screen = Screen(focus=3)
    screen.selected["services"] = 2  # llm, its replica 0, its replica 1
    open_detail(view, screen)
    assert screen.stack is not None
    assert "mesh         llm-r1-0fa30381" in screen.stack and "generation   2" in screen.stack
    screen = Screen(focus=3)
    open_detail(view, screen)  # the service's row: its replicas by name, on one line
    assert screen.stack is not None
    assert "replicas     llm-r0-6e850f69, llm-r1-0fa30381" in screen.stack


def test_sorting_services_by_restarts_marks_that_column() -> None:
    out = draw(_service_snapshot(), Screen(focus=3, sort={"services": 1}), width=80, height=24)
    assert "rst▼" in out, out
