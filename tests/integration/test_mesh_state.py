"""``mesh.state()`` tells the truth wherever the handle is used.

From the runtime that spawned the mesh it answers from that runtime's view.
From another event loop of the same process it answers from the view of the
runtime that spawned it. Where no runtime of the process knows the mesh (a
handle that travelled to an actor or to another process), it asks the
mesh's agents.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import zmesh

from _helpers import wait_for


class Pid(zmesh.Actor):
    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


class Inspector(zmesh.Actor):
    @zmesh.endpoint
    async def state_of(self, mesh: zmesh.ActorMesh[Pid]) -> list[tuple[str, int, str]]:
        st = mesh.state()
        return [(r.status.value, r.pid, r.reason) for _, r in sorted(st.ranks.items())]

    @zmesh.endpoint
    def state_of_sync(self, mesh: zmesh.ActorMesh[Pid]) -> list[tuple[str, int, str]]:
        st = mesh.state()
        return [(r.status.value, r.pid, r.reason) for _, r in sorted(st.ranks.items())]


@pytest.fixture
def pids() -> Iterator[tuple[zmesh.ActorMesh[Pid], list[int]]]:
    mesh = Pid.options(procs=2).as_actor().get(timeout=60)
    yield mesh, mesh.pid.call().get(timeout=10).values()
    mesh.stop().get(timeout=10)


def _in_another_loop(mesh: zmesh.ActorMesh[Pid]) -> zmesh.MeshState:
    async def look() -> zmesh.MeshState:
        return mesh.state()

    return asyncio.run(look())


def test_state_from_another_event_loop(pids: tuple[zmesh.ActorMesh[Pid], list[int]]) -> None:
    mesh, procs = pids
    st = _in_another_loop(mesh)
    assert st.status == zmesh.Status.RUNNING
    assert [st.ranks[r].pid for r in range(2)] == procs
    os.kill(procs[1], signal.SIGKILL)
    wait_for(lambda: mesh.state().status == zmesh.Status.FAILED, 10, "the spawner to see it")
    st = _in_another_loop(mesh)
    assert st.status == zmesh.Status.FAILED
    assert st.ranks[1].status == zmesh.Status.FAILED and "SIGKILL" in st.ranks[1].reason
    assert st.ranks[0].status == zmesh.Status.RUNNING and st.ranks[0].pid == procs[0]


@pytest.mark.anyio
async def test_state_from_plain_code_of_a_mesh_spawned_in_a_loop() -> None:
    mesh = await Pid.options().as_actor()
    try:
        pid = await mesh.pid.call_one()
        st = await asyncio.get_running_loop().run_in_executor(None, mesh.state)
        assert st.status == zmesh.Status.RUNNING and st.ranks[0].pid == pid
    finally:
        await mesh.stop()


def test_state_of_a_handle_inside_an_actor(pids: tuple[zmesh.ActorMesh[Pid], list[int]]) -> None:
    mesh, procs = pids
    inspector = Inspector.options().as_actor().get(timeout=60)
    try:
        for ep in (inspector.state_of, inspector.state_of_sync):
            got = ep.call_one(mesh).get(timeout=10)
            assert [(s, p) for s, p, _ in got] == [("Running", procs[0]), ("Running", procs[1])]
        os.kill(procs[0], signal.SIGKILL)
        wait_for(lambda: mesh.state().status == zmesh.Status.FAILED, 10, "the spawner to see it")
        got = inspector.state_of.call_one(mesh).get(timeout=10)
        assert got[0][0] == "Failed" and "SIGKILL" in got[0][2]
        assert got[1][:2] == ("Running", procs[1])
    finally:
        inspector.stop().get(timeout=10)


SCRIPT = """
import pickle, sys
import zmesh
from test_mesh_state import Pid  # noqa: F401  (the handle names the class by module)

mesh = pickle.loads(open(sys.argv[1], "rb").read())
st = mesh.state()
print(st.status.value, *(st.ranks[r].pid for r in sorted(st.ranks)), flush=True)
"""


def test_state_in_a_process_that_never_saw_the_mesh(
    pids: tuple[zmesh.ActorMesh[Pid], list[int]], tmp_path: Path
) -> None:
    mesh, procs = pids
    handle = tmp_path / "mesh.pickle"
    handle.write_bytes(pickle.dumps(mesh))
    script = tmp_path / "look.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), *sys.path]))

    def look() -> str:
        done = subprocess.run(
            [sys.executable, str(script), str(handle)],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert look() == f"Running {procs[0]} {procs[1]}"
    mesh.stop().get(timeout=10)
    wait_for(lambda: look().startswith("Stopped"), 10, "the agent to report the stop")
