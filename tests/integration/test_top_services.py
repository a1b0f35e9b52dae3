"""``zmesh top`` shows each replica of a service, and warns of an endpoint that runs one at a time.

A newcomer's streaming service ran one stream at a time per replica: its
endpoint was not ``concurrent`` while the service let 100 requests in
flight to each replica. Real replicas under concurrent load, top in tmux at
80 x 24, ``top --json`` and ``status``.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_top import Tmux, zmesh_cmd
from test_top_layout import TOP

import zmesh
from zmesh.testing import AgentProcess

from _helpers import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


class Streamer(zmesh.Actor):
    @zmesh.endpoint
    def generate(self, n: int) -> int:
        time.sleep(0.02)  # a sync endpoint: one request at a time in its proc
        return n


class Concurrent(zmesh.Actor):
    @zmesh.endpoint(concurrent=True)
    async def generate(self, n: int) -> int:
        return n


@pytest.fixture
def services(cluster: list[AgentProcess]) -> Iterator[str]:
    """``llm`` (a serial endpoint) and ``fine`` (a concurrent one), 2 replicas each, under load."""
    llm = Streamer.options(replicas=2, name="llm").as_service().get(timeout=60)
    fine = Concurrent.options(replicas=2, name="fine").as_service().get(timeout=60)
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            futs = [svc.generate(i) for svc in (llm, fine) for i in range(8)]
            for f in futs:
                f.get(timeout=30)

    thread = threading.Thread(target=load, name="load", daemon=True)
    thread.start()
    try:
        yield ",".join(a.control for a in cluster)
    finally:
        stop.set()
        thread.join(30)
        llm.stop().get(timeout=30)
        fine.stop().get(timeout=30)


WARNING = "generate is not concurrent: 1 request at a time per replica, not 100"


def test_services_pane_shows_replicas_and_warns_in_a_real_terminal(services: str) -> None:
    agents = services

    # status and --json: the warning on llm alone; each replica with its numbers.
    def reported() -> dict[str, dict[str, Any]] | None:
        done = zmesh_cmd("top", "--agents", agents, "--json")
        assert done.returncode == 0, done.stderr
        found = {s["name"]: s for s in json.loads(done.stdout)["services"]}
        ok = {"llm", "fine"} <= set(found) and all(
            len(s["replicas"]) == 2 and all(r["calls"] for r in s["replicas"])
            for s in found.values()
        )
        return found if ok else None

    found = wait_for(reported, 60, "both services with their replicas in top --json", 0.5)
    assert found["llm"]["warning"] == WARNING and found["fine"]["warning"] == "", found
    for r in found["llm"]["replicas"]:
        assert r["state"] == "HEALTHY" and r["generation"] == 1 and r["mesh"].startswith("llm-r")
    status = zmesh_cmd("status", "--agents", agents)
    assert status.returncode == 0, status.stdout + status.stderr  # a warning, not a problem
    assert f"warning: service llm: {WARNING}" in status.stdout, status.stdout
    assert "service fine" not in status.stdout

    tmux = Tmux()
    try:
        pane = tmux.start([*TOP, "--agents", agents], 80, 24)
        wait_for(lambda: "services 2 ok" in tmux.screen(), 30, "the first frame")

        def replicas(s: str) -> bool:
            return s.count("llm-r") == 2 and s.count("fine-r") == 2 and "! llm:" in s

        tmux.press("4", replicas, 20, "the services pane with every replica")
        screen = tmux.screen()
        assert all(len(ln) <= 80 for ln in screen.splitlines()), screen
        head = next(ln for ln in screen.splitlines() if ln.startswith("service "))
        assert head.split()[:9] == (
            "service replicas state gen rst inflight queue calls/s p50".split()
        ), screen
        rows = [ln.split() for ln in screen.splitlines() if ln.strip().startswith("llm-r")]
        assert len(rows) == 2, screen
        for row in rows:
            assert row[2:5] == ["HEALTHY", "1", "0"], screen
            assert row[8].endswith(("µs", "ms")), screen  # p50 keeps its unit
        assert WARNING in screen and "! fine:" not in screen, screen
        tmux.quit(pane)
    finally:
        tmux.close()
