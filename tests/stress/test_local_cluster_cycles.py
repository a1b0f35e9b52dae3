"""A client that starts and stops real agents over and over, its actors'
output forwarded all along, exits 0: stopping agents never kills it.

Each end of ``local_cluster`` closes the client's controller sockets and then
stops the agents, which publish their procs' last events and output as they
stop, then hang up, while the log-forwarding thread follows them. A
heartbeating socket caught there by libzmq 4.3.5 aborted the whole client
(SIGABRT, "Fatal Python error: Aborted"; see ``zmesh._wire.zsock.configure``).
This runs that end many times in a row, in a child process of its own.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from _helpers import run_python

pytestmark = [pytest.mark.stress, pytest.mark.slow]

CYCLES = 3

SCRIPT = textwrap.dedent(
    f"""
    import time

    import zmesh
    from zmesh.testing import local_cluster


    class Talker(zmesh.Actor):
        @zmesh.endpoint
        def say(self, i: int) -> int:
            # Over a second: the client's forwarder subscribes to a new agent's
            # output a moment after its first spawn there, and what was said
            # before that is not sent again.
            for k in range(50):
                print(f"cycle {{i}} line {{k}} from {{zmesh.current_rank().rank}}", flush=True)
                time.sleep(0.02)
            return i


    for i in range({CYCLES}):
        with local_cluster(2) as agents:
            mesh = Talker.options(hosts=2).as_actor().get(timeout=60)
            assert mesh.say.call(i).get(timeout=30).values() == [i, i]
            if i % 2:
                agents[1].kill()  # one lost, one stopped: both ends, as the guide's tests do
    print("done", flush=True)
    """
)


def test_starting_and_stopping_agents_with_output_forwarded_never_kills_the_client(
    tmp_path: Path,
) -> None:
    script = tmp_path / "cycles.py"
    script.write_text(SCRIPT)
    done = run_python([str(script)], 120, env={"ZMESH_FORWARD_LOGS": "1"})
    assert done.returncode == 0, f"rc={done.returncode}\n{done.stdout[-2000:]}\n{done.stderr}"
    assert "Fatal Python error" not in done.stderr
    assert done.stdout.rstrip().endswith("done")
    # The forwarder was on and followed the agents: their procs' lines are here.
    assert ") cycle " in done.stdout
