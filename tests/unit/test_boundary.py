"""The contracts at process boundaries that are no socket (``zmesh._wire.boundary``).

Each is read by another process than the one that wrote it: what one side
writes, the other reads back as the same struct, and what is not one is
refused at the reader, with why.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import msgspec
import pytest

from zmesh._host.agent import forkserver as _forkserver
from zmesh._host.agent import ptree as _ptree
from zmesh._shared.state import Status
from zmesh._wire import boundary as b
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec


def test_a_proc_env_reads_back_as_written_and_refuses_what_it_is_not() -> None:
    env = b.ProcEnv(
        mesh="m", rank=3, generation=2, dims={"procs": 4}, agent="ipc:///x/c", agent_pid=7,
        bind="ipc:///x/p3", log_path="/x/m.3.g2.log", main=w.MainSpec(dir="/tmp"), epoch="e1",
    )  # fmt: skip
    assert b.decode_proc_env(b.encode(env)) == env
    with pytest.raises(msgspec.ValidationError, match="rank"):
        b.decode_proc_env(b'{"mesh": "m", "rank": "3", "generation": 1}')
    with pytest.raises(msgspec.ValidationError, match="unknown"):
        b.decode_proc_env(b'{"mesh": "m", "rank": 3, "generation": 1, "extra": 1}')
    assert b.proc_env_of(b"not json") is None
    assert b.proc_env_of(None) is None


def test_a_process_carries_its_proc_env_where_strays_are_told_apart() -> None:
    env = b.ProcEnv(mesh="m", rank=1, generation=5, epoch="abc")
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, b.PROC_ENV_VAR: b.encode(env).decode()},
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"  # exec'd
        assert b.proc_env_of(_ptree.tag(child.pid)) == env
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_fork_lines_read_back_as_written() -> None:
    req = b.ForkRequest(1, "/x/log", {"A": "b\nc"}, None, 42)
    line = b.encode(req)
    assert b"\n" not in line  # one line per request, whatever the environment holds
    assert b.decode_fork_request(line) == req
    for reply in (b.ForkReady(), b.Forked(1, 99), b.ForkFailed(1, "fork: no memory")):
        assert b.decode_fork_reply(b.encode(reply)) == reply
    with pytest.raises(msgspec.DecodeError):
        b.decode_fork_reply(b'{"id": 1, "pid": 99}')  # untagged: the old form


@pytest.mark.anyio
async def test_a_forkserver_that_answers_nonsense_costs_no_spawn() -> None:
    # A forkserver that is warm, then answers each request with no reply:
    # the agent stops using it, and the request is started another way.
    script = textwrap.dedent(
        """
        import os, sys
        os.write(1, b'{"type": "ForkReady"}\\n')
        for line in sys.stdin:
            os.write(1, b'{"pid": "soon"}\\n')
        """
    )
    popen = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    answers: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
    fs = _forkserver.ForkServer(popen, lambda rid, child: answers.put_nowait((rid, child)))
    try:
        rid = fs.request("/dev/null", {}, None)
        assert rid is not None
        assert await asyncio.wait_for(answers.get(), 10) == (rid, None)
        assert fs.broken and fs.request("/dev/null", {}, None) is None
    finally:
        popen.kill()
        popen.wait()
        for pipe in (popen.stdin, popen.stdout):
            if pipe is not None:
                pipe.close()


def test_the_agent_ready_line_reads_back_and_other_lines_are_none() -> None:
    info = b.AgentReady(
        label="h", control="ipc:///x/c", stream="ipc:///x/e", epoch="e", pid=1, log_dir="/x"
    )
    line = b.ready_line(info)
    assert line.startswith("ZMESH-AGENT-READY ") and "\n" not in line
    assert b.parse_ready_line(line.encode()) == info
    assert b.parse_ready_line(b"Traceback (most recent call last):") is None
    with pytest.raises(msgspec.DecodeError):
        b.parse_ready_line(b'ZMESH-AGENT-READY {"label": "h"}')


def test_statuses_on_the_wire_are_the_status_enum() -> None:
    codec = Codec(w.STREAM)
    state = w.RankState(rank=0, status=Status.RUNNING, generation=1)
    event = w.Event(1, "e", "h", "m", "o", state, 0.0)
    decoded = codec.decode(codec.encode(event))
    assert isinstance(decoded, w.Event) and decoded.state.status is Status.RUNNING
    bogus = msgspec.msgpack.encode(["Event", 1, "e", "h", "m", "o", {"rank": 0,
                                    "status": "Healthy", "generation": 1}, 0.0])  # fmt: skip
    with pytest.raises(msgspec.ValidationError, match="status"):
        codec.decode([bogus])
