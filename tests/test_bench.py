"""tools/bench.py runs end to end and writes the JSON it promises (no timing checks)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tools" / "bench.py"

PAIRED = [  # zmesh and raw, with a ratio
    "call_one_p50_us",
    "call_one_p99_us",
    "call_one_get_p50_us",
    "call_one_get_p99_us",
    "pipelined_per_s",
    "bulk_1mib_gbps",
    "bulk_1mib_view_gbps",
    *(f"call_fanout{n}_p50_us" for n in (4, 16, 64)),
    *(f"call_fanout{n}_cpu_us" for n in (4, 16, 64)),
]
ZMESH_ONLY = [
    *(f"broadcast_fanout{n}_p50_us" for n in (4, 16, 64)),
    "cold_import_s",
    "cold_main_to_first_reply_s",
    "cold_total_wall_s",
    "rss_proc_idle_mb",
    "rss_agent_idle_mb",
    "call_actors8x32_p50_us",  # several actors per proc
    "call_actors2x32_p50_us",
]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_quick_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "ZMESH_AGENTS"}
    proc = subprocess.run(
        # One round: what is checked here is the report, not the numbers.
        [sys.executable, str(BENCH), "--quick", "--rounds", "1", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "zmesh vs raw pyzmq" in proc.stdout
    assert "targets" in proc.stdout

    report = json.loads(out.read_text())
    assert report["mode"] == "quick"
    for key in ("nproc", "python", "pyzmq", "libzmq"):
        assert key in report["machine"]
    results = report["results"]
    for key in PAIRED:
        assert {"zmesh", "raw", "ratio"} <= results[key].keys(), key
        assert math.isfinite(results[key]["zmesh"]) and results[key]["zmesh"] > 0, key
        assert math.isfinite(results[key]["raw"]) and results[key]["raw"] > 0, key
    for key in ZMESH_ONLY:
        assert results[key]["zmesh"] > 0, key
    names = {t["name"] for t in report["targets"]}
    assert {"call_one p50 vs raw", "pipelined vs raw", "1 MiB GB/s vs raw (memoryview, zero-copy)",
            "fan-out call to 64 p50", "cold start (main -> first reply)",
            "idle proc RSS", "agent RSS", "spawn 64 procs, warm agent"} <= names  # fmt: skip
    assert all(isinstance(t["met"], bool) for t in report["targets"])
    http = report["http"]  # the zmesh http rows (tools/bench_http.py)
    for key in ("http_p50_us", "http_per_s", "sse_items_per_s", "direct_p50_us", "healthz_p50_us"):
        assert math.isfinite(http[key]) and http[key] > 0, key
    assert "zmesh http" in proc.stdout
    if "skipped" in report["ray"]:
        assert "ray not installed" in proc.stdout or "skipped" in proc.stdout
    else:
        assert {"ray_lat_p50_us", "ray_pipelined_per_s"} <= results.keys()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_rows_runs_only_the_rows_asked_for(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "ZMESH_AGENTS"}
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--sync-only", "--rounds", "2", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["rows"] == ["sync"]
    row = report["results"]["sync_endpoint_p50_us"]
    assert row["zmesh"] > 0 and row["base"] > 0 and row["ratio_vs_base"] > 0
    assert len(report["rounds"]["sync_ep_ratio"]) == 2
    assert "call_one_p50_us" not in report["results"]  # the rows left out are not run
    assert [t["name"] for t in report["targets"]] == ["def endpoint call_one p50 vs async def"]
    bad = subprocess.run(
        [sys.executable, str(BENCH), "--rows", "nope"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "unknown rows" in bad.stderr
