"""Tree fan-out vs flat: 16 loopback agents ("hosts") x 4 procs, in one run.

    python tools/bench_tree.py [--hosts 16] [--procs 4] [--rounds 3] [--n 100]

(``tools/bench.py`` runs it too: always in full mode, with ``--tree`` in
quick mode.) The two paths alternate, round by round, on the same mesh:
``flat`` is the direct path (``ZMESH_FANOUT=direct``: the client sends to
every proc), ``tree`` sends one message per host to a relay proc there. For
each: the p50 of ``call()`` on every proc, of ``broadcast()`` then
``call()`` (per-sender order makes the call wait for the broadcast), and the
ZeroMQ messages the client sent and received per fan-out, counted on its
sockets. And a reduction, ``Accumulator(mesh.value, 0, operator.add)``:
folded at the client (flat; tree, gathered) or at the relays (tree,
``associative=True``), with the messages and bytes that reached the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zmesh
from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls import tree as _tree
from zmesh.testing import local_cluster

PAYLOAD = b"x" * 64


class TreeBench(zmesh.Actor):
    @zmesh.endpoint
    async def ping(self) -> None:
        return None

    @zmesh.endpoint
    async def hit(self, data: bytes) -> None:
        return None

    @zmesh.endpoint
    async def value(self) -> int:
        return zmesh.current_rank().rank

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


_bytes = [0]  # bytes the client's proc connections received (see _count_bytes)


def _count_bytes() -> None:
    """Count the bytes of every reply frame this runtime receives from now on."""
    rt, _ = _runtime.current()
    inner = rt._on_reply

    def counted(conn: Any, frames: list[Any]) -> int | None:
        _bytes[0] += sum(len(f) for f in frames)
        return inner(conn, frames)

    rt._on_reply = counted  # type: ignore[method-assign]


def _counts() -> tuple[int, int]:
    """Messages this runtime's proc sockets have sent and received so far."""
    rt, _ = _runtime.current()
    socks = [c.sock for c in rt.conns.values() if c.sock is not None]
    return sum(s.sent for s in socks), sum(s.received for s in socks)


async def _timed(op: Any, n: int) -> tuple[float, float, float, float]:
    """p50 in µs of ``await op()``; client messages sent and received, and
    client CPU µs, per op."""
    samples = []
    s0, r0 = _counts()
    b0 = _bytes[0]
    c0 = time.process_time()
    for _ in range(n):
        t = time.perf_counter()
        await op()
        samples.append((time.perf_counter() - t) * 1e6)
    cpu = (time.process_time() - c0) / n * 1e6
    s1, r1 = _counts()
    _last_bytes[0] = (_bytes[0] - b0) / n
    return statistics.median(samples), (s1 - s0) / n, (r1 - r0) / n, cpu


_last_bytes = [0.0]  # bytes received per op in the last _timed


async def _measure(hosts: int, procs: int, rounds: int, n: int) -> dict[str, Any]:
    _count_bytes()
    mesh = await TreeBench.options(hosts=hosts, procs=procs).as_actor()
    res: dict[str, dict[str, list[float]]] = {"flat": {}, "tree": {}}
    folded = zmesh.Accumulator(mesh.value, 0, operator.add, associative=True)
    gathered = zmesh.Accumulator(mesh.value, 0, operator.add)
    want = sum(range(hosts * procs))

    async def fold() -> None:
        assert await folded.accumulate() == want

    async def gather() -> None:
        assert await gathered.accumulate() == want

    async def bcast_call() -> None:
        mesh.hit.broadcast(PAYLOAD)
        await mesh.ping.call()

    async def bcast() -> None:
        mesh.hit.broadcast(PAYLOAD)
        await asyncio.sleep(0)

    try:
        for mode in ("direct", "tree"):  # warm both paths: connections, links, caches
            _tree.MODE = mode
            for _ in range(20):
                await bcast_call()
        for r in range(rounds):
            order = ("direct", "tree") if r % 2 == 0 else ("tree", "direct")
            for mode in order:
                _tree.MODE = mode
                key = "flat" if mode == "direct" else "tree"
                row = res[key]
                ops: list[tuple[str, Any]] = [
                    ("call", mesh.ping.call), ("bcast_call", bcast_call), ("acc", fold),
                ]  # fmt: skip
                if mode == "tree":  # (flat, both fold at the client: the same)
                    ops.append(("acc_gathered", gather))
                for name, op in ops:
                    p50, sent, recv, cpu = await _timed(op, n)
                    row.setdefault(f"{name}_p50_us", []).append(p50)
                    row.setdefault(f"{name}_client_cpu_us", []).append(cpu)
                    row.setdefault(f"{name}_sent", []).append(sent)
                    row.setdefault(f"{name}_received", []).append(recv)
                    row.setdefault(f"{name}_bytes", []).append(_last_bytes[0])
                _, sent, _, _ = await _timed(bcast, n)
                await mesh.ping.call()  # the broadcasts have run
                row.setdefault("bcast_sent", []).append(sent)
    finally:
        _tree.MODE = "auto"
        await mesh.stop()
    out: dict[str, Any] = {
        side: {k: statistics.median(v) for k, v in rows.items()} for side, rows in res.items()
    }
    f, t = out["flat"], out["tree"]
    out["ratios"] = {
        "bcast_sent_flat_over_tree": f["bcast_sent"] / max(t["bcast_sent"], 1e-9),
        "call_sent_flat_over_tree": f["call_sent"] / max(t["call_sent"], 1e-9),
        "call_p50_tree_over_flat": t["call_p50_us"] / f["call_p50_us"],
        "bcast_call_p50_tree_over_flat": t["bcast_call_p50_us"] / f["bcast_call_p50_us"],
        "acc_received_flat_over_folded": f["acc_received"] / max(t["acc_received"], 1e-9),
        "acc_bytes_flat_over_folded": f["acc_bytes"] / max(t["acc_bytes"], 1e-9),
        "acc_p50_tree_over_flat": t["acc_p50_us"] / f["acc_p50_us"],
    }
    out["shape"] = {"hosts": hosts, "procs": procs, "rounds": rounds, "n": n}
    return out


def _proc_use(pid: int) -> tuple[float, int]:
    """CPU seconds and context switches of process ``pid`` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    switches = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                switches += int(line.split()[1])
    return cpu, switches


async def _profile(hosts: int, procs: int, n: int) -> dict[str, Any]:
    """Where a ``call()``'s work goes, flat vs tree: CPU µs and context
    switches (wake-ups) per call, of the client, the top relays, the other
    hosts' relays and the other procs (summed over each group)."""
    mesh = await TreeBench.options(hosts=hosts, procs=procs).as_actor()
    out: dict[str, Any] = {}
    try:
        pids = (await mesh.pid.call()).values()
        me = os.getpid()
        for mode in ("direct", "tree", "direct", "tree"):
            _tree.MODE = mode
            for _ in range(20):
                await mesh.ping.call()
            rt, _ = _runtime.current()
            groups: dict[str, list[int]] = {"procs": [], "host relays": [], "top relays": []}
            relays = {r.rank for r in rt.tree.relays.values()} if rt.tree else set()
            tops = set()
            if rt.tree is not None:
                for agent in rt.tree.tops.get(mesh.proc_mesh, {}):
                    relay = rt.tree.relays.get((mesh.proc_mesh, agent))
                    if relay is not None:
                        tops.add(relay.rank)
            for rank, pid in enumerate(pids):
                if mode == "tree" and rank in tops:
                    groups["top relays"].append(pid)
                elif mode == "tree" and rank in relays:
                    groups["host relays"].append(pid)
                else:
                    groups["procs"].append(pid)
            groups["client"] = [me]
            before = {p: _proc_use(p) for g in groups.values() for p in g}
            for _ in range(n):
                await mesh.ping.call()
            after = {p: _proc_use(p) for g in groups.values() for p in g}
            row = out.setdefault("flat" if mode == "direct" else "tree", {})
            for name, members in groups.items():
                cpu = sum(after[p][0] - before[p][0] for p in members) / n * 1e6
                sw = sum(after[p][1] - before[p][1] for p in members) / n
                row.setdefault(f"{name} cpu_us", []).append(cpu)
                row.setdefault(f"{name} switches", []).append(sw)
    finally:
        _tree.MODE = "auto"
        await mesh.stop()
    return {side: {k: statistics.median(v) for k, v in row.items()} for side, row in out.items()}


def profile(hosts: int = 16, procs: int = 4, n: int = 200) -> dict[str, Any]:
    """``_profile`` on ``hosts`` loopback agents."""
    with local_cluster(hosts):
        return asyncio.run(_profile(hosts, procs, n))


def render_profile(res: dict[str, Any]) -> None:
    """Print ``profile``'s rows."""
    print(f"\nper call(): {'':28} {'flat':>10} {'tree':>10}")
    keys = sorted({k for side in res.values() for k in side})
    for k in keys:
        f, t = res["flat"].get(k, 0.0), res["tree"].get(k, 0.0)
        print(f"{k:40} {f:>10.1f} {t:>10.1f}")
    for side in ("flat", "tree"):
        total = sum(v for k, v in res[side].items() if k.endswith("cpu_us"))
        print(f"{'total CPU µs, ' + side:40} {total:>10.1f}")


def measure(hosts: int = 16, procs: int = 4, rounds: int = 3, n: int = 100) -> dict[str, Any]:
    """Start ``hosts`` loopback agents, run the rows, stop them; the results."""
    with local_cluster(hosts):
        return asyncio.run(_measure(hosts, procs, rounds, n))


def render(res: dict[str, Any]) -> None:
    """Print the rows as a plain table."""
    s = res["shape"]
    print(f"\ntree vs flat fan-out, {s['hosts']} agents x {s['procs']} procs "
          f"(medians of {s['rounds']} rounds x {s['n']})")  # fmt: skip
    print(f"{'row':34} {'flat':>10} {'tree':>10} {'flat/tree':>10}")
    f, t = res["flat"], res["tree"]
    for key, label in (
        ("bcast_sent", "client msgs sent per broadcast"),
        ("call_sent", "client msgs sent per call()"),
        ("call_received", "client msgs received per call()"),
        ("call_client_cpu_us", "client CPU per call() µs"),
        ("call_p50_us", "call() p50 µs"),
        ("bcast_call_p50_us", "broadcast+call() p50 µs"),
        ("acc_received", "client msgs received per accumulate"),
        ("acc_bytes", "client bytes received per accumulate"),
        ("acc_p50_us", "accumulate p50 µs"),
    ):
        ratio = f[key] / t[key] if t[key] else float("inf")
        print(f"{label:34} {f[key]:>10.1f} {t[key]:>10.1f} {ratio:>9.2f}x")
    print("(accumulate, tree: associative=True, folded at the relays; gathered instead: "
          f"{t['acc_gathered_received']:.1f} msgs, {t['acc_gathered_bytes']:.0f} bytes, "
          f"p50 {t['acc_gathered_p50_us']:.0f} µs)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    ap.add_argument("--profile", action="store_true",
                    help="only where a call's CPU and wake-ups go, per process group")  # fmt: skip
    args = ap.parse_args()
    if args.profile:
        prof = profile(args.hosts, args.procs, 2 * args.n)
        zmesh.shutdown()
        render_profile(prof)
        if args.json:
            Path(args.json).write_text(json.dumps(prof, indent=2))
        return
    res = measure(args.hosts, args.procs, args.rounds, args.n)
    zmesh.shutdown()
    render(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
