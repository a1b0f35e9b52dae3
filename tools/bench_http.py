"""``zmesh http``: requests/s and p50 through HTTP keep-alive, and SSE items/s.

    python tools/bench_http.py [--rounds 3] [--n 2000] [--items 20000]

(``tools/bench.py`` runs it too.) One loopback agent, a detached service of
2 replicas, ``zmesh http`` in front of it, and a minimal asyncio HTTP/1.1
client here, so the client costs as little as a Python client can:

- ``p50``: one keep-alive connection, one request at a time (a 64-byte
  string echoed), next to the same call made directly from Python
  (``zmesh.lookup`` then ``svc.echo(x)``), in the same run, and next to
  ``/healthz`` (HTTP alone, no call behind it);
- ``requests/s``: 16 keep-alive connections, each one request at a time;
- ``SSE items/s``: one stream of small items from a generator endpoint.

When Ray is installed (``pip install -e '.[bench]'``), Ray Serve's HTTP
ingress is measured next to it, the same way, in the same run; otherwise
its column says it was skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zmesh
from zmesh.testing import start_agent, stop_agent

CONNECTIONS = 16
MESSAGE = "x" * 64

SERVICE = textwrap.dedent(
    """
    from collections.abc import AsyncIterator

    import zmesh


    class Echo(zmesh.Actor):
        @zmesh.endpoint
        async def echo(self, x: str) -> str:
            return x

        @zmesh.endpoint
        async def count(self, n: int) -> AsyncIterator[int]:
            for i in range(n):
                yield i


    Echo.options(name="benchhttp", replicas=2, detached=True).spawn().get(90)
    """
)


class Client:
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        self.head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())

    async def __aenter__(self) -> Client:
        self.r, self.w = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.w.close()

    async def post(self, path: str, body: bytes, accept: str = "application/json") -> bytes:
        """The response body of one request (asserting a 200)."""
        self.w.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n{self.head}Accept: {accept}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await self.r.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        lower = head.lower()
        if b"content-length:" in lower:
            n = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
            return await self.r.readexactly(n)
        return await self._chunked()

    async def _chunked(self) -> bytes:
        out = []
        while True:
            size = int((await self.r.readuntil(b"\r\n")).strip(), 16)
            chunk = await self.r.readexactly(size + 2)
            if size == 0:
                return b"".join(out)
            out.append(chunk[:-2])


async def _p50_us(client: Client, path: str, body: bytes, n: int) -> float:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await client.post(path, body)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


async def _per_s(host: str, port: int, headers: dict[str, str], path: str, body: bytes,
                 n: int) -> float:  # fmt: skip
    async def one() -> None:
        async with Client(host, port, headers) as c:
            for _ in range(n // CONNECTIONS):
                await c.post(path, body)

    t = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(CONNECTIONS)))
    return (n // CONNECTIONS) * CONNECTIONS / (time.perf_counter() - t)


async def _sse_per_s(client: Client, path: str, items: int) -> float:
    body = json.dumps({"args": [items]}).encode()
    t = time.perf_counter()
    data = await client.post(path, body, accept="text/event-stream")
    elapsed = time.perf_counter() - t
    assert data.count(b"data: ") == items + 1, data[-200:]  # the items, and the end event's
    return items / elapsed


async def _gateway_round(
    url: str, token: str, n: int, items: int, floor: bool = True
) -> dict[str, float]:
    u = urllib.parse.urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    headers = {"Authorization": f"Bearer {token}"}
    body = json.dumps({"args": [MESSAGE]}).encode()
    async with Client(host, port, headers) as c:
        await _p50_us(c, "/v1/benchhttp/echo", body, 50)  # warm up
        p50 = await _p50_us(c, "/v1/benchhttp/echo", body, n)
        # HTTP alone, no call behind it (zmesh http's /healthz; Ray Serve has none).
        bare = await _p50_us(c, "/healthz", b"", n) if floor else float("nan")
        sse = await _sse_per_s(c, "/v1/benchhttp/count", items)
    per_s = await _per_s(host, port, headers, "/v1/benchhttp/echo", body, n)
    return {"http_p50_us": p50, "http_per_s": per_s, "sse_items_per_s": sse,
            "healthz_p50_us": bare}  # fmt: skip


async def _direct_p50_us(n: int) -> float:
    svc: Any = await zmesh.lookup("benchhttp")
    for _ in range(50):
        await svc.echo(MESSAGE)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await svc.echo(MESSAGE)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def _start_gateway(control: str, tmp: str) -> tuple[subprocess.Popen[str], str, str]:
    popen = subprocess.Popen(
        [sys.executable, "-m", "zmesh", "http", "benchhttp", "--agents", control,
         "--bind", "127.0.0.1:0", "--token-file", os.path.join(tmp, "token"), "--json"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert popen.stdout is not None
    ready = json.loads(popen.stdout.readline())
    with open(ready["token_file"]) as f:
        return popen, ready["url"], f.read().strip()


def measure(
    rounds: int = 3, n: int = 2000, items: int = 20000, *, with_ray: bool = True
) -> dict[str, Any]:
    """The gateway's rows (medians over ``rounds``), the direct call's, and Ray Serve's."""
    with tempfile.TemporaryDirectory(prefix="zmesh-bench-http-") as tmp:
        agent = start_agent("bench-http", os.path.join(tmp, "logs"))
        gateway = None
        try:
            script = os.path.join(tmp, "service.py")
            Path(script).write_text(SERVICE)
            env = dict(os.environ, ZMESH_AGENTS=agent.control)
            subprocess.run([sys.executable, script], check=True, env=env, timeout=120)
            gateway, url, token = _start_gateway(agent.control, tmp)
            zmesh.connect([agent.control], forward_logs=False)
            per_round: list[dict[str, float]] = []
            for _ in range(rounds):
                row = asyncio.run(_gateway_round(url, token, n, items))
                row["direct_p50_us"] = asyncio.run(_direct_p50_us(n))
                per_round.append(row)
        finally:
            if gateway is not None:
                gateway.terminate()
                gateway.wait(30)
                gateway.stdout.close()  # type: ignore[union-attr]
            zmesh.shutdown()
            stop_agent(agent, timeout=20)
    out: dict[str, Any] = {k: statistics.median(r[k] for r in per_round) for k in per_round[0]}
    out["rounds"] = rounds
    out["ray_serve"] = (
        ray_serve(rounds, n, items) if with_ray else {"skipped": "ray serve: skipped (--no-ray)"}
    )
    return out


def ray_serve(rounds: int, n: int, items: int) -> dict[str, Any]:
    """The same rows through Ray Serve's HTTP ingress (``{"skipped": why}`` without Ray)."""
    try:
        import ray
        from ray import serve
        from starlette.requests import Request
        from starlette.responses import StreamingResponse
    except Exception as exc:
        return {"skipped": f"ray serve not installed: skipped (pip install -e '.[bench]') [{exc}]"}

    @serve.deployment(num_replicas=2)
    class Echo:
        async def __call__(self, request: Request) -> Any:
            doc = await request.json()
            if request.url.path.endswith("/count"):

                async def gen() -> Any:
                    for i in range(doc["args"][0]):
                        yield f"data: {i}\n\n"
                    yield "event: end\ndata: {}\n\n"

                return StreamingResponse(gen(), media_type="text/event-stream")
            return {"result": doc["args"][0]}

    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        serve.run(Echo.bind(), route_prefix="/v1/benchhttp")
        per_round = [
            asyncio.run(_gateway_round("http://127.0.0.1:8000", "", n, items, floor=False))
            for _ in range(rounds)
        ]
        out: dict[str, Any] = {k: statistics.median(r[k] for r in per_round) for k in per_round[0]}
        out["version"] = ray.__version__
        return out
    finally:
        serve.shutdown()
        ray.shutdown()


def render(res: dict[str, Any]) -> None:
    """Print the rows as a table."""
    from rich.console import Console
    from rich.table import Table

    ray = res["ray_serve"]
    table = Table(title="zmesh http (HTTP/1.1 keep-alive, 64 B JSON echo)")
    table.add_column("row")
    table.add_column("zmesh http", justify="right")
    table.add_column("direct zmesh call", justify="right")
    ray_name = "Ray Serve" if "skipped" not in ray else "Ray Serve (skipped)"
    table.add_column(ray_name, justify="right")
    rv = (lambda k, f: f.format(ray[k])) if "skipped" not in ray else (lambda k, f: "-")
    table.add_row(
        "p50, one connection",
        f"{res['http_p50_us']:.0f} µs",
        f"{res['direct_p50_us']:.0f} µs",
        rv("http_p50_us", "{:.0f} µs"),
    )
    table.add_row("p50 of /healthz (HTTP alone)", f"{res['healthz_p50_us']:.0f} µs", "", "")
    table.add_row(
        f"requests/s, {CONNECTIONS} connections",
        f"{res['http_per_s']:,.0f}",
        "",
        rv("http_per_s", "{:,.0f}"),
    )
    table.add_row("SSE items/s, one stream", f"{res['sse_items_per_s']:,.0f}", "",
                  rv("sse_items_per_s", "{:,.0f}"))  # fmt: skip
    console = Console()
    console.print(table)
    if "skipped" in ray:
        console.print(ray["skipped"].split(" [")[0], markup=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000, help="requests per row and round")
    ap.add_argument("--items", type=int, default=20000, help="items of the SSE stream")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = ap.parse_args()
    res = measure(args.rounds, args.n, args.items)
    render(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
