"""What actors print just before their script ends reaches the script's terminal.

The agent forwards new log lines every ~100 ms tick, and a script that ends
stops its embedded agent with it: without a flush, a short script lost
everything its actors printed (the lines were in the logs, never on the
terminal). Now ``zmesh.shutdown()``, explicit or at exit, first asks each
agent to forward what is new and to mark the end (``FlushLogs``), and prints
up to the mark. A dead agent costs the wait for its answer, never a hang.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import zmesh
from zmesh._client.control import logforward
from zmesh.testing import local_cluster

from _actors import Pid
from _helpers import own_runtime_dir, run_python, wait_for

RANKS = 4
BURST = 40  # lines a rank prints as its last words: 160 in all, under the 200 a second shown

SCRIPT = textwrap.dedent(
    f"""
    import sys
    import zmesh

    class Talker(zmesh.Actor):
        def __init__(self):
            print(f"init of rank {{zmesh.current_rank().rank}}")

        @zmesh.endpoint
        def last_words(self) -> int:
            rank = zmesh.current_rank().rank
            for i in range({BURST}):
                print(f"rank {{rank}} line {{i}}")
            print("every rank says this")
            print(f"rank {{rank}} on stderr", file=sys.stderr)
            sys.stdout.write(f"rank {{rank}} open line")  # no newline: still a line of its own
            return rank

    if __name__ == "__main__":
        mesh = Talker.options(procs={RANKS}).as_actor().get(timeout=60)
        print("ranks", mesh.last_words.call().get(timeout=30).values(), flush=True)
        if sys.argv[1:] == ["shutdown"]:
            zmesh.shutdown()
            print("after shutdown", flush=True)
    """
)


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    with own_runtime_dir(monkeypatch, unset=("ZMESH_FORWARD_LOGS",)):
        path = tmp_path / "talker.py"
        path.write_text(SCRIPT)
        yield path


def forwarded(out: str) -> list[str]:
    """The forwarded lines of ``out``, without their ``(mesh rank host)`` prefix."""
    return [ln.split(") ", 1)[1] for ln in out.splitlines() if ln.startswith("(")]


@pytest.mark.parametrize("end", ["exit", "shutdown"])
def test_every_line_printed_before_the_end_reaches_the_terminal(script: Path, end: str) -> None:
    done = run_python([str(script), end], timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = forwarded(done.stdout)
    for rank in range(RANKS):
        assert f"init of rank {rank}" in lines, done.stdout[-3000:]
        assert [ln for ln in lines if ln.startswith(f"rank {rank} line ")] == [
            f"rank {rank} line {i}" for i in range(BURST)
        ]
        assert f"rank {rank} open line" in lines
        assert f"rank {rank} on stderr" in forwarded(done.stderr)
    # Said by every rank: printed once, and the count before the script ends.
    assert lines.count("every rank says this") == 1
    assert f"every rank says this [repeated {RANKS - 1}x across ranks]" in lines
    assert "lines of actor output not shown" not in done.stderr
    if end == "shutdown":  # printed before shutdown() returned, not after
        assert done.stdout.index("open line") < done.stdout.index("after shutdown")


@pytest.mark.chaos
def test_a_dead_agent_does_not_hold_up_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of an agent we follow: shutdown() waits for its answer a
    bounded moment (``ACK_WAIT``), not for ever."""
    with own_runtime_dir(monkeypatch, unset=("ZMESH_FORWARD_LOGS",)):
        with local_cluster(2) as agents:
            mesh = Pid.options(hosts=2, procs=1).as_actor().get(timeout=60)
            assert len(set(mesh.pid.call().get(timeout=30).values())) == 2
            agents[0].kill()
            wait_for(lambda: agents[0].popen.poll() is not None, 10, "the agent's death")
            start = time.monotonic()
            zmesh.shutdown()
            took = time.monotonic() - start
    # Generous for a loaded machine; a hang would be the test's whole timeout.
    assert took < logforward.FLUSH_WAIT + 5.0, took
