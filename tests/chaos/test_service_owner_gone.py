"""A service whose maker is killed fails the calls of other processes at once.

A (non-detached) service's supervisor lives in the process that made it.
When that process gets SIGKILL its agent stops the replicas, and nothing will
ever start new ones: another process calling the service through its handle
must not wait for a recovery that cannot come. Its calls in flight, its
sessions, its fan-outs (calls and streams), and the calls it makes
afterwards (with a timeout or without) fail promptly with ``ServiceError``
naming the service and saying that its maker is gone. Real processes, a
real SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import zmesh
from zmesh.testing import local_cluster

from _helpers import end_child, read_line, wait_gone

pytestmark = [pytest.mark.chaos, pytest.mark.stress, pytest.mark.slow]

IN_FLIGHT = 150  # calls in flight when the owner dies (over 2 replicas)
BUDGET = 30.0  # each call's timeout: far past what the test allows
PROMPT = 5.0  # how soon after the SIGKILL every call must have failed (a loaded machine)

OWNER = """
import pickle, sys
import zmesh
from _actors import Napper

svc = Napper.options(replicas=2).as_service().get(timeout=60)
pids = [svc.replica(i).pid.call_one().get(timeout=30) for i in range(2)]
with open(sys.argv[1], "wb") as f:
    pickle.dump((svc, pids), f)
print("ready", flush=True)
sys.stdin.readline()  # until killed
"""


async def _awaited(fut: Any) -> Any:
    return await fut


def _owner_gone(exc: BaseException | None) -> bool:
    return (
        isinstance(exc, zmesh.ServiceError)
        and "process that made it is gone" in str(exc)
        and exc.mesh == "napper"
    )


@pytest.mark.anyio
async def test_calls_fail_promptly_when_the_services_maker_is_killed(tmp_path: Path) -> None:
    script, handle = tmp_path / "owner.py", tmp_path / "handle"
    script.write_text(OWNER)
    with local_cluster(1) as agents:
        env = dict(os.environ, ZMESH_AGENTS=agents[0].control,
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # fmt: skip
        owner = subprocess.Popen(
            [sys.executable, str(script), str(handle)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            await asyncio.to_thread(read_line, owner, 60)
            svc, pids = pickle.loads(handle.read_bytes())
            assert len(await svc.pid.options(timeout=10).call()) == 2  # it serves here
            nap = svc.nap.options(timeout=BUDGET)
            calls = {f"call{k}": asyncio.ensure_future(_awaited(nap(BUDGET)))
                     for k in range(IN_FLIGHT)}  # fmt: skip

            async def in_session() -> Any:
                async with svc.session():
                    await svc.pid.options(timeout=BUDGET)()
                    return await nap(BUDGET)

            calls["session"] = asyncio.ensure_future(in_session())
            calls["fanout"] = asyncio.ensure_future(_awaited(nap.call(BUDGET)))

            async def fanout_stream() -> list[Any]:
                return [v async for v in nap.stream(BUDGET)]

            calls["fanout_stream"] = asyncio.ensure_future(fanout_stream())
            deadline = time.monotonic() + 20
            while sum(r.in_flight for r in svc.statistics().replicas) < IN_FLIGHT:
                assert time.monotonic() < deadline, "the calls never got under way"
                await asyncio.sleep(0.02)

            owner.kill()  # SIGKILL: its supervisor dies with it
            t0 = time.monotonic()
            _, late = await asyncio.wait(calls.values(), timeout=PROMPT)
            hung = [k for k, f in calls.items() if f in late]
            assert not hung, f"pending {PROMPT}s after the owner died: {hung[:5]} ({len(hung)})"
            wrong = {k: f.exception() for k, f in calls.items() if not _owner_gone(f.exception())}
            assert not wrong, f"not the owner-gone ServiceError: {dict(list(wrong.items())[:3])}"
            print(f"{len(calls)} calls failed within {time.monotonic() - t0:.2f}s of the SIGKILL")
            assert svc.statistics().state == "DOWN"

            # Calls made afterwards fail at once, without a timeout too.
            for made in (lambda: svc.nap(1.0), lambda: nap(1.0), lambda: nap.call(1.0),
                         lambda: fanout_stream()):  # fmt: skip
                t1 = time.monotonic()
                with pytest.raises(zmesh.ServiceError, match="process that made it is gone"):
                    await asyncio.wait_for(_awaited(made()), PROMPT)
                assert time.monotonic() - t1 < PROMPT
            await asyncio.to_thread(wait_gone, pids, 10, "the dead owner's replicas")
        finally:
            owner.kill()
            end_child(owner, 10)
