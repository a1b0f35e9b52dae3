#!/usr/bin/env python
"""zmesh vs a raw pyzmq baseline (and Ray, when installed), side by side.

Run from the repository root::

    python tools/bench.py                 # a few minutes, 5 rounds
    python tools/bench.py --quick         # ~1 minute smoke, 3 short rounds
    python tools/bench.py --json out.json # also write every number as JSON
    python tools/bench.py --sync-only --rounds 20   # one row, more rounds
    python tools/bench.py --rows spawn,tree         # chosen rows only (see ROWS)

Both sides are measured in the same run and *interleaved* (raw, zmesh, raw,
zmesh, ... with the order flipped every round) so that drift on a noisy shared
machine hits both. Each number is the median over rounds of a per-round
statistic; compare the ratios, not absolutes from different runs.

Raw baseline: a pyzmq DEALER (here) / ROUTER (tools/raw_echo.py, a subprocess)
echo over tcp loopback, written the fast way: asyncio + ``loop.add_reader`` on
the socket's ``ZMQ_FD``, ``NOBLOCK`` sends and receives, ``EVENTS`` re-checked
after every operation (``ZMQ_FD`` is edge-triggered), ``copy=False`` for
the 1 MiB case. The raw fan-out rows use one such server per target.

See docs/benchmarks.md for how to read the table.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import operator
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import bench_http  # tools/: the zmesh http rows
import bench_tree  # tools/: the tree vs flat rows
import zmq

import zmesh
import zmesh._client.control.local

PAYLOAD = b"x" * 64
MIB = 1 << 20
BIG = b"y" * MIB
# The zero-copy path: a memoryview travels as its own frame both ways and
# arrives as a memoryview over the received message (bytes must be copied
# into a new object on arrival: Python's bytes owns its memory).
BIG_VIEW = memoryview(bytearray(BIG))
WINDOW = 1000  # requests in flight for the pipelined runs
FANOUT = (4, 16, 64)


# ---------------------------------------------------------------- the actor


class BenchActor(zmesh.Actor):
    """Defined in this script: it travels to the procs by value."""

    def __init__(self) -> None:
        self.hits = 0

    @zmesh.endpoint
    async def echo(self, x: Any) -> Any:
        return x

    @zmesh.endpoint
    def echo_sync(self, x: Any) -> Any:
        """The same echo as a plain ``def``: it runs in one of the proc's worker threads."""
        return x

    @zmesh.endpoint
    async def ping(self) -> int:
        return self.hits

    @zmesh.endpoint
    async def hit(self, x: Any) -> None:
        self.hits += 1

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    async def items(self, n: int) -> AsyncIterator[bytes]:
        """A generator endpoint: ``n`` items of the echo's payload size."""
        for _ in range(n):
            yield PAYLOAD

    @zmesh.endpoint
    async def embed_one(self, x: Any) -> Any:
        await asyncio.sleep(EMBED_COST)  # a model's forward pass: the same for 1 or 32
        return x

    @zmesh.endpoint(batch=32, batch_wait=0.002)
    async def embed_batch(self, xs: list[Any]) -> list[Any]:
        await asyncio.sleep(EMBED_COST)
        return xs


# The fixed cost of one invocation in the batching rows (a GPU kernel launch,
# a forward pass): what batching spreads over many calls.
EMBED_COST = 0.002


# ---------------------------------------------------------------- helpers


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def med(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def cpu_s(pids: list[int]) -> float:
    """CPU seconds (every thread, nanosecond resolution) used so far by ``pids``.

    Clock ticks (``/proc/PID/stat``) are 10 ms: a short fan-out round can
    cost less than one and would read as no CPU at all. The scheduler's own
    count per thread (``/proc/PID/task/TID/schedstat``) is in nanoseconds;
    ticks are the fallback where it is missing.
    """
    total = 0.0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        ns, ok = 0, True
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    ns += int(f.read().split()[0])
            except FileNotFoundError:
                continue  # a thread that just ended
            except (OSError, ValueError, IndexError):
                ok = False
                break
        if ok:
            total += ns / 1e9
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def forkserver_of(agent_pid: int) -> int:
    """The pid of the agent's forkserver (its child named ``zmesh-fork``), or 0."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if int(fields[1]) == agent_pid and comm == "zmesh-fork":
            return int(entry)
    return 0


def rss_mb(pid: int) -> float:
    """VmRSS of ``pid`` in MB (1e6 bytes)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    return float("nan")


# ---------------------------------------------------------------- raw baseline


RAW_ECHO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "raw_echo.py")


def start_raw_servers(n: int) -> list[subprocess.Popen[str]]:
    """Start ``n`` raw echo servers (tools/raw_echo.py: asyncio and pyzmq only)."""
    return [
        subprocess.Popen([sys.executable, RAW_ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
        for _ in range(n)
    ]  # fmt: skip


def stop_raw_servers(servers: list[subprocess.Popen[str]]) -> None:
    for srv in servers:
        if srv.stdin is not None:
            srv.stdin.close()  # a server exits when its stdin closes
    for srv in servers:
        try:
            srv.wait(timeout=5)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


class RawClient:
    """DEALER side of the raw echo; replies come back in order (FIFO of futures)."""

    def __init__(self, addr: str, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 100_000)
        self.sock.setsockopt(zmq.RCVHWM, 100_000)
        self.sock.connect(addr)
        self.waiters: deque[asyncio.Future[Any]] = deque()
        self.pending: deque[list[Any]] = deque()
        self.copy = True
        self.scheduled = False
        self.fd = self.sock.getsockopt(zmq.FD)
        loop.add_reader(self.fd, self._ready)

    def request(self, frames: list[Any]) -> asyncio.Future[Any]:
        fut = self.loop.create_future()
        self.waiters.append(fut)
        if self.pending:
            self.pending.append(frames)
        else:
            try:
                self.sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self.pending.append(frames)
        # Edge-triggered FD: the send may have consumed the edge of a reply.
        if not self.scheduled and self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self.scheduled = True
            self.loop.call_soon(self._ready)
        return fut

    def _ready(self) -> None:
        self.scheduled = False
        sock = self.sock
        while True:
            ev = sock.getsockopt(zmq.EVENTS)
            while self.pending and ev & zmq.POLLOUT:
                try:
                    sock.send_multipart(self.pending[0], zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self.pending.popleft()
                ev = sock.getsockopt(zmq.EVENTS)
            if not ev & zmq.POLLIN:
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=self.copy)
            except zmq.Again:
                continue
            self.waiters.popleft().set_result(frames)

    def close(self) -> None:
        self.loop.remove_reader(self.fd)
        self.sock.close(linger=0)


# ---------------------------------------------------------------- measurements


async def lat_async(call: Any, n: int) -> list[float]:
    """Round trip samples in µs of ``await call()``."""
    out = []
    pc = time.perf_counter_ns
    for _ in range(n):
        t = pc()
        await call()
        out.append((pc() - t) / 1000)
    return out


def lat_sync(call: Any, n: int) -> list[float]:
    out = []
    pc = time.perf_counter_ns
    for _ in range(n):
        t = pc()
        call().get(timeout=30)
        out.append((pc() - t) / 1000)
    return out


def lat_sync_pair(
    addr: str, call: Callable[[], Any] | None, n: int, chunks: int
) -> tuple[list[float], list[float]]:
    """Round trip samples in µs of the raw blocking DEALER (the raw sync baseline,
    ``send`` then ``recv``) and of ``call().get()``,
    ``n`` each, in ``chunks`` alternating chunks in this one thread (no loop).

    Each side's p50 drifts 2-4x within seconds on a shared machine (the
    raw side alone moved 240-980 µs between chunks of 300 calls in one
    run); measuring the two sides in turns of ~100 ms lets drift hit both.
    The order flips every chunk."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    pc = time.perf_counter_ns
    raw: list[float] = []
    zm: list[float] = []
    try:
        for _ in range(20):  # connect and warm up
            sock.send(PAYLOAD)
            sock.recv()
            if call is not None:
                call().get(timeout=30)
        per = max(1, n // chunks)
        for c in range(chunks):
            for side in ("raw", "zmesh") if c % 2 == 0 else ("zmesh", "raw"):
                if side == "raw":
                    for _ in range(per):
                        t = pc()
                        sock.send(PAYLOAD)
                        sock.recv()
                        raw.append((pc() - t) / 1000)
                elif call is not None:
                    for _ in range(per):
                        t = pc()
                        call().get(timeout=30)
                        zm.append((pc() - t) / 1000)
        return raw, zm
    finally:
        sock.close(linger=0)


async def pipelined(start: Any, total: int, window: int = WINDOW) -> float:
    """Calls per second with ``window`` in flight (sliding window, oldest first)."""
    inflight: deque[Any] = deque()
    t = time.perf_counter()
    sent = 0
    while sent < min(window, total):
        inflight.append(start())
        sent += 1
    while inflight:
        await inflight.popleft()
        if sent < total:
            inflight.append(start())
            sent += 1
    return total / (time.perf_counter() - t)


async def streamed(ref: Any, total: int) -> float:
    """Items per second from one generator endpoint, read with ``async for``."""
    t = time.perf_counter()
    got = 0
    async for _ in ref.items.call_one(total):
        got += 1
    assert got == total
    return total / (time.perf_counter() - t)


async def bulk(call: Any, n: int) -> float:
    """GB/s (1e9 B/s) of payload: 1 MiB per round trip / round trip time (median)."""
    samples = await lat_async(call, n)
    return MIB / (med(samples) / 1e6) / 1e9


async def check_echo(raw: RawClient, ref: Any) -> None:
    got = await raw.request([PAYLOAD])
    assert bytes(got[0]) == PAYLOAD, got
    assert await ref.echo.call_one(PAYLOAD) == PAYLOAD
    raw.copy = False
    got = await raw.request([BIG])
    raw.copy = True
    assert got[0].bytes == BIG
    assert await ref.echo.call_one(BIG) == BIG
    view = await ref.echo.call_one(BIG_VIEW)
    assert type(view) is memoryview and view == BIG_VIEW


# ---------------------------------------------------------------- cold start

COLD_SCRIPT = textwrap.dedent(
    """
    import time
    T0 = time.perf_counter()
    import asyncio, json, os
    import zmesh
    T_IMPORT = time.perf_counter()


    class Cold(zmesh.Actor):
        @zmesh.endpoint
        async def ping(self) -> int:
            return os.getpid()


    async def main() -> None:
        t_main = time.perf_counter()
        mesh = await Cold.options(procs=4).as_actor()
        t_spawned = time.perf_counter()
        await mesh.slice(procs=0).ping.call_one()
        t_first = time.perf_counter()
        await mesh.ping.call()
        t_all = time.perf_counter()
        print("COLD " + json.dumps({
            "import_s": T_IMPORT - T0,
            "main_to_spawned_s": t_spawned - t_main,
            "main_to_first_reply_s": t_first - t_main,
            "main_to_all_replies_s": t_all - t_main,
            "script_start_to_first_reply_s": t_first - T0,
        }), flush=True)


    if __name__ == "__main__":
        asyncio.run(main())
    """
)


def cold_start(tmpdir: str) -> dict[str, float]:
    path = os.path.join(tmpdir, "zmesh_cold_start.py")
    with open(path, "w") as f:
        f.write(COLD_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "ZMESH_AGENTS"}
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, path], capture_output=True, text=True, env=env, cwd=tmpdir, timeout=120
    )
    wall = time.perf_counter() - t
    line = next((x for x in proc.stdout.splitlines() if x.startswith("COLD ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"cold start run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    out = json.loads(line[5:])
    out["total_wall_s"] = wall  # interpreter start to exit, teardown included
    return out


# ---------------------------------------------------------------- ray


def ray_bench(cfg: dict[str, int], rounds: int) -> dict[str, Any]:
    try:
        import ray
    except Exception as exc:  # not installed, or broken
        return {"skipped": f"ray not installed: skipped (pip install -e '.[bench]') [ray: {exc}]"}

    t = time.perf_counter()
    ray.init(num_cpus=max(4, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - t

    @ray.remote
    class Pinger:
        def ping(self, x: Any) -> Any:
            return x

    try:
        creates, lats, p99s, tputs, fans = [], [], [], [], []
        for _ in range(rounds):
            t = time.perf_counter()
            actors = [Pinger.remote() for _ in range(4)]
            ray.get([a.ping.remote(b"") for a in actors])
            creates.append(time.perf_counter() - t)
            a = actors[0]
            for _ in range(20):
                ray.get(a.ping.remote(PAYLOAD))
            samples = []
            for _ in range(cfg["lat_n"] // 2):
                s = time.perf_counter_ns()
                ray.get(a.ping.remote(PAYLOAD))
                samples.append((time.perf_counter_ns() - s) / 1000)
            lats.append(pct(samples, 50))
            p99s.append(pct(samples, 99))
            n = max(WINDOW, cfg["pipe_n"] // 4)
            t = time.perf_counter()
            refs: deque[Any] = deque(a.ping.remote(PAYLOAD) for _ in range(WINDOW))
            sent = WINDOW
            while refs:
                ray.get(refs.popleft())
                if sent < n:
                    refs.append(a.ping.remote(PAYLOAD))
                    sent += 1
            tputs.append(n / (time.perf_counter() - t))
            fs = []
            for _ in range(cfg["fan_n"]):
                s = time.perf_counter_ns()
                ray.get([x.ping.remote(PAYLOAD) for x in actors])
                fs.append((time.perf_counter_ns() - s) / 1000)
            fans.append(pct(fs, 50))
            for x in actors:
                ray.kill(x)
        return {
            "version": ray.__version__,
            "init_s": init_s,
            "create4_s": med(creates),
            "lat_p50_us": med(lats),
            "lat_p99_us": med(p99s),
            "pipelined_per_s": med(tputs),
            "fanout4_p50_us": med(fans),
        }
    finally:
        ray.shutdown()


# ---------------------------------------------------------------- main run


CONFIGS = {
    "quick": {"rounds": 3, "lat_n": 300, "pipe_n": 4000, "big_n": 15, "fan_n": 20, "fan_rounds": 2,
              "cold_n": 1},
    "full": {
        "rounds": 5, "lat_n": 2000, "pipe_n": 20000, "big_n": 60, "fan_n": 150, "fan_rounds": 3,
        "cold_n": 3,
    },
}  # fmt: skip


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# The row groups a run can be limited to (``--rows``), in the order they run.
ROWS = ("cold", "latency", "sync", "spawn", "fanout", "actors", "tree", "http", "ray")
ROW_HELP = {
    "cold": "cold start in a fresh interpreter",
    "latency": "call_one, sync .get(), pipelined, 1 MiB, batching, RSS (against raw pyzmq)",
    "sync": "a def endpoint against an async def one, call_one p50 alternating",
    "spawn": "spawn 64 procs on the warm agent, once per round",
    "fanout": "call/broadcast to 4, 16, 64 procs (against 64 raw servers); spawn 64 once",
    "actors": "fan-out to 8 procs x 32 actors and 2 x 32",
    "tree": "tree vs flat, 16 loopback agents x 4 procs (tools/bench_tree.py)",
    "http": "zmesh http: p50, requests/s, SSE items/s (tools/bench_http.py; Ray Serve too)",
    "ray": "Ray's actor call, pipelined, fan-out to 4, create 4 (when installed)",
}


async def run(cfg: dict[str, int], tmpdir: str, rows: tuple[str, ...] = ROWS) -> dict[str, Any]:
    res: dict[str, Any] = {"cold": {}, "rss_mb": {}}
    rounds: dict[str, list[float]] = {}

    def keep(key: str, value: float) -> None:
        rounds.setdefault(key, []).append(value)

    if "cold" in rows:  # first, before this process has any agent or procs
        log(f"cold start x{cfg['cold_n']} (fresh interpreter, 4 procs, embedded agent)")
        colds = [cold_start(tmpdir) for _ in range(cfg["cold_n"])]
        res["cold"] = {k: med([c[k] for c in colds]) for k in colds[0]}
        rounds["cold_main_to_first_reply_s"] = [c["main_to_first_reply_s"] for c in colds]
    if "latency" in rows or "sync" in rows:
        await singleton_rows(cfg, res, keep, rows)
    if "spawn" in rows:
        await spawn_rows(cfg, keep)
    if "fanout" in rows:
        await fanout_rows(cfg, keep)
    if "actors" in rows:
        await actors_per_proc_rows(cfg, keep)
    res["rounds"] = rounds
    res["median"] = {k: med(v) for k, v in rounds.items()}
    return res


async def singleton_rows(
    cfg: dict[str, int], res: dict[str, Any], keep: Callable[[str, float], None],
    rows: tuple[str, ...],
) -> None:  # fmt: skip
    """One proc: against raw pyzmq (``latency``), and its def against async def (``sync``)."""
    loop = asyncio.get_running_loop()
    log("starting raw echo server and zmesh singleton")
    [srv] = start_raw_servers(1)
    try:
        assert srv.stdout is not None
        addr = srv.stdout.readline().strip()
        raw = RawClient(addr, loop)
        t = time.perf_counter()
        one = await BenchActor.options(procs=1).as_actor()
        res["spawn1_s"] = time.perf_counter() - t
        ref = one.slice(procs=0)
        proc_pid = await ref.pid.call_one()
        agent_pid = zmesh._client.control.local._embedded[0][0].pid
        await check_echo(raw, ref)
        if "sync" in rows:
            await sync_endpoint_rows(cfg, ref, keep)
        if "latency" not in rows:
            raw.close()
            await one.stop()
            return
        await asyncio.sleep(1.0)  # settle, then idle RSS
        res["rss_mb"] = {
            "proc_idle": rss_mb(proc_pid),
            "agent_idle": rss_mb(agent_pid),
            "forkserver_idle": rss_mb(forkserver_of(agent_pid)),
            "raw_server_idle": rss_mb(srv.pid),
        }

        # Warm up both sides (connections, code paths, allocator).
        for _ in range(200):
            await raw.request([PAYLOAD])
            await ref.echo.call_one(PAYLOAD)
        await loop.run_in_executor(None, lat_sync, lambda: ref.echo.call_one(PAYLOAD), 100)

        def raw_call() -> Any:
            return raw.request([PAYLOAD])

        def zm_call() -> Any:
            return ref.echo.call_one(PAYLOAD)

        def raw_big() -> Any:
            return raw.request([BIG])

        def zm_big() -> Any:
            return ref.echo.call_one(BIG)

        def zm_big_view() -> Any:
            return ref.echo.call_one(BIG_VIEW)

        # Each side's async call, and its blocking (.get()) latency run.
        latency = {"raw": raw_call, "zmesh": zm_call}
        # The blocking rows: both sides in one thread with no loop, in turns.
        sync_pair = functools.partial(lat_sync_pair, addr, zm_call, cfg["lat_n"], 10)
        for r in range(cfg["rounds"]):
            log(f"round {r + 1}/{cfg['rounds']}: latency, pipelined, 1 MiB")
            order = ("raw", "zmesh") if r % 2 == 0 else ("zmesh", "raw")
            for side in order:
                s = await lat_async(latency[side], cfg["lat_n"])
                keep(f"{side}_p50_us", pct(s, 50))
                keep(f"{side}_p99_us", pct(s, 99))
            raw_s, zm_s = await loop.run_in_executor(None, sync_pair)
            for side, s in (("raw", raw_s), ("zmesh", zm_s)):
                keep(f"{side}_get_p50_us", pct(s, 50))
                keep(f"{side}_get_p99_us", pct(s, 99))
            for side in order:
                if side == "raw":
                    keep("raw_pipelined_per_s", await pipelined(raw_call, cfg["pipe_n"]))
                else:
                    keep("zmesh_pipelined_per_s", await pipelined(zm_call, cfg["pipe_n"]))
                    keep("stream_items_per_s", await streamed(ref, cfg["pipe_n"]))
            for side in order:
                if side == "raw":
                    raw.copy = False
                    keep("raw_1mib_gbps", await bulk(raw_big, cfg["big_n"]))
                    raw.copy = True
                else:
                    keep("zmesh_1mib_gbps", await bulk(zm_big, cfg["big_n"]))
                    keep("zmesh_1mib_view_gbps", await bulk(zm_big_view, cfg["big_n"]))

        res["rss_mb"]["proc_after_load"] = rss_mb(proc_pid)
        res["rss_mb"]["agent_after_load"] = rss_mb(agent_pid)
        # Request batching: single calls, 64 in flight, to an endpoint with a
        # fixed cost per invocation, unbatched and batched (batch=32).
        log(f"batching: {EMBED_COST * 1e3:.0f} ms per invocation, 64 in flight")
        n = cfg["pipe_n"] // 10
        keep(
            "embed_unbatched_per_s", await pipelined(lambda: one.embed_one.call_one(1), n // 10, 64)
        )
        keep("embed_batched_per_s", await pipelined(lambda: one.embed_batch.call_one(1), n, 64))
        raw.close()
        await one.stop()
    finally:
        stop_raw_servers([srv])


async def sync_endpoint_rows(
    cfg: dict[str, int], ref: Any, keep: Callable[[str, float], None]
) -> None:
    """A ``def`` endpoint against an ``async def`` one on the same actor: call_one p50.

    Both echo 64 B. Per round, 10 chunks alternate (the order flips every
    chunk), so drift on a shared machine hits both sides; the ratio is taken
    per round, and the row is the median of those ratios.
    """
    for _ in range(100):  # warm up the worker thread and both paths
        await ref.echo_sync.call_one(PAYLOAD)
        await ref.echo.call_one(PAYLOAD)
    per = max(10, cfg["lat_n"] // 10)
    for r in range(cfg["rounds"]):
        log(f"round {r + 1}/{cfg['rounds']}: def endpoint against async def endpoint")
        got: dict[str, list[float]] = {"async": [], "sync": []}
        for c in range(10):
            for side in ("async", "sync") if c % 2 == 0 else ("sync", "async"):
                ep = ref.echo if side == "async" else ref.echo_sync
                got[side] += await lat_async(lambda ep=ep: ep.call_one(PAYLOAD), per)
        a, s = pct(got["async"], 50), pct(got["sync"], 50)
        keep("async_ep_p50_us", a)
        keep("sync_ep_p50_us", s)
        keep("sync_ep_ratio", s / a)


async def spawn_rows(cfg: dict[str, int], keep: Callable[[str, float], None]) -> None:
    """Spawn 64 procs on a warm agent, once per round (then stop them)."""
    warm = await BenchActor.options(procs=1).as_actor()  # starts the agent if none runs
    try:
        for r in range(cfg["rounds"]):
            log(f"round {r + 1}/{cfg['rounds']}: spawn {max(FANOUT)} procs")
            t = time.perf_counter()
            mesh = await BenchActor.options(procs=max(FANOUT)).as_actor()
            keep("spawn64_s", time.perf_counter() - t)
            await mesh.ping.call()
            await mesh.stop()
    finally:
        await warm.stop()


async def fanout_rows(cfg: dict[str, int], keep: Callable[[str, float], None]) -> None:
    """Fan-out: one mesh of max(FANOUT) procs, sliced; the raw side is as many
    raw echo servers, one process each, sent to at once and gathered."""
    loop = asyncio.get_running_loop()
    n_max = max(FANOUT)
    log(f"spawning {n_max} procs for fan-out, and {n_max} raw echo servers")
    t = time.perf_counter()
    big_mesh = await BenchActor.options(procs=n_max).as_actor()
    keep("spawn64_s", time.perf_counter() - t)
    raw_servers = start_raw_servers(n_max)
    raws: list[RawClient] = []
    try:
        for rs in raw_servers:
            assert rs.stdout is not None
            raws.append(RawClient(rs.stdout.readline().strip(), loop))
        for rc in raws:
            await rc.request([PAYLOAD])
        # Every process a fan-out keeps busy, for the CPU it costs per fan-out.
        raw_pids = [os.getpid()] + [rs.pid for rs in raw_servers]
        zm_pids = [os.getpid(), zmesh._client.control.local._embedded[0][0].pid]
        zm_pids += list((await big_mesh.pid.call()).values())
        await big_mesh.ping.call()
        meshes = {n: big_mesh.slice(procs=slice(0, n)) for n in FANOUT}
        for m in meshes.values():
            for _ in range(5):
                await m.ping.call()
        for r in range(cfg["fan_rounds"]):
            log(f"fan-out round {r + 1}/{cfg['fan_rounds']}")
            for n, m in meshes.items():
                targets = raws[:n]

                def raw_fan(targets: list[RawClient] = targets) -> Any:
                    return asyncio.gather(*[rc.request([PAYLOAD]) for rc in targets])

                order = ("raw", "zmesh") if r % 2 == 0 else ("zmesh", "raw")
                for side in order:
                    if side == "raw":
                        c0 = cpu_s(raw_pids)
                        s = await lat_async(raw_fan, cfg["fan_n"])
                        keep(f"raw_call{n}_cpu_us", (cpu_s(raw_pids) - c0) / len(s) * 1e6)
                        keep(f"raw_call{n}_p50_us", pct(s, 50))
                    else:
                        c0 = cpu_s(zm_pids)
                        s = await lat_async(lambda m=m: m.ping.call(), cfg["fan_n"])
                        keep(f"call{n}_cpu_us", (cpu_s(zm_pids) - c0) / len(s) * 1e6)
                        keep(f"call{n}_p50_us", pct(s, 50))
                        keep(f"call{n}_p99_us", pct(s, 99))

                async def bcast(m: Any = m) -> None:
                    m.hit.broadcast(PAYLOAD)
                    await m.ping.call()  # per-sender order: all have run hit()

                s = await lat_async(bcast, cfg["fan_n"])
                keep(f"bcast{n}_p50_us", pct(s, 50))
                if n == 16:  # a reduction: folded as replies arrive, or call then fold
                    acc = zmesh.Accumulator(m.ping, 0, operator.add)
                    s = await lat_async(acc.accumulate, cfg["fan_n"])
                    keep("accumulate16_p50_us", pct(s, 50))

                    async def call_fold(m: Any = m) -> int:
                        return sum((await m.ping.call()).values())

                    s = await lat_async(call_fold, cfg["fan_n"])
                    keep("call_fold16_p50_us", pct(s, 50))
                # The send side alone: how long broadcast() blocks the caller.
                s = []
                for _ in range(cfg["fan_n"]):
                    t0 = time.perf_counter_ns()
                    m.hit.broadcast(PAYLOAD)
                    s.append((time.perf_counter_ns() - t0) / 1000)
                    await m.ping.call()
                keep(f"bcast{n}_send_p50_us", pct(s, 50))
    finally:
        for rc in raws:
            rc.close()
        stop_raw_servers(raw_servers)
        await big_mesh.stop()


# Several actors per proc: (procs, actors per proc) of the rows, as slices of one mesh.
ACTOR_FANOUT = ((8, 32), (2, 32))


async def actors_per_proc_rows(cfg: dict[str, int], keep: Callable[[str, float], None]) -> None:
    """Fan-out to many actors in few procs: one message per proc, one reply per proc."""
    procs = max(p for p, _ in ACTOR_FANOUT)
    per = max(a for _, a in ACTOR_FANOUT)
    log(f"spawning {procs} procs x {per} actors for the actors-per-proc fan-out")
    t = time.perf_counter()
    mesh = await BenchActor.options(procs=procs, actors_per_proc=per).as_actor()
    keep("spawn_actors_s", time.perf_counter() - t)  # the agent is warm (the rows above)
    try:
        meshes = {
            (p, a): mesh.slice(procs=slice(0, p), actors=slice(0, a)) for p, a in ACTOR_FANOUT
        }
        for m in meshes.values():
            for _ in range(5):
                await m.ping.call()
        for r in range(cfg["fan_rounds"]):
            log(f"actors-per-proc fan-out round {r + 1}/{cfg['fan_rounds']}")
            for (p, a), m in meshes.items():
                s = await lat_async(lambda m=m: m.ping.call(), cfg["fan_n"])
                keep(f"actors{p}x{a}_p50_us", pct(s, 50))
                keep(f"actors{p}x{a}_p99_us", pct(s, 99))
    finally:
        await mesh.stop()


def summarize(res: dict[str, Any], ray: dict[str, Any]) -> dict[str, Any]:
    """Each measured row with its raw (``raw``) or zmesh (``base``) side, and the targets.

    A run limited to some rows (``--rows``) has only their results and targets.
    """
    m = res["median"]
    cold = res["cold"]
    rss = res["rss_mb"]
    results: dict[str, Any] = {}

    def put(key: str, zkey: str, other: str = "", side: str = "raw") -> None:
        if zkey not in m:
            return
        results[key] = {"zmesh": m[zkey]}
        if other in m:
            results[key][side] = m[other]
            if side == "base":
                results[key]["ratio_vs_base"] = m[zkey] / m[other] if m[other] else float("nan")

    put("call_one_p50_us", "zmesh_p50_us", "raw_p50_us")
    put("call_one_p99_us", "zmesh_p99_us", "raw_p99_us")
    put("call_one_get_p50_us", "zmesh_get_p50_us", "raw_get_p50_us")
    put("call_one_get_p99_us", "zmesh_get_p99_us", "raw_get_p99_us")
    put("pipelined_per_s", "zmesh_pipelined_per_s", "raw_pipelined_per_s")
    put("bulk_1mib_gbps", "zmesh_1mib_gbps", "raw_1mib_gbps")
    put("bulk_1mib_view_gbps", "zmesh_1mib_view_gbps", "raw_1mib_gbps")
    for n in FANOUT:
        put(f"call_fanout{n}_p50_us", f"call{n}_p50_us", f"raw_call{n}_p50_us")
        put(f"call_fanout{n}_p99_us", f"call{n}_p99_us")
        put(f"call_fanout{n}_cpu_us", f"call{n}_cpu_us", f"raw_call{n}_cpu_us")
        put(f"broadcast_fanout{n}_p50_us", f"bcast{n}_p50_us")
        put(f"broadcast_send{n}_p50_us", f"bcast{n}_send_p50_us")
    # Against zmesh itself, in the same run (``base``: what it is measured against).
    put("stream_items_per_s", "stream_items_per_s", "zmesh_pipelined_per_s", "base")
    put("accumulate16_p50_us", "accumulate16_p50_us", "call_fold16_p50_us", "base")
    put("sync_endpoint_p50_us", "sync_ep_p50_us", "async_ep_p50_us", "base")
    if "sync_ep_ratio" in m:  # the median of per-round ratios: each round's sides alternate
        results["sync_endpoint_p50_us"]["ratio_vs_base"] = m["sync_ep_ratio"]
    for k, v in cold.items():
        results[f"cold_{k}"] = {"zmesh": v}
    if "embed_batched_per_s" in m:
        results["batched_per_s"] = {
            "zmesh": m["embed_batched_per_s"], "unbatched": m["embed_unbatched_per_s"],
            "speedup": m["embed_batched_per_s"] / m["embed_unbatched_per_s"],
        }  # fmt: skip
    for p, a in ACTOR_FANOUT:  # against the 64-proc fan-out of the same run
        put(f"call_actors{p}x{a}_p50_us", f"actors{p}x{a}_p50_us", "call64_p50_us", "base")
        put(f"call_actors{p}x{a}_p99_us", f"actors{p}x{a}_p99_us")
    if "spawn1_s" in res:
        results["spawn1_s"] = {"zmesh": res["spawn1_s"]}
    put("spawn64_s", "spawn64_s")
    put("spawn_actors8x32_s", "spawn_actors_s")
    for k, v in rss.items():
        if k.startswith("raw"):
            continue
        results[f"rss_{k}_mb"] = {"zmesh": v, "raw": rss["raw_server_idle"]}
    for v in results.values():
        if "raw" in v:  # always written: NaN says the raw figure was 0
            v["ratio"] = v["zmesh"] / v["raw"] if v["raw"] else float("nan")
    if "skipped" not in ray and "zmesh_p50_us" in m:
        results["ray_lat_p50_us"] = {"zmesh": m["zmesh_p50_us"], "ray": ray["lat_p50_us"]}
        results["ray_pipelined_per_s"] = {
            "zmesh": m["zmesh_pipelined_per_s"], "ray": ray["pipelined_per_s"],
        }  # fmt: skip
        if "call4_p50_us" in m:
            results["ray_fanout4_p50_us"] = {
                "zmesh": m["call4_p50_us"],
                "ray": ray["fanout4_p50_us"],
            }
        if cold:
            results["ray_create4_s"] = {"zmesh": cold["main_to_spawned_s"], "ray": ray["create4_s"]}
        for v in (results[k] for k in results if k.startswith("ray_")):
            v["ratio_vs_ray"] = v["zmesh"] / v["ray"] if v["ray"] else float("nan")
    r = results
    # (name, how to read the value, op, limit, unit); a row the run left out has none.
    wanted: list[tuple[str, Callable[[], float], str, float, str]] = [
        ("call_one p50 vs raw", lambda: r["call_one_p50_us"]["ratio"], "<=", 1.2, "x raw"),
        ("sync .get() call_one p50 vs raw sync", lambda: r["call_one_get_p50_us"]["ratio"], "<=",
         1.15, "x raw"),
        ("def endpoint call_one p50 vs async def",
         lambda: r["sync_endpoint_p50_us"]["ratio_vs_base"], "<=", 1.3, "x async"),
        ("pipelined vs raw", lambda: r["pipelined_per_s"]["ratio"], ">=", 0.8, "x raw"),
        ("1 MiB GB/s vs raw (memoryview, zero-copy)", lambda: r["bulk_1mib_view_gbps"]["ratio"],
         ">=", 0.8, "x raw"),
        ("fan-out call to 64 p50", lambda: r["call_fanout64_p50_us"]["zmesh"] / 1000, "<=", 5.0,
         "ms"),
        ("fan-out to 256 actors (8 procs x 32) p50",
         lambda: r["call_actors8x32_p50_us"]["zmesh"] / 1000, "<=", 5.0, "ms"),
        ("fan-out to 64 actors (2 procs x 32) p50",
         lambda: r["call_actors2x32_p50_us"]["zmesh"] / 1000, "<=", 2.0, "ms"),
        ("fan-out to 64 actors (2 procs x 32) vs to 64 procs",
         lambda: r["call_actors2x32_p50_us"]["ratio_vs_base"], "<=", 0.3, "x 64 procs"),
        ("streamed items/s vs pipelined call_one",
         lambda: r["stream_items_per_s"]["ratio_vs_base"], ">=", 0.8, "x calls"),
        ("cold start (main -> first reply)", lambda: cold["main_to_first_reply_s"], "<=", 1.0, "s"),
        ("spawn 64 procs, warm agent", lambda: r["spawn64_s"]["zmesh"], "<=", 0.5, "s"),
        ("spawn 256 actors (8 procs x 32), agent warm", lambda: r["spawn_actors8x32_s"]["zmesh"],
         "<=", 0.5, "s"),
        ("idle proc RSS", lambda: rss["proc_idle"], "<=", 60.0, "MB"),
        ("agent RSS", lambda: rss["agent_idle"], "<=", 60.0, "MB"),
        ("latency vs Ray", lambda: ray["lat_p50_us"] / m["zmesh_p50_us"], ">=", 5.0, "x lower"),
        ("throughput vs Ray", lambda: m["zmesh_pipelined_per_s"] / ray["pipelined_per_s"], ">=",
         20.0, "x higher"),
    ]  # fmt: skip
    targets = []
    for name, read, op, limit, unit in wanted:
        try:
            value = read()
        except KeyError:  # not measured in this run
            continue
        targets.append(target(name, value, op, limit, unit))
    return {"results": results, "targets": targets}


def target(name: str, value: float, op: str, limit: float, unit: str) -> dict[str, Any]:
    """One row of the targets table: ``value`` against its goal ``op limit``."""
    met = value <= limit if op == "<=" else value >= limit
    return {"name": name, "value": value, "op": op, "limit": limit, "unit": unit, "met": met}


def machine() -> dict[str, Any]:
    import msgspec

    return {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "msgspec": msgspec.__version__,
        "zmesh": zmesh.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def render(report: dict[str, Any], markdown: bool = False) -> None:
    """Print the report's tables (as Markdown pipe tables for the docs)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table as RichTable

    r = report["results"]
    console = Console(width=200, no_color=True) if markdown else Console()

    def new_table(title: str) -> Any:
        if markdown:
            console.print(f"\n{title}\n", markup=False)
            return RichTable(box=box.MARKDOWN)
        return RichTable(title=title)

    def us(v: float) -> str:
        return f"{v:,.0f} µs" if v < 10_000 else f"{v / 1000:,.1f} ms"

    table = new_table(title=f"zmesh vs raw pyzmq ({report['mode']}, medians of rounds)")
    for col, just in (("metric", "left"), ("zmesh", "right"), ("raw pyzmq", "right"),
                      ("zmesh/raw", "right")):  # fmt: skip
        table.add_column(col, justify=just)  # type: ignore[arg-type]

    def row(label: str, key: str, fmt: Any) -> None:
        v = r.get(key)
        if v is None:  # a run saved by an older bench
            return
        raw = fmt(v["raw"]) if "raw" in v else "—"
        ratio = f"{v['ratio']:.2f}x" if "ratio" in v else "—"
        table.add_row(label, fmt(v["zmesh"]), raw, ratio)

    row("call_one round trip p50 (await)", "call_one_p50_us", us)
    row("call_one round trip p99 (await)", "call_one_p99_us", us)
    row("sync .get() call_one p50 (raw: sync DEALER)", "call_one_get_p50_us", us)
    row("sync .get() call_one p99 (raw: sync DEALER)", "call_one_get_p99_us", us)
    row(f"pipelined call_one, {WINDOW} in flight", "pipelined_per_s", lambda v: f"{v:,.0f}/s")
    gbps = lambda v: f"{v:.2f} GB/s"  # noqa: E731
    row("1 MiB memoryview round trip (zero-copy)", "bulk_1mib_view_gbps", gbps)
    row("1 MiB bytes round trip (a copy on arrival)", "bulk_1mib_gbps", gbps)
    for n in FANOUT:
        row(f"call fan-out to {n} procs, p50", f"call_fanout{n}_p50_us", us)
    for n in FANOUT:
        row(f"  CPU per fan-out to {n}, all processes", f"call_fanout{n}_cpu_us", us)
    for n in FANOUT:
        row(f"broadcast to {n} + call barrier, p50", f"broadcast_fanout{n}_p50_us", us)
    for n in FANOUT:
        row(f"broadcast() send side only ({n}), p50", f"broadcast_send{n}_p50_us", us)
    b = r.get("batched_per_s")
    if b is not None:
        table.add_row(
            f"batch=32 vs single calls ({EMBED_COST * 1e3:.0f} ms per invocation, 64 in flight)",
            f"{b['zmesh']:,.0f}/s", f"{b['unbatched']:,.0f}/s unbatched", f"{b['speedup']:.1f}x",
        )  # fmt: skip
    sec = lambda v: f"{v:.2f} s"  # noqa: E731
    row("cold start: import zmesh", "cold_import_s", sec)
    row("cold start: main -> 4 procs spawned", "cold_main_to_spawned_s", sec)
    row("cold start: main -> first reply", "cold_main_to_first_reply_s", sec)
    row("cold start: total wall (start..exit)", "cold_total_wall_s", sec)
    row("spawn 1 proc (starts the embedded agent)", "spawn1_s", sec)
    row("spawn 64 procs (agent warm)", "spawn64_s", sec)
    if "spawn_actors8x32_s" in r:
        row("spawn 256 actors (8 procs x 32), agent warm", "spawn_actors8x32_s", sec)
    mb = lambda v: f"{v:.1f} MB"  # noqa: E731
    row("RSS idle proc (raw: echo server)", "rss_proc_idle_mb", mb)
    row("RSS agent (raw: echo server)", "rss_agent_idle_mb", mb)
    row("RSS agent's forkserver (raw: echo server)", "rss_forkserver_idle_mb", mb)
    row("RSS proc after the load", "rss_proc_after_load_mb", mb)
    console.print(table)

    if any(
        k in r for k in ("stream_items_per_s", "sync_endpoint_p50_us", "call_actors8x32_p50_us")
    ):
        st = new_table(title="streams, reductions, actors per proc (against zmesh, same run)")
        for col in ("metric", "zmesh", "against", "ratio"):
            st.add_column(col, justify="left" if col == "metric" else "right")
        for label, key, fmt, against in (
            ("items/s from one generator endpoint", "stream_items_per_s",
             lambda v: f"{v:,.0f}/s", "pipelined call_one"),
            ("Accumulator over 16 actors, p50", "accumulate16_p50_us", us,
             "call() then a local fold"),
            ("def endpoint call_one p50 (ratio: median of rounds)", "sync_endpoint_p50_us", us,
             "async def endpoint"),
            ("call fan-out to 256 actors (8 procs x 32), p50", "call_actors8x32_p50_us", us,
             "fan-out to 64 procs"),
            ("call fan-out to 64 actors (2 procs x 32), p50", "call_actors2x32_p50_us", us,
             "fan-out to 64 procs"),
        ):  # fmt: skip
            v = r.get(key)
            if v is None or "base" not in v:  # an older bench's run, or a row left out
                continue
            st.add_row(
                label, fmt(v["zmesh"]), f"{fmt(v['base'])} ({against})",
                f"{v['ratio_vs_base']:.2f}x",
            )  # fmt: skip
        console.print(st)

    if "skipped" in report["ray"]:
        console.print(report["ray"]["skipped"].split(" [ray")[0], markup=False)
    else:
        rt = new_table(title=f"zmesh vs Ray {report['ray']['version']}")
        for col in ("metric", "zmesh", "Ray", "zmesh/Ray"):
            rt.add_column(col, justify="left" if col == "metric" else "right")
        for label, key, fmt in (
            ("actor call p50", "ray_lat_p50_us", us),
            (f"pipelined, {WINDOW} in flight", "ray_pipelined_per_s", lambda v: f"{v:,.0f}/s"),
            ("fan-out to 4, p50", "ray_fanout4_p50_us", us),
            ("create 4 actors (zmesh: spawn 4 procs, cold)", "ray_create4_s", sec),
        ):
            v = r.get(key)
            if v is None:  # its zmesh side was left out (--rows)
                continue
            rt.add_row(label, fmt(v["zmesh"]), fmt(v["ray"]), f"{v['ratio_vs_ray']:.3f}x")
        console.print(rt)
        console.print(f"ray.init: {report['ray']['init_s']:.2f} s")

    tt = new_table(title="targets")
    for col in ("target", "measured", "limit", "status"):
        tt.add_column(col, justify="left" if col in ("target", "status") else "right")
    for t in report["targets"]:
        status = (
            ("met" if markdown else "[green]met[/green]")
            if t["met"]
            else ("not met" if markdown else "[red]not met[/red]")
        )
        limit = f"{t['op']} {t['limit']} {t['unit']}"
        tt.add_row(t["name"], f"{t['value']:.2f} {t['unit']}", limit, status)
    console.print(tt)


def _tree_rows(wanted: bool, rounds: int) -> dict[str, Any]:
    """Tree vs flat fan-out on 16 loopback agents x 4 procs (tools/bench_tree.py)."""
    if not wanted:
        return {}
    log("tree vs flat fan-out: 16 agents x 4 procs")
    tree = bench_tree.measure(16, 4, rounds=rounds, n=50 if rounds == 1 else 100)
    zmesh.shutdown()
    return {"tree": tree}


def _http_rows(quick: bool, with_ray: bool) -> dict[str, Any]:
    """zmesh http: p50 and requests/s over keep-alive, SSE items/s (tools/bench_http.py);
    Ray Serve's HTTP ingress next to it when Ray is installed."""
    log("zmesh http gateway")
    if quick:
        res = bench_http.measure(1, 500, 5000, with_ray=with_ray)
    else:
        res = bench_http.measure(3, 2000, 20000, with_ray=with_ray)
    zmesh.shutdown()
    return {"http": res}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="~1 minute smoke run")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    ap.add_argument("--rounds", type=int, help="override the number of interleaved rounds")
    ap.add_argument("--no-ray", action="store_true", help="skip Ray even when installed")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables (for docs)")
    ap.add_argument("--from-json", metavar="PATH", help="print the tables of a saved run; no run")
    ap.add_argument("--tree", action="store_true", help="tree vs flat rows in quick mode too")
    ap.add_argument(
        "--rows", metavar="A,B",
        help="run only these rows (more --rounds resolve one row on a noisy machine):\n"
        + "\n".join(f"  {k}: {v}" for k, v in ROW_HELP.items()),
    )  # fmt: skip
    ap.add_argument("--sync-only", action="store_true", help="the same as --rows sync")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            render(json.load(f), markdown=args.markdown)
        return

    mode = "quick" if args.quick else "full"
    cfg = dict(CONFIGS[mode])
    if args.rounds:
        cfg["rounds"] = args.rounds
    rows = ROWS
    if args.sync_only or args.rows:
        rows = tuple(x.strip() for x in ("sync" if args.sync_only else args.rows).split(","))
        unknown = [x for x in rows if x not in ROWS]
        if unknown:
            ap.error(f"unknown rows {unknown}: choose from {', '.join(ROWS)}")
    elif not (args.tree or mode == "full"):
        rows = tuple(x for x in ROWS if x != "tree")
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="zmesh-bench-") as tmpdir:
        res = asyncio.run(run(cfg, tmpdir, rows))
    zmesh.shutdown()
    if args.no_ray or "ray" not in rows:
        ray = {"skipped": "ray: skipped (--no-ray or --rows)"}
    else:
        log("ray")
        ray = ray_bench(cfg, 1 if args.quick else 3)
    report = {
        "mode": mode,
        "command": " ".join(["python", "tools/bench.py", *sys.argv[1:]]),
        "config": cfg,
        "machine": machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "elapsed_s": time.time() - started,
        "ray": ray,
        **summarize(res, ray),
        **_tree_rows("tree" in rows, args.rounds or (1 if args.quick else 3)),
        **(_http_rows(args.quick, not args.no_ray) if "http" in rows else {}),
        "rows": list(rows),
        "rounds": res["rounds"],
        "cold": res["cold"],
        "rss_mb": res["rss_mb"],
    }
    if "tree" in report:  # its goal beside the others' (docs/scale.md says why it is missed here)
        tree, flat = report["tree"]["tree"], report["tree"]["flat"]
        report["targets"].append(
            target("tree call() p50 vs flat, 16 agents x 4 procs",
                   tree["call_p50_us"] / flat["call_p50_us"], "<=", 1.2, "x flat")
        )  # fmt: skip
    render(report, markdown=args.markdown)
    if "tree" in report:
        bench_tree.render(report["tree"])
    if "http" in report:
        bench_http.render(report["http"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=float)
        log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
