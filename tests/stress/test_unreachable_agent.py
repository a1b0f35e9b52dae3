"""A handle whose agent never answers fails its calls; it does not leave them waiting.

Handles are values: a script can hold one whose agent is gone by the time
it calls (the handle was pickled and sent on, or ``zmesh.shutdown()``
stopped the embedded agent behind it). The runtime then has an agent
connection that never got an answer. Before, only an agent heard once and
then silent was judged lost, so such a call waited forever (a ``.get()``
without a timeout hung the script). Now its ranks are ``Unknown`` after a
few seconds and every call fails with ``SupervisionError``.
"""

from __future__ import annotations

import pickle
import textwrap
import time
from pathlib import Path

import pytest

import zmesh

from _helpers import run_python

pytestmark = pytest.mark.stress

BUDGET = 8.0  # seconds: AGENT_TIMEOUT plus one Describe, with room for a loaded machine


class Echo(zmesh.Actor):
    @zmesh.endpoint
    async def ping(self) -> int:
        return 1


def test_a_call_after_shutdown_fails_instead_of_hanging() -> None:
    mesh = Echo.options().as_actor().get(timeout=60)
    assert mesh.ping.call_one().get(timeout=10) == 1
    zmesh.shutdown()  # the embedded agent and the procs are gone
    t0 = time.monotonic()
    with pytest.raises(zmesh.SupervisionError, match="unreachable"):
        mesh.ping.call_one().get(timeout=30)
    assert time.monotonic() - t0 < BUDGET


CALLER = textwrap.dedent(
    """
    import pickle, sys, time
    import zmesh
    mesh = pickle.loads(bytes.fromhex(sys.argv[1]))
    t0 = time.monotonic()
    try:
        mesh.ping.call_one().get(timeout=30)
        print("answered")
    except zmesh.ZmeshError as exc:
        print(type(exc).__name__, round(time.monotonic() - t0, 1))
    """
)


def test_a_handle_sent_to_another_script_after_its_agent_died(tmp_path: Path) -> None:
    mesh = Echo.options().as_actor().get(timeout=60)
    blob = pickle.dumps(mesh).hex()
    zmesh.shutdown()
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    done = run_python([str(script), blob], 60)
    kind, took = done.stdout.split()
    assert kind == "SupervisionError", done.stdout + done.stderr
    assert float(took) < BUDGET
