"""Stream tokens from a detached service to ``curl -N``, through ``zmesh http``.

Needs an agent that outlives scripts, and ``pip install 'zmesh[http]'``::

    zmesh agent &                        # prints its address: ZMESH-AGENT-READY {"control": ...}
    export ZMESH_AGENTS=ipc://...        # that address

    python examples/http_tokens.py up    # makes the detached service "writer", exits
    zmesh http --token-file token &      # serves it on http://127.0.0.1:8000
    curl -N http://127.0.0.1:8000/v1/writer/generate \\
        -H "Authorization: Bearer $(cat token)" -H "Accept: text/event-stream" \\
        -d '{"args": ["once upon a time"], "kwargs": {"n": 8}}'
    zmesh stop writer                    # or: python examples/http_tokens.py down

With no argument it does all of that itself (``zmesh http`` on a free port,
``curl -N`` if it is installed, else the standard library) and prints each
event as it arrives: look for ``up: made writer``, the ``data:`` lines, one
per token, ``event: end`` and ``down: stopped``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import AsyncIterator

import zmesh

WORDS = "the quick brown fox jumps over the lazy dog".split()


class Writer(zmesh.Actor):
    @zmesh.concurrent_endpoint  # streams to many clients at once
    async def generate(self, prompt: str, n: int = 16) -> AsyncIterator[str]:
        """One word at a time, as a language model would stream its tokens."""
        for i in range(n):
            await asyncio.sleep(0.05)  # "decoding"
            yield WORDS[(len(prompt) + i) % len(WORDS)]

    @zmesh.endpoint
    async def complete(self, prompt: str, n: int = 16) -> str:
        """The whole text at once."""
        return " ".join(WORDS[(len(prompt) + i) % len(WORDS)] for i in range(n))


def up() -> None:
    svc = Writer.options(name="writer", replicas=2, detached=True).spawn().get(timeout=60)
    print(f"up: made writer with {len(svc)} replicas; this script exits now", flush=True)


def down() -> None:
    zmesh.lookup("writer").get(timeout=30).stop().get(timeout=30)
    print("down: stopped", flush=True)


def stream(url: str, token: str) -> None:
    """POST to the generator endpoint and print its events as they come."""
    body = json.dumps({"args": ["once upon a time"], "kwargs": {"n": 8}})
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    if shutil.which("curl"):
        cmd = ["curl", "-sSN", f"{url}/v1/writer/generate", "-d", body]
        for k, v in headers.items():
            cmd += ["-H", f"{k}: {v}"]
        subprocess.run(cmd, check=True)
        return
    req = urllib.request.Request(f"{url}/v1/writer/generate", body.encode(), headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        for line in resp:
            print(line.decode(), end="", flush=True)


def main() -> None:
    if not os.environ.get("ZMESH_AGENTS"):
        raise SystemExit("set ZMESH_AGENTS to the address of a running 'zmesh agent' first")
    steps = {"up": up, "down": down}
    if len(sys.argv) > 1:
        steps[sys.argv[1]]()
        return
    subprocess.run([sys.executable, __file__, "up"], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        token_file = os.path.join(tmp, "token")
        gateway = subprocess.Popen(
            [sys.executable, "-m", "zmesh", "http", "writer", "--bind", "127.0.0.1:0",
             "--token-file", token_file, "--json"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert gateway.stdout is not None
            ready = json.loads(gateway.stdout.readline())  # {"url": ..., "token_file": ...}
            with open(ready["token_file"]) as f:
                stream(ready["url"], f.read().strip())
        finally:
            gateway.send_signal(signal.SIGINT)  # as Ctrl+C: it stops cleanly
            gateway.wait(30)
            gateway.stdout.close()  # type: ignore[union-attr]
    subprocess.run([sys.executable, __file__, "down"], check=True)


if __name__ == "__main__":
    main()
