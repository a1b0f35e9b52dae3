"""A proc's last answer is not lost to the news of its end.

An endpoint that raises ``SystemExit`` is answered (``ActorError`` naming
it), then its proc exits; the agent reports the exit on its own stream. The
two travel apart, and on a loaded machine the news can reach the client
first: the call failed with the ``SupervisionError`` of the exit instead of
its answer (seen once in a fresh-clone run at load ~20). Here it is tried
again and again with both cores kept busy, from plain code (the thread's
lane) and from a loop. The loop's case is closed only for an answer already
read off the socket (see its mark).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import zmesh

pytestmark = [pytest.mark.stress, pytest.mark.slow]

ROUNDS = 8


class Exiter(zmesh.Actor):
    @zmesh.endpoint
    def exit_sync(self, code: int) -> None:
        sys.exit(code)

    @zmesh.endpoint
    async def exit_async(self, code: int) -> None:
        sys.exit(code)


@pytest.fixture
def busy_cores() -> Iterator[None]:
    """Two processes that spin for the test's length (its load)."""
    spin = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _answered(exc: object) -> bool:
    return isinstance(exc, zmesh.ActorError) and "SystemExit" in str(exc)


def test_the_answer_before_an_exit_wins_from_plain_code(busy_cores: None) -> None:
    wrong = []
    for i in range(ROUNDS):
        mesh = Exiter.options(procs=2).as_actor().get(timeout=60)
        try:
            calls = [mesh.slice(procs=r).exit_sync.call_one(3) for r in range(2)]
            for call in calls:
                with pytest.raises(zmesh.ZmeshError) as info:
                    call.get(timeout=30)
                if not _answered(info.value):
                    wrong.append(f"round {i}: {info.value!r}")
        finally:
            mesh.stop().get(timeout=30)
    assert not wrong, wrong


@pytest.mark.xfail(
    strict=False,
    reason="on a loop the answer wins only if libzmq's I/O thread read it before the exit's "
    "news came (the connection drains what was read; a sync call gets 0.1 s more): an "
    "answer still in the kernel's buffers then is lost to the SupervisionError. Seen once "
    "in a fresh-clone run; closing it needs the in-flight calls to wait for the "
    "connection's disconnect (all it carried read) before they fail",
)
def test_the_answer_before_an_exit_wins_from_a_loop(busy_cores: None) -> None:
    async def rounds() -> list[str]:
        wrong = []
        for i in range(ROUNDS):
            mesh = await Exiter.options(procs=2).as_actor()
            try:
                got = await asyncio.gather(
                    *(mesh.slice(procs=r).exit_async.call_one(3) for r in range(2)),
                    return_exceptions=True,
                )
                wrong += [f"round {i}: {e!r}" for e in got if not _answered(e)]
            finally:
                await mesh.stop()
        return wrong

    start = time.monotonic()
    wrong = asyncio.run(rounds())
    assert not wrong, wrong
    assert time.monotonic() - start < 110, "the rounds outlasted their busy cores"
