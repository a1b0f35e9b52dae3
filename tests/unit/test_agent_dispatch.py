"""A handler that raises is answered with an error and never stops the reader.

Bad input is refused at decode (see tests/integration/test_agent_robustness.py
for that, against real agents and procs). This covers what is left: a bug in
a handler. The handler is made to raise on purpose; the socket is a recorder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zmesh._host.agent import meshorders
from zmesh._host.agent.hostagent import HostAgent
from zmesh._host.proc.procserver import ProcServer
from zmesh._wire import messages as w
from zmesh._wire.boundary import ProcEnv
from zmesh._wire.codec import NONE, Codec


class Recorder:
    def __init__(self) -> None:
        self.sent: list[list[Any]] = []

    def send(self, frames: list[Any]) -> None:
        self.sent.append(frames)


def test_an_agent_handler_that_raises_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = HostAgent(label="unit", log_dir=str(tmp_path))
    out = Recorder()
    agent._ctrl = out  # type: ignore[assignment]
    agent._codec = codec = Codec(w.AGENT_INBOX)

    def boom(*args: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(meshorders, "create_or_update", boom)
    spec = w.ProcSpec(owner="o", ranks=[0], dims={"procs": 1})
    agent._on_control([b"peer", *codec.encode(w.CreateOrUpdate(1, "m", spec))])
    replies = Codec(w.AGENT_REPLIES)
    ack = replies.decode(out.sent[-1][1:])
    assert isinstance(ack, w.Ack) and ack.id == 1 and not ack.ok
    assert "RuntimeError" in ack.error and "a bug" in ack.error
    agent._on_control([b"peer", *codec.encode(w.Describe(2))])  # the next one is served
    info = replies.decode(out.sent[-1][1:])
    assert isinstance(info, w.AgentInfo) and info.id == 2


def test_a_proc_handler_that_raises_is_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    server = ProcServer(ProcEnv(mesh="m", rank=0, generation=1))
    out = Recorder()
    server.router = out  # type: ignore[assignment]

    def boom(*args: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(server, "_dispatch", boom)
    call = w.Call(7, "a", "m", NONE)
    server._on_message([b"peer", *server.codec.encode(call)])
    server._on_message([b"peer", b"\xc1\x92" + b"".join(server.codec.encode(call) * 2)])
    failures = [Codec(w.CLIENT_INBOX).decode(f[1:]) for f in out.sent]
    assert len(failures) == 3
    assert all(isinstance(f, w.Failure) and f.id == 7 and "a bug" in f.message for f in failures)
    server.pool.shutdown()
