"""The agent's forkserver: warm forks that are still the agent's own children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

import zmesh
from zmesh import testing
from zmesh._client.control import local as _local
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

from _helpers import default_agent, pid_alive, session_pids, wait_for, wait_gone


def _comm(pid: int) -> str:
    """A process's name (a forked proc's command line is its forkserver's)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class Probe(zmesh.Actor):
    @zmesh.endpoint
    def facts(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "sid": os.getsid(0),
            "cwd": os.getcwd(),
            "mark": os.environ.get("ZMESH_TEST_MARK"),
            "comm": _comm(os.getpid()),
            "stdin": os.readlink("/proc/self/fd/0"),
            "stdout": os.readlink("/proc/self/fd/1"),
        }

    @zmesh.endpoint
    def start_sleeper(self) -> int:
        """A child of the proc that outlives it (the agent must reap it then)."""
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        return child.pid


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[testing.AgentProcess]:
    with default_agent(monkeypatch, "forks") as a:
        yield a


def _children_of(pid: int) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.add(int(entry))
    return out


def _forkserver_of(agent: testing.AgentProcess) -> int:
    def find() -> int:
        return next((p for p in _children_of(agent.pid) if _comm(p) == "zmesh-fork"), 0)

    return wait_for(find, 10, "the agent's forkserver")


def test_procs_are_forked_and_adopted_by_their_agent(
    agent: testing.AgentProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    monkeypatch.setenv("ZMESH_TEST_MARK", "forwarded")  # ZMESH_* travels to procs
    monkeypatch.chdir(tmp_path)
    mesh = Probe.options(procs=2).as_actor().get(timeout=60)
    facts = list(mesh.facts.call().get(timeout=30).values())
    for f in facts:
        assert f["ppid"] == agent.pid  # the agent reaps it, and it dies with the agent
        assert f["comm"] == "zmesh-proc"  # forked, not a fresh interpreter
        assert f["sid"] == f["pid"]  # its own session, as Popen(start_new_session) gave
        assert f["mark"] == "forwarded"
        assert f["cwd"] == os.fspath(tmp_path)
        assert f["stdin"] == os.devnull and f["stdout"].endswith(".log")
    assert {f["pid"] for f in facts} <= session_pids("proc")


def test_a_forked_proc_killed_is_reported_with_its_signal(agent: testing.AgentProcess) -> None:
    mesh = Probe.options(procs=1).as_actor().get(timeout=60)
    pid = mesh.facts.call_one().get(timeout=30)["pid"]
    os.kill(pid, signal.SIGKILL)
    state = wait_for(
        lambda: (s := mesh.state().ranks[0]).status == zmesh.Status.FAILED and s,
        10, "the rank to fail",
    )  # fmt: skip
    assert "SIGKILL" in state.reason and state.exit_code == -signal.SIGKILL


def test_a_dead_forkserver_costs_no_proc_and_spawning_goes_on(agent: testing.AgentProcess) -> None:
    first = Probe.options(procs=1).as_actor().get(timeout=60)
    before = first.facts.call_one().get(timeout=30)
    fork = _forkserver_of(agent)
    os.kill(fork, signal.SIGKILL)
    wait_gone([fork], 10, "the forkserver")
    # The procs it forked belong to the agent: they keep serving...
    assert first.facts.call_one().get(timeout=30)["pid"] == before["pid"]
    # ...and new procs start as fresh interpreters instead.
    second = Probe.options(procs=1).as_actor().get(timeout=60)
    after = second.facts.call_one().get(timeout=30)
    assert after["ppid"] == agent.pid and after["comm"] != "zmesh-proc"
    assert first.state().status == zmesh.Status.RUNNING


def test_an_orphan_a_proc_left_behind_is_reaped(agent: testing.AgentProcess) -> None:
    """The agent adopts orphans (it is a subreaper); it must not leave zombies."""
    mesh = Probe.options(procs=1).as_actor().get(timeout=60)
    pid = mesh.facts.call_one().get(timeout=30)["pid"]
    sleeper = mesh.start_sleeper.call_one().get(timeout=30)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: sleeper in _children_of(agent.pid), 10, "the agent to adopt the orphan")
    os.kill(sleeper, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{sleeper}"), 10, "the orphan to be reaped")
    assert not pid_alive(pid)


def test_without_a_forkserver_procs_are_fresh_interpreters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZMESH_FORKSERVER", "0")  # read by the agent started next
    a = testing.start_agent("no-forks")
    monkeypatch.setenv("ZMESH_AGENTS", a.control)
    _local.configure(None)
    try:
        mesh = Probe.options(procs=1).as_actor().get(timeout=60)
        facts = mesh.facts.call_one().get(timeout=30)
        assert facts["ppid"] == a.pid and facts["comm"] != "zmesh-proc"
        assert "zmesh-fork" not in {_comm(p) for p in _children_of(a.pid)}
    finally:
        zmesh.shutdown()
        testing.stop_agent(a)


def test_a_forkserver_that_stops_answering_costs_no_spawn(agent: testing.AgentProcess) -> None:
    """A hung forkserver: the spawn falls back at once, and the agent stays responsive."""
    Probe.options(procs=1).as_actor().get(timeout=60)  # the forkserver is warm
    fork = _forkserver_of(agent)
    os.kill(fork, signal.SIGSTOP)
    try:
        mesh = Probe.options(procs=2).as_actor().get(timeout=60)
        facts = list(mesh.facts.call().get(timeout=30).values())
        assert all(f["ppid"] == agent.pid and f["comm"] != "zmesh-proc" for f in facts)
        assert mesh.state().status == zmesh.Status.RUNNING
        # The agent gave up on it, and killed it so it cannot fork late.
        wait_gone([fork], 10, "the hung forkserver")
    finally:
        if pid_alive(fork):
            os.kill(fork, signal.SIGCONT)


def test_a_hello_from_another_pid_does_not_take_over_a_rank(agent: testing.AgentProcess) -> None:
    """Only the process the agent started speaks for a rank; strangers are not killed."""
    mesh = Probe.options(procs=1).as_actor().get(timeout=60)
    ref = mesh._refs[0]
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(agent.control)
    try:
        hello = w.ProcHello(ref.mesh, ref.rank, ref.generation, "tcp://127.0.0.1:9", os.getpid())
        sock.send_multipart(Codec(w.AGENT_INBOX).encode(hello))
        # The agent still answers, and the rank is still the proc it started.
        state = Codec(w.AGENT_REPLIES).decode(
            _request(sock, Codec(w.AGENT_INBOX).encode(w.GetState(1, ref.mesh)))
        )
        [rank] = state.meshes[0].ranks
        assert rank.addr == ref.addr and rank.status == zmesh.Status.RUNNING.value
    finally:
        sock.close()
    assert mesh.facts.call_one().get(timeout=30)["pid"] == rank.pid


def _request(sock: zmq.Socket[Any], frames: list[Any]) -> list[bytes]:
    sock.send_multipart(frames)
    assert sock.poll(5000), "no answer from the agent"
    return sock.recv_multipart()


def test_a_burst_of_64_procs_is_forked_answers_and_is_reaped(agent: testing.AgentProcess) -> None:
    """64 ranks in one CreateOrUpdate: requests to the forkserver are pipelined, each
    proc is adopted as its reply comes, every one serves, and stop reaps them all."""
    warm = Probe.options(procs=1).as_actor().get(timeout=60)  # the forkserver is warm
    warm.facts.call_one().get(timeout=30)
    mesh = Probe.options(procs=64).as_actor().get(timeout=120)
    facts = list(mesh.facts.call().get(timeout=60).values())
    pids = {f["pid"] for f in facts}
    assert len(pids) == 64
    assert all(f["ppid"] == agent.pid for f in facts)  # the agent's own children
    assert all(f["comm"] == "zmesh-proc" for f in facts)  # all forked: none fell back
    assert pids <= session_pids("proc")
    fork = _forkserver_of(agent)
    mesh.stop().get(timeout=30)
    wait_gone(pids, 20, "the 64 procs after stop")
    stopped = {zmesh.Status.STOPPED}
    wait_for(lambda: {r.status for r in mesh.state().ranks.values()} == stopped, 10, "Stopped")
    assert warm.facts.call_one().get(timeout=30)["pid"] not in pids  # the other mesh serves on
    # Every one was reaped: no zombie is left under the agent, and none of
    # them (nor a middle child) was ever the forkserver's.
    wait_for(lambda: not _children_of(agent.pid) & pids, 10, "the agent to reap them all")
    assert not _children_of(fork)


def test_with_a_middle_child_procs_are_still_the_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where clone(CLONE_PARENT) cannot be used, a middle child hands the procs over."""
    monkeypatch.setenv(
        "ZMESH_SIBLING_FORK", "0"
    )  # read by the forkserver of the agent started next
    a = testing.start_agent("middle")
    monkeypatch.setenv("ZMESH_AGENTS", a.control)
    _local.configure(None)
    try:
        # The forkserver warm first: a spawn that finds it still importing on a
        # loaded machine runs a fresh interpreter instead, by design.
        Probe.options(procs=1).as_actor().get(timeout=60).facts.call_one().get(timeout=30)
        mesh = Probe.options(procs=4).as_actor().get(timeout=60)
        facts = list(mesh.facts.call().get(timeout=30).values())
        assert [(f["ppid"], f["comm"]) for f in facts] == [(a.pid, "zmesh-proc")] * 4
        pids = {f["pid"] for f in facts}
        mesh.stop().get(timeout=30)
        wait_gone(pids, 20, "the procs after stop")
        wait_for(lambda: not _children_of(a.pid) & pids, 10, "the agent to reap them all")
    finally:
        zmesh.shutdown()
        testing.stop_agent(a)
