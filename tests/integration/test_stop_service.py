"""``zmesh stop NAME`` on a service a script runs (not detached): it says what would happen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_logs_cli import Script

from _helpers import own_runtime_dir, wait_for

pytestmark = pytest.mark.slow

SERVICE = textwrap.dedent(
    """
    import os
    import sys
    import zmesh

    class Echo(zmesh.Actor):
        @zmesh.endpoint
        def echo(self, x: int) -> int:
            return x

    if __name__ == "__main__":
        svc = Echo.options(replicas=2, name="svc7").as_service().get(timeout=60)
        assert svc.echo(1).get(timeout=30) == 1
        print(f"READY {os.getpid()}", flush=True)
        for line in sys.stdin:  # a call: the service replaces what it finds stopped
            print(svc.echo(2).get(timeout=60), "DONE", flush=True)
    """
)


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with own_runtime_dir(monkeypatch, unset=("ZMESH_FORWARD_LOGS",)) as path:
        yield path


def zmesh_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zmesh", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ}, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _replicas() -> list[tuple[str, str]]:
    """(mesh, state) of every live replica proc of svc7."""
    rows = json.loads(zmesh_cmd("ps", "--json").stdout)
    return sorted((str(r["mesh"]), str(r["state"])) for r in rows if "svc7" in str(r["mesh"]))


def test_stop_of_a_service_its_script_runs_says_the_owner_replaces_it(
    runtime_dir: str, tmp_path: Path
) -> None:
    path = tmp_path / "service.py"
    path.write_text(SERVICE)
    script = Script(path, {"ZMESH_FORWARD_LOGS": "0"})
    try:
        pid = script.out[-1].split()[1]
        before = _replicas()
        assert len(before) == 2 and {s for _, s in before} == {"Running"}, before
        done = zmesh_cmd("stop", "svc7")
        assert done.returncode == 1, done.stdout + done.stderr  # was: 0, "stopped"
        assert "stopped" not in done.stdout, done.stdout
        err = done.stderr
        assert f"svc7 is a service that the script with pid {pid} runs (not detached)" in err, err
        assert "svc.stop()" in err and "--replicas" in err, err
        assert _replicas() == before  # nothing was stopped

        # --replicas does it anyway, and what was said happens: new replicas come.
        done = zmesh_cmd("stop", "svc7", "--replicas")
        assert done.returncode == 0, done.stdout + done.stderr
        old = {m for m, _ in before}
        script.send("call")
        script.until("DONE")

        def replaced() -> bool:
            now = _replicas()
            return (
                len(now) == 2
                and not {m for m, _ in now} & old
                and all(s == "Running" for _, s in now)
            )

        wait_for(replaced, 30, "the owner to replace the stopped replicas")
    finally:
        script.close()
