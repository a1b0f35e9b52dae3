"""Every script in examples/ runs, as a user would run it, and says what it promises.

Each runs as its own process against real agents, within a deadline; the
lines checked are the ones its docstring tells the reader to look for. A new
example needs an entry here (a test fails otherwise).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from zmesh.testing import local_cluster

from _helpers import run_python

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# example -> (seconds it may take, what its output must match, needs two hosts)
EXPECT: dict[str, tuple[float, list[str], bool]] = {
    "quickstart.py": (
        60,
        [r"call      -> \[11, 11, 11, 11\]", r"ActorError -> ValueError", r"^stopped$"],
        False,
    ),
    "supervision.py": (
        60,
        [r"in flight -> SupervisionError", r"killed by SIGKILL", r"^stopped$"],
        False,
    ),
    "rl_loop.py": (90, [r"iter 12: reward", r"done in"], False),
    "service_failover.py": (90, [r"^lost:\s+0$", r"^service:\s+OK$"], False),
    "token_stream.py": (
        90,
        [
            r"killed replica \d before its first token",
            r"^tokens: 12$",
            r"^moved to another replica: 1$",
        ],
        False,
    ),
    "detached_service.py": (
        120,
        [
            r"^up: made embedder",
            r"^call: \[0, 2, 4, 6\]$",
            r"^kill: replica 0 .* respawned$",
            r"^down: stopped$",
        ],
        True,
    ),
    "http_tokens.py": (
        120,
        [r"^up: made writer", r'^data: "\w+"$', r"^event: end$", r"^down: stopped$"],
        True,
    ),
    "multihost.py": (90, [r"over 2 agents", r"per-host fan-out: \[\[3, 3\], \[4, 4\]\]"], True),
}


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[str]:
    """``ZMESH_AGENTS`` for two loopback agents (as two hosts)."""
    with local_cluster(2) as agents:
        yield ",".join(a.control for a in agents)


def test_every_example_is_checked() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECT)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECT))
def test_example_runs(name: str, request: pytest.FixtureRequest) -> None:
    timeout, patterns, hosts = EXPECT[name]
    env = {"ZMESH_AGENTS": request.getfixturevalue("two_hosts")} if hosts else {}
    done = run_python([str(EXAMPLES / name)], timeout, env=env)
    output = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, output
    for pattern in patterns:
        assert re.search(pattern, done.stdout, re.M), f"{pattern!r} not in output; {output}"
    assert "Traceback" not in done.stderr, output
