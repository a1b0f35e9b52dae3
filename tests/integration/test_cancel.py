"""Cancelling a call reaches the actor (zmesh._client.calls.cancels, zmesh._host.proc.cancelling).

``Future.cancel()``, cancelling the task that awaits a call, and Ctrl+C in
``.get()`` each tell the proc: a queued call never runs, an ``async``
endpoint is cancelled where it awaits, and a sync one runs to its end with
its result dropped. A call that then times out behind a busy actor says why.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zmesh
from zmesh._client.calls.synccall import SyncCall

from _helpers import wait_for


class Napper(zmesh.Actor):
    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.finished: list[str] = []
        self.sync_ended = 0

    @zmesh.endpoint
    async def nap(self, seconds: float, tag: str = "") -> str:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled.append(tag)
            raise
        self.finished.append(tag)
        return tag

    @zmesh.endpoint
    def block(self, seconds: float) -> float:
        time.sleep(seconds)
        self.sync_ended += 1
        return seconds

    @zmesh.endpoint
    def steps(self, n: int) -> int:
        for step in range(n):  # a sync endpoint that looks between its steps
            if zmesh.call_cancelled():
                self.cancelled.append(f"steps at {step}")
                return step
            time.sleep(0.01)
        return n

    @zmesh.endpoint
    async def seen(self) -> dict[str, Any]:
        return {"cancelled": self.cancelled, "finished": self.finished, "sync": self.sync_ended}


@pytest.fixture
def napper() -> Iterator[zmesh.ActorMesh[Napper]]:
    mesh = Napper.options().as_actor().get(timeout=60)
    yield mesh
    mesh.stop().get(timeout=30)


def test_future_cancel_cancels_a_running_async_endpoint(napper: zmesh.ActorMesh[Napper]) -> None:
    napper.seen.call_one().get(timeout=10)  # connected: the next calls take the lane
    fut = napper.nap.call_one(60, "long")
    time.sleep(0.2)  # (the nap under way in its proc; cancelled or queued, it must not run)
    assert fut.cancel() is True
    with pytest.raises(concurrent.futures.CancelledError):
        fut.get(timeout=5)
    assert fut.cancel() is False  # done already
    # The actor is free at once: the next call is not queued behind 60 s.
    wait_for(
        lambda: napper.seen.call_one().get(timeout=5)["cancelled"] == ["long"], 5,
        "the endpoint to see CancelledError",
    )  # fmt: skip
    assert napper.nap.call_one(0, "after").get(timeout=5) == "after"


def test_cancelling_the_awaiting_task_reaches_the_actor(napper: zmesh.ActorMesh[Napper]) -> None:
    async def main() -> dict[str, Any]:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(napper.nap.call_one(60, "awaited"), 0.5)
        # choose() takes the same road from async code.
        task = asyncio.ensure_future(napper.nap.choose(60, "chosen"))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        t0 = time.monotonic()
        assert await napper.nap.call_one(0, "next") == "next"
        assert time.monotonic() - t0 < 5
        return await napper.seen.call_one()

    state = asyncio.run(main())
    assert state["cancelled"] == ["awaited", "chosen"]
    assert state["finished"] == ["next"]


def test_a_queued_call_that_is_cancelled_never_runs(napper: zmesh.ActorMesh[Napper]) -> None:
    napper.seen.call_one().get(timeout=10)
    first = napper.nap.call_one(1.0, "first")
    queued = napper.nap.call_one(0, "queued")  # behind "first" in the mailbox
    time.sleep(0.2)
    assert queued.cancel()
    assert first.get(timeout=10) == "first"
    state = napper.seen.call_one().get(timeout=10)
    assert state["finished"] == ["first"] and state["cancelled"] == []


def test_a_call_from_a_thread_on_the_io_path_is_cancelled_too(
    napper: zmesh.ActorMesh[Napper],
) -> None:
    napper.seen.call_one().get(timeout=10)
    # block=False takes the runtime's I/O thread, not the thread's own lane.
    fut = napper.nap.options(block=False).call_one(60, "io")
    assert not isinstance(fut, SyncCall)
    time.sleep(0.3)
    assert fut.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        fut.get(timeout=5)
    wait_for(
        lambda: napper.seen.call_one().get(timeout=5)["cancelled"] == ["io"], 5,
        "the endpoint to see CancelledError",
    )  # fmt: skip


def test_a_cancelled_sync_endpoint_runs_on_and_a_timeout_behind_it_says_so(
    napper: zmesh.ActorMesh[Napper],
) -> None:
    napper.seen.call_one().get(timeout=10)
    fut = napper.block.call_one(2.0)
    time.sleep(0.2)
    assert fut.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        fut.get(timeout=1)
    # The thread cannot be stopped: the actor is busy until it returns, and
    # a call that times out behind it says why.
    with pytest.raises(zmesh.CallTimeoutError) as info:
        napper.seen.options(timeout=0.5).call_one().get()
    text = str(info.value)
    assert "cancelled" in text and "sync endpoint runs to its end" in text, text
    wait_for(lambda: napper.seen.call_one().get(timeout=5)["sync"] == 1, 10, "the block to end")


def test_a_timeout_behind_a_busy_actor_says_what_it_waits_behind(
    napper: zmesh.ActorMesh[Napper],
) -> None:
    async def main() -> str:
        slow = napper.nap.call_one(2.0, "slow")  # no timeout: still pending
        with pytest.raises(zmesh.CallTimeoutError) as info:
            await napper.seen.options(timeout=0.5).call_one()
        await slow
        return str(info.value)

    text = asyncio.run(main())
    assert "queued behind 1 earlier call(s)" in text, text


def test_ctrl_c_in_get_cancels_the_remote_call(tmp_path: Path) -> None:
    script = tmp_path / "interrupted.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio, signal, sys
            import zmesh

            signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal

            class Napper(zmesh.Actor):
                def __init__(self):
                    self.cancelled = 0

                @zmesh.endpoint
                async def nap(self, seconds: float) -> None:
                    try:
                        await asyncio.sleep(seconds)
                    except asyncio.CancelledError:
                        self.cancelled += 1
                        raise

                @zmesh.endpoint
                async def count(self) -> int:
                    return self.cancelled

            a = Napper.options().as_actor().get(timeout=60)
            a.count.call_one().get(timeout=30)
            print("calling", flush=True)
            try:
                a.nap.call_one(60).get()
            except KeyboardInterrupt:
                print("interrupted", flush=True)
            print("cancelled", a.count.options(timeout=10).call_one().get(), flush=True)
            """
        )
    )
    p = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "calling"
        time.sleep(0.5)  # into .get()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()
    assert p.returncode == 0, err
    assert out.split("\n")[:2] == ["interrupted", "cancelled 1"], (out, err)


def test_cancel_from_another_thread_wakes_a_blocked_get(napper: zmesh.ActorMesh[Napper]) -> None:
    napper.seen.call_one().get(timeout=10)
    fut = napper.nap.call_one(60, "other-thread")
    threading.Timer(0.3, fut.cancel).start()
    t0 = time.monotonic()
    with pytest.raises(concurrent.futures.CancelledError):
        fut.get(timeout=10)
    assert time.monotonic() - t0 < 5


def test_cancel_reaches_one_actor_of_several_in_a_proc() -> None:
    mesh = Napper.options(procs=1, actors_per_proc=2).as_actor().get(timeout=60)
    try:
        second = mesh.slice(actors=1)
        second.seen.call_one().get(timeout=10)

        async def main() -> None:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(second.nap.call_one(60, "async"), 0.5)

        asyncio.run(main())
        fut = second.nap.options(block=False).call_one(60, "thread")  # the I/O path
        time.sleep(0.3)
        assert fut.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            fut.get(timeout=5)
        wait_for(
            lambda: second.seen.call_one().get(timeout=5)["cancelled"] == ["async", "thread"], 10,
            "both naps to see CancelledError",
        )  # fmt: skip
        assert mesh.slice(actors=0).seen.call_one().get(timeout=5)["cancelled"] == []
    finally:
        mesh.stop().get(timeout=30)


def test_a_sync_endpoint_that_checks_call_cancelled_ends_early(
    napper: zmesh.ActorMesh[Napper],
) -> None:
    assert zmesh.call_cancelled() is False  # outside any endpoint
    napper.seen.call_one().get(timeout=10)
    fut = napper.steps.call_one(6000)  # 60 s of steps
    time.sleep(0.5)
    assert fut.cancel()
    wait_for(
        lambda: any(
            c.startswith("steps at") for c in napper.seen.call_one().get(timeout=5)["cancelled"]
        ),
        10,
        "the endpoint to see call_cancelled()",
    )
    assert napper.steps.call_one(3).get(timeout=10) == 3  # and the next call is not cancelled
