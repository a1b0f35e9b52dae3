"""The agent client: replies matched by id, timeouts and refusals as typed errors.

Against a real ROUTER on ipc:// standing in for an agent's control socket.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import zmq

from zmesh._client.control.agents import AgentClient, AgentLink
from zmesh._errors import AgentError, AgentTimeoutError, SecurityError
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec


def _agent(addr: str, answer: Any, stop: threading.Event) -> threading.Thread:
    """A fake control socket: answers each request with ``answer(msg)`` (or nothing),
    the later ones first, so replies arrive out of order."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(addr)

    def run() -> None:
        codec = Codec(w.AGENT_INBOX)
        held: list[tuple[bytes, Any]] = []
        try:
            while not stop.is_set():
                if not router.poll(20):
                    for ident, reply in reversed(held):
                        router.send_multipart([ident, *codec.encode(reply)])
                    held.clear()
                    continue
                ident, *frames = router.recv_multipart()
                reply = answer(codec.decode(frames))
                if reply is not None:
                    held.append((ident, reply))
        finally:
            router.close(linger=0)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _answer(msg: Any) -> Any:
    if isinstance(msg, w.Describe):
        return w.AgentInfo(msg.id, "fake", "ctl", "ipc://stream", "ep", 1, "h")
    if isinstance(msg, w.Stop):
        return w.Ack(msg.id, ok=False, error="not the owner", denied=True)
    if isinstance(msg, w.GetState):
        return w.Ack(msg.id, ok=False, error="no such mesh")
    return None  # silent


@pytest.fixture
def fake_agent(tmp_path: Path) -> Any:
    addr = f"ipc://{tmp_path}/ctl"
    stop = threading.Event()
    t = _agent(addr, _answer, stop)
    yield addr
    stop.set()
    t.join(5)


def test_async_client_matches_replies_and_types_errors(fake_agent: str) -> None:
    async def main() -> None:
        c = AgentClient(zmq.Context.instance(), fake_agent, asyncio.get_running_loop())
        try:
            infos = await asyncio.gather(*(c.request(w.Describe, 5.0) for _ in range(5)))
            assert all(isinstance(i, w.AgentInfo) for i in infos)
            assert c.last_reply > 0
            with pytest.raises(SecurityError, match="not the owner"):
                await c.request(lambda i: w.Stop(i, "m", secret="x"), 5.0)
            with pytest.raises(AgentError, match="no such mesh"):
                await c.request(lambda i: w.GetState(i, "m"), 5.0)
            nack = await c.request(lambda i: w.GetState(i, "m"), 5.0, check=False)
            assert isinstance(nack, w.Ack) and not nack.ok
            with pytest.raises(AgentTimeoutError) as err:
                await c.request(w.GetHealth, 0.2)
            assert isinstance(err.value, TimeoutError) and err.value.host == fake_agent
        finally:
            c.close()

    asyncio.run(main())


def test_sync_link_matches_replies_and_types_errors(fake_agent: str) -> None:
    link = AgentLink(fake_agent)
    try:
        assert isinstance(link.request(w.Describe, 5.0), w.AgentInfo)
        with pytest.raises(SecurityError):
            link.request(lambda i: w.Stop(i, "m", secret="x"), 5.0)
        with pytest.raises(AgentTimeoutError):
            link.request(w.GetHealth, 0.2)
        assert link.send(w.OwnerGone("me", secret="s"))
    finally:
        link.close()
