"""``zmesh top``, ``status``, ``ps`` and ``stack``: the commands."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import sys
from typing import Any

import msgspec
from rich.console import Console

from zmesh._shared import registry
from zmesh._shared.stats import ServiceSummary
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh.cli._common import agent_addresses, agent_args, print_json
from zmesh.top._collect import Collector, Snapshot
from zmesh.top._health import LIVE, find_meshes, judge
from zmesh.top._render import Screen, fmt_bytes, fmt_duration, fmt_pct, render
from zmesh.top._view import KEEP, Options, derive


async def collect(addresses: list[str], samples: int, timeout: float, window: float) -> Snapshot:
    """One snapshot, once every agent gave ``samples`` statistics (or ``timeout`` passed)."""
    col = Collector(addresses, window)
    try:
        await col.wait(samples, timeout)
        return col.snapshot()
    finally:
        col.close()


def configure_top(parser: argparse.ArgumentParser) -> None:
    """``zmesh top``: a live dashboard of a mesh, straight from its agents."""
    agent_args(parser)
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON and exit")
    parser.add_argument(
        "--window", type=float, default=10.0, help="seconds that rates and percentiles cover"
    )
    parser.add_argument("--width", type=int, default=None, help="columns for --once")
    _keep_arg(parser)


def run_top(args: argparse.Namespace) -> int:
    """``zmesh top``: a live dashboard of a mesh, straight from its agents."""
    live = not (args.once or args.json)
    # Live with no agents named: it follows this user's agents here, even none yet.
    follow = live and not (args.agents or args.hostfile)
    addresses = agent_addresses(args, allow_none=follow and sys.stdin.isatty())
    if args.once or args.json:
        # Two samples a second apart give rates over what happened between them.
        snap = asyncio.run(collect(addresses, 2, args.timeout, args.window))
        if args.json:
            view = derive(snap)
            out = {
                "snapshot": plain(snap),
                "endpoints": [_endpoint(e) for e in view.endpoints],
                "services": [dataclasses.asdict(sv) for sv in view.services],
            }
            print_json(out)
        else:
            width = args.width or (None if sys.stdout.isatty() else 120)
            screen = Screen(keep=args.keep * 60)
            frame = render(derive(snap, screen.options()), screen)
            Console(width=width, highlight=False).print(frame)
        return 2 if unreachable(snap) else 0  # as ps: a silent agent is not a healthy view
    if not sys.stdin.isatty():
        print("zmesh top: stdin is not a terminal; use --once or --json", file=sys.stderr)
        return 2
    # Late: the live app is for `zmesh top` only; ps, status and stack share
    # this module and start without it.
    from zmesh.top._app import run

    operators = {e.address: e.operator for e in registry.live()}  # K stops as this user
    try:
        asyncio.run(run(addresses, args.window, args.keep * 60, operators, follow))
    except KeyboardInterrupt:  # Ctrl+C: quit, quietly
        pass
    return 0


def _keep_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep",
        type=float,
        default=KEEP / 60,
        metavar="MINUTES",
        help="minutes that history rows stay and the failed counter covers (default: %(default)g)",
    )


def plain(obj: Any) -> Any:
    """``obj`` as JSON-ready builtins, every struct as a dict (wire structs are arrays).

    A service's replica table (``ServiceSummary.table``, msgpack on the wire)
    becomes its rows; any other bytes become hex.
    """
    if isinstance(obj, ServiceSummary):
        out = plain_struct(obj)
        out["table"] = plain(msgspec.msgpack.decode(obj.table)) if obj.table else []
        return out
    if isinstance(obj, msgspec.Struct):
        return plain_struct(obj)
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj).hex()
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    return obj


def plain_struct(obj: msgspec.Struct) -> dict[str, Any]:
    """One struct's fields as a dict (``plain`` of each), with its tag as ``type``."""
    out: dict[str, Any] = {"type": type(obj).__name__} if type(obj).__struct_config__.tag else {}
    out.update((f, plain(getattr(obj, f))) for f in obj.__struct_fields__)
    return out


def _endpoint(e: object) -> dict[str, object]:
    d = dict(vars(e))
    d.pop("hist", None)
    return d


def configure_status(parser: argparse.ArgumentParser) -> None:
    """``zmesh status``: is what runs now healthy? Exit 0 healthy, 1 degraded, 2 unreachable."""
    agent_args(parser)
    parser.add_argument("--json", action="store_true", help="the judgement as one JSON object")


def run_status(args: argparse.Namespace) -> int:
    """``zmesh status``: is what runs now healthy? Exit 0 healthy, 1 degraded, 2 unreachable."""
    snap = asyncio.run(collect(agent_addresses(args), 1, args.timeout, 10))
    view = derive(snap)
    h = view.header
    health = judge(snap)
    why = {a: r for a, r in silent_reasons(snap).items() if r}
    problems = [
        next((f"{p}: {r}" for a, r in why.items() if f"({a})" in p), p) for p in health.problems
    ]
    # Not problems (they leave the exit code alone): how a service is set up to run worse.
    warnings = [f"service {sv.name}: {sv.warning}" for sv in view.services if sv.warning]
    if args.json:
        out = {
            "state": health.state,
            "exit_code": health.exit_code,
            "problems": problems,
            "warnings": warnings,
            "meshes": [
                {"agent": agent, "mesh": mesh, "verdict": verdict}
                for (agent, mesh), verdict in sorted(health.verdicts.items())
            ],
        }
        print_json(out)
        return health.exit_code
    services = ""
    if h.services_ok or h.services_degraded:
        services = f", services {h.services_ok} ok" + (
            f" {h.services_degraded} degraded" if h.services_degraded else ""
        )
    history = f"; history: {h.history} proc(s) of ended meshes" if h.history else ""
    print(
        f"agents {h.agents_ok}/{h.agents_total} ok, procs {h.procs_running}/{h.procs_total} "
        f"running, actors {h.actors_alive} alive{services}{history}"
    )
    for p in problems:
        print(f"  {p}")
    for wn in warnings:
        print(f"  warning: {wn}")
    if health.state == "healthy":
        print("healthy")
    else:
        print(f"{health.state}: {len(health.problems)} problem(s)")
    return health.exit_code


def configure_ps(parser: argparse.ArgumentParser) -> None:
    """``zmesh ps``: one line per proc of every agent (history folded unless --all)."""
    agent_args(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per proc, as a list")
    parser.add_argument(
        "--all", action="store_true", help="also the procs of dead generations and stopped meshes"
    )


def run_ps(args: argparse.Namespace) -> int:
    """``zmesh ps``: one line per proc of every agent (history folded unless --all)."""
    snap = asyncio.run(collect(agent_addresses(args), 1, args.timeout, 10))
    silent = unreachable(snap)
    view = derive(snap, Options(show_history=args.all))
    procs = view.procs
    detached = {  # kept past their creator (detached=True): zmesh stop NAME ends them
        m.name: m.detached
        for a in snap.agents
        if a.stats
        for m in a.stats.meshes
        if m.detached and any(not r.status.terminal for r in m.ranks)
    }
    if args.json:
        rows = [
            dict(vars(p), restarts=p.restarts, detached=detached.get(p.mesh, "")) for p in procs
        ]
        print_json(rows)
        return 2 if silent else 0
    fmt = "{:<10} {:<28} {:>4} {:>8} {:<12} {:>5} {:>7} {:>3} {:>7}  {}"
    print(fmt.format("HOST", "MESH", "RANK", "PID", "STATE", "CPU", "RSS", "GEN", "UPTIME", "EXIT"))
    for p in procs:
        print(
            fmt.format(
                p.host[:10],
                p.mesh[:28],
                p.rank,
                p.pid or "-",
                p.state,
                fmt_pct(p.cpu),
                fmt_bytes(p.rss),
                p.generation,
                fmt_duration(p.uptime),
                p.reason,
            )
        )
    for mesh, name in sorted(detached.items()):
        print(f"(detached: {mesh} is kept as {name!r} past its creator; 'zmesh stop {name}')")
    if view.header.history and not args.all:
        print(
            f"(+{view.header.history} history rows: dead generations and stopped meshes; "
            "--all shows them)"
        )
    return 2 if silent else 0


def unreachable(snap: Snapshot) -> list[str]:
    """The agents that never answered, each said on stderr (with why, when known)."""
    why = silent_reasons(snap)
    for address, reason in why.items():
        print(
            f"zmesh: agent {address} did not answer" + (f": {reason}" if reason else ""),
            file=sys.stderr,
        )
    return list(why)


def silent_reasons(snap: Snapshot) -> dict[str, str]:
    """Each agent that never answered -> why, if its handshake says ("" if not)."""

    # A keyed agent drops a peer with no keys or the wrong ones: the handshake tells.
    return {
        a.address: _security.probe(a.address, 1.0, _security.keys_for(a.address))
        for a in snap.agents
        if a.stats is None
    }


def configure_stack(parser: argparse.ArgumentParser) -> None:
    """``zmesh stack``: the Python stack of every thread of a live proc (all ranks by default)."""
    parser.add_argument("mesh", help="a mesh: its full name (zmesh ps) or the name it was given")
    parser.add_argument("rank", nargs="?", type=int, default=None, help="one rank (default: all)")
    agent_args(parser)
    parser.add_argument("--json", action="store_true", help="a JSON list, one object per rank")


def run_stack(args: argparse.Namespace) -> int:
    """``zmesh stack``: the Python stack of every thread of a live proc (all ranks by default)."""
    addresses = agent_addresses(args)
    results, error = asyncio.run(_stacks(addresses, args.mesh, args.rank, args.timeout))
    if error:
        print(f"zmesh stack: {error}", file=sys.stderr)
        return 2
    if args.json:
        print_json(results)
    else:
        for r in results:
            print(f"--- {r['mesh']}[{r['rank']}] pid {r['pid'] or '-'} on {r['host']} ---")
            if r["ok"]:
                print(r["stack"].rstrip("\n"))
                if r["truncated"]:
                    print("(cut: the dump was larger than the agent sends)")
            else:
                print(f"error: {r['error']}")
            print()
    return 0 if all(r["ok"] for r in results) else 1


async def _stacks(
    addresses: list[str], name: str, rank: int | None, timeout: float
) -> tuple[list[dict[str, Any]], str]:
    """Ask the agents holding ``name`` for its ranks' stacks: ``(results, error)``."""
    col = Collector(addresses, 10)
    try:
        await col.wait(1, timeout)
        snap = col.snapshot()
        meshes = find_meshes(snap, name)
        if not meshes:
            known = ", ".join(_known(snap)) or "none"
            return [], f"no mesh named {name!r} on {len(addresses)} agent(s) (known: {known})"
        targets = []  # (agent address, host, mesh, rank state)
        for a in snap.agents:
            if a.stats is None:
                continue
            for m in a.stats.meshes:
                if m.name not in meshes:
                    continue
                for r in m.ranks:
                    if (rank is None and r.status in LIVE) or r.rank == rank:
                        targets.append((a.address, a.stats.agent, m.name, r))
        if not targets:
            which = f"rank {rank} of" if rank is not None else "no live rank in"
            return [], f"{which} {', '.join(meshes)}: nothing to show"

        async def one(address: str, host: str, mesh: str, r: w.RankState) -> dict[str, Any]:
            out: dict[str, Any] = {"mesh": mesh, "rank": r.rank, "host": host, "pid": r.pid}
            try:
                make = functools.partial(w.GetStack, mesh=mesh, rank=r.rank)
                reply = await col.request(address, make, timeout)
            except asyncio.TimeoutError:
                reply = w.StackReply(0, ok=False, error=f"agent {address} did not answer")
            out.update(
                ok=reply.ok,
                pid=reply.pid or r.pid,
                stack=reply.text,
                error=reply.error,
                truncated=reply.truncated,
            )
            return out

        results = await asyncio.gather(*(one(*t) for t in targets))
        return sorted(results, key=lambda r: (r["mesh"], r["rank"])), ""
    finally:
        col.close()


def _known(snap: Snapshot) -> list[str]:
    return sorted({m.name for a in snap.agents if a.stats is not None for m in a.stats.meshes})
