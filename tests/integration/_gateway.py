"""A real agent, a detached service made by a script that exits, and ``zmesh http``
in front of it: what the gateway's tests (and docs/http.md's) run against.

Requests go through the standard library's ``http.client``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zmesh.testing import AgentProcess, start_agent, stop_agent

from _helpers import end_child, read_line, run_python

SERVICES = textwrap.dedent(
    """
    import asyncio, os, sys, time
    from collections.abc import AsyncIterator
    from dataclasses import dataclass

    import zmesh


    @dataclass
    class Shape:
        w: int
        h: int


    class Model(zmesh.Actor):
        @zmesh.endpoint
        async def add(self, a: int, b: int = 1) -> int:
            return a + b

        @zmesh.endpoint
        async def area(self, shape: Shape, *, scale: float = 1.0) -> float:
            return shape.w * shape.h * scale

        @zmesh.endpoint
        async def pid(self) -> int:
            return os.getpid()

        @zmesh.endpoint
        async def fail(self, why: str) -> None:
            raise ValueError(why)

        @zmesh.endpoint
        async def nap(self, seconds: float) -> float:
            await asyncio.sleep(seconds)
            return seconds

        @zmesh.endpoint
        async def opaque(self) -> object:
            return range(3)

        @zmesh.endpoint
        async def tokens(self, prompt: str, n: int) -> AsyncIterator[str]:
            for i in range(n):
                await asyncio.sleep(0.005)
                yield f"{prompt}-{i}"

        @zmesh.endpoint
        async def broken(self, n: int) -> AsyncIterator[int]:
            for i in range(n):
                yield i
            raise RuntimeError(f"broke after {n}")

        @zmesh.concurrent_endpoint  # many clients stream at once
        async def forever(self, marker: str) -> AsyncIterator[int]:
            i = 0
            try:
                while True:
                    await asyncio.sleep(0.01)
                    yield i
                    i += 1
            finally:
                with open(marker, "w") as f:
                    f.write(str(i))

        @zmesh.endpoint
        async def flood(self, counter: str, size: int) -> AsyncIterator[str]:
            chunk = "x" * size
            i = 0
            while True:
                i += 1
                with open(counter, "w") as f:
                    f.write(str(i))
                yield chunk


    class Tiny(zmesh.Actor):
        def __init__(self, slow_start: str) -> None:
            if os.path.exists(slow_start):  # a test wants its respawn to take a while
                time.sleep(5)

        @zmesh.endpoint
        async def pid(self) -> int:
            return os.getpid()

        @zmesh.endpoint
        async def nap(self, seconds: float) -> float:
            await asyncio.sleep(seconds)
            return seconds


    Model.options(name="model", replicas=2, detached=True).spawn().get(90)
    Tiny.options(
        name="tiny", replicas=1, detached=True, max_concurrent_requests=1, max_queue=0
    ).spawn(sys.argv[1]).get(90)
    plain = Tiny.options(name="plain", detached=True).as_actor(sys.argv[1])  # a mesh
    plain.pid.call().get(90)
    print("ready", flush=True)
    """
)


@dataclass
class Gateway:
    """A running ``zmesh http``: its URL, token and process."""

    url: str
    token: str
    token_file: str
    popen: subprocess.Popen[str]
    agent: AgentProcess
    dir: Path

    @property
    def address(self) -> tuple[str, int]:
        u = urllib.parse.urlsplit(self.url)
        assert u.hostname is not None and u.port is not None
        return u.hostname, u.port

    def connection(self, timeout: float = 30.0) -> http.client.HTTPConnection:
        """A keep-alive connection to it."""
        host, port = self.address
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        *,
        token: str | None = "",
        conn: http.client.HTTPConnection | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        """``(status, headers, JSON body)`` of one request (``token=None``: none sent)."""
        h = dict(headers or {})
        if token is not None:
            h["Authorization"] = f"Bearer {token or self.token}"
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        own = conn is None
        c = conn or self.connection()
        try:
            c.request(method, path, body=data, headers=h)
            resp = c.getresponse()
            raw = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(raw)
        finally:
            if own:
                c.close()

    def call(self, service: str, endpoint: str, *args: Any, **kwargs: Any) -> Any:
        """The result of one call (asserting a 200)."""
        status, _, doc = self.request(
            "POST", f"/v1/{service}/{endpoint}", {"args": list(args), "kwargs": kwargs}
        )
        assert status == 200, doc
        return doc["result"]


def child_env() -> dict[str, str]:
    """This process's environment with this tree's zmesh first on the path."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def start_gateway(
    agent: AgentProcess, root: Path, *extra: str, token_file: str | None = None
) -> Gateway:
    """``zmesh http`` on a free loopback port in front of ``agent``; its ready line read."""
    token_file = token_file or str(root / "token")
    popen = subprocess.Popen(
        [sys.executable, "-m", "zmesh", "http", "--agents", agent.control,
         "--bind", "127.0.0.1:0", "--token-file", token_file, "--json", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
        start_new_session=True,
    )  # fmt: skip
    ready = json.loads(read_line(popen, 60))
    token = Path(ready["token_file"]).read_text().strip()
    return Gateway(ready["url"], token, ready["token_file"], popen, agent, root)


def stop_gateway(gw: Gateway, sig: int = signal.SIGTERM) -> int:
    """Stop it with ``sig``; its exit code."""
    if gw.popen.poll() is None:
        gw.popen.send_signal(sig)
    try:
        gw.popen.wait(30)
    finally:
        end_child(gw.popen)
    return gw.popen.returncode


@contextlib.contextmanager
def services_behind_gateway(root: Path) -> Iterator[Gateway]:
    """An agent, the detached services of ``SERVICES`` (their creator has exited),
    and ``zmesh http`` serving them."""
    agent = start_agent("http", str(root / "logs"))
    try:
        script = root / "services.py"
        script.write_text(SERVICES)
        slow_start = str(root / "slow-start")  # while it exists, a Tiny replica starts slowly
        done = run_python([str(script), slow_start], 120, env={"ZMESH_AGENTS": agent.control})
        assert done.returncode == 0 and "ready" in done.stdout, done.stdout + done.stderr
        gw = start_gateway(agent, root)
        try:
            yield gw
        finally:
            code = stop_gateway(gw)
            assert code == 0, f"zmesh http exited {code} on SIGTERM"
    finally:
        stop_agent(agent, timeout=20)
