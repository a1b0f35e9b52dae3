"""Mistakes met at run time, on real procs and agents: each is said at once and plainly."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import zmesh
from zmesh._wire import security as _security
from zmesh.testing import AgentProcess

from _helpers import wait_for


class Coded(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code


class Sloppy(zmesh.Actor):
    @zmesh.endpoint
    async def nap(self, seconds: float) -> str:
        time.sleep(seconds)  # the mistake: a blocking call in an async endpoint
        return "slept"

    @zmesh.endpoint
    def fail(self) -> None:
        try:
            raise ValueError("the root")
        except ValueError as root:
            raise Coded(7, "bad input") from root


def test_a_blocking_async_endpoint_is_reported_with_its_name_and_how_long(
    cluster: list[AgentProcess],
) -> None:
    mesh = Sloppy.options().as_actor().get(timeout=60)
    try:
        assert mesh.nap.call_one(1.6).get(timeout=30) == "slept"
        log = Path(mesh.state().ranks[0].log_path)
        wait_for(lambda: "blocked the event loop" in log.read_text(), 10, "the warning")
        line = next(ln for ln in log.read_text().splitlines() if "blocked the event loop" in ln)
        # How long: the tick's lateness, within a tick (0.25 s) of the 1.6 s it slept.
        assert re.search(r"async endpoint Sloppy\.nap blocked the event loop for 1\.[3-7]s", line)
        assert "make it a plain 'def' endpoint" in line
    finally:
        mesh.stop().get(timeout=30)


def test_an_exception_with_a_multi_argument_init_keeps_its_type_and_cause(
    cluster: list[AgentProcess],
) -> None:
    mesh = Sloppy.options().as_actor().get(timeout=60)
    try:
        with pytest.raises(zmesh.ActorError) as info:
            mesh.fail.call_one().get(timeout=30)
        cause = info.value.cause
        assert type(cause) is Coded and cause.code == 7, info.value
        assert isinstance(cause.__cause__, ValueError) and str(cause.__cause__) == "the root"
    finally:
        mesh.stop().get(timeout=30)


def test_a_refused_get_inside_a_running_loop_leaves_no_mesh(
    cluster: list[AgentProcess],
) -> None:
    name = f"refused-{uuid.uuid4().hex[:6]}"

    async def main() -> None:
        with pytest.raises(RuntimeError, match="use 'await'"):
            Sloppy.options(name=name).as_actor().get(timeout=10)
        await asyncio.sleep(1.0)  # time enough for a spawn that went on to show

    asyncio.run(main())
    ps = subprocess.run(
        [sys.executable, "-m", "zmesh", "ps", "--all", "--json",
         "--agents", ",".join(a.control for a in cluster)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ps.returncode == 0, ps.stderr
    assert name not in ps.stdout


def test_a_keyless_client_is_told_at_once_that_a_keyed_agent_needs_keys(
    keyed_agent: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    control, _ = keyed_agent
    monkeypatch.delenv("ZMESH_KEYS", raising=False)
    _security.use(None)
    zmesh.connect([control])
    start = time.monotonic()
    with pytest.raises(zmesh.SecurityError, match="requires CURVE keys") as info:
        Sloppy.options().as_actor().get(timeout=60)
    assert time.monotonic() - start < 5, "said at once, not after a 10 s silence"
    assert "ZMESH_KEYS" in str(info.value)
    # The CLI says the same of a silent keyed agent.
    done = subprocess.run(
        [sys.executable, "-m", "zmesh", "ps", "--agents", control, "--timeout", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "requires CURVE keys" in done.stderr, done.stderr
