"""``zmesh top``, ``zmesh status`` and ``zmesh ps``: the commands."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import msgspec
from rich.console import Console

from zmesh import _local, _paths, _security
from zmesh._errors import ZmeshError
from zmesh.top._collect import Collector, Snapshot
from zmesh.top._render import Screen, fmt_bytes, fmt_duration, fmt_pct, render
from zmesh.top._view import derive, unhealthy


def _agent_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agents", default=None, help="agents' control addresses, comma separated")
    parser.add_argument("--hostfile", default=None, help="a file with one agent address a line")
    parser.add_argument(
        "--keys", default=None, help="a 'zmesh keygen' directory (default: ZMESH_KEYS)"
    )
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the agents' data"
    )


def agent_addresses(args: argparse.Namespace) -> list[str]:
    """Agents from ``--agents``, else ``--hostfile``, else ``ZMESH_AGENTS``/``ZMESH_HOSTFILE``,
    else this user's ipc:// agents on this machine; and the keys to reach them
    from ``--keys`` or ``ZMESH_KEYS``.

    Raises:
        SystemExit: no agents given, or unreadable keys (exit code 2, with a hint).
    """
    try:
        if args.keys:
            _security.use(args.keys)
        if args.agents:
            found: list[str] | None = [a.strip() for a in args.agents.split(",") if a.strip()]
        elif args.hostfile:
            found = _local.read_hostfile(args.hostfile)
        else:
            # Else this user's own agents here (they are in the runtime directory).
            found = _local.configured_agents() or _paths.local_agents()
    except ZmeshError as exc:
        print(f"zmesh: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if not found:
        print(
            "zmesh: no agents to watch: give --agents tcp://host:port,..., "
            "set ZMESH_AGENTS, or give --hostfile",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return found


async def collect(addresses: list[str], samples: int, timeout: float, window: float) -> Snapshot:
    """One snapshot, once every agent gave ``samples`` statistics (or ``timeout`` passed)."""
    col = Collector(addresses, window)
    try:
        await col.wait(samples, timeout)
        return col.snapshot()
    finally:
        col.close()


def top_main(argv: list[str] | None = None) -> None:
    """``zmesh top``: a live dashboard of a mesh, straight from its agents."""
    parser = argparse.ArgumentParser(prog="zmesh top", description=top_main.__doc__)
    _agent_args(parser)
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON and exit")
    parser.add_argument(
        "--window", type=float, default=10.0, help="seconds that rates and percentiles cover"
    )
    parser.add_argument("--width", type=int, default=None, help="columns for --once")
    args = parser.parse_args(argv)
    addresses = agent_addresses(args)
    if args.once or args.json:
        # Two samples a second apart give rates over what happened between them.
        snap = asyncio.run(collect(addresses, 2, args.timeout, args.window))
        if args.json:
            view = derive(snap)
            out = {
                "snapshot": plain(snap),
                "endpoints": [_endpoint(e) for e in view.endpoints],
            }
            sys.stdout.write(json.dumps(out, indent=1) + "\n")
        else:
            width = args.width or (None if sys.stdout.isatty() else 120)
            Console(width=width, highlight=False).print(render(derive(snap), Screen()))
        return
    if not sys.stdin.isatty():
        print("zmesh top: stdin is not a terminal; use --once or --json", file=sys.stderr)
        raise SystemExit(2)
    from zmesh.top._app import run

    asyncio.run(run(addresses, args.window))


def plain(obj: Any) -> Any:
    """``obj`` as JSON-ready builtins, every struct as a dict (wire structs are arrays)."""
    if isinstance(obj, msgspec.Struct):
        out = {"type": type(obj).__name__} if type(obj).__struct_config__.tag else {}
        out.update((f, plain(getattr(obj, f))) for f in obj.__struct_fields__)
        return out
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    return obj


def _endpoint(e: object) -> dict[str, object]:
    d = dict(vars(e))
    d.pop("hist", None)
    return d


def status_main(argv: list[str] | None = None) -> None:
    """``zmesh status``: health in a few lines; exit 0 when every known rank is healthy."""
    parser = argparse.ArgumentParser(prog="zmesh status", description=status_main.__doc__)
    _agent_args(parser)
    args = parser.parse_args(argv)
    snap = asyncio.run(collect(agent_addresses(args), 1, args.timeout, 10))
    view = derive(snap)
    h = view.header
    problems = unhealthy(snap)
    print(
        f"agents {h.agents_ok}/{h.agents_total} ok, procs {h.procs_running}/{h.procs_total} "
        f"running, actors {h.actors_alive} alive"
        + (f", {h.actors_failed} failed" if h.actors_failed else "")
    )
    for p in problems:
        print(f"  {p}")
    print("healthy" if not problems else f"unhealthy: {len(problems)} problem(s)")
    raise SystemExit(0 if not problems else 1)


def ps_main(argv: list[str] | None = None) -> None:
    """``zmesh ps``: one line per proc of every agent."""
    parser = argparse.ArgumentParser(prog="zmesh ps", description=ps_main.__doc__)
    _agent_args(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per proc, as a list")
    args = parser.parse_args(argv)
    snap = asyncio.run(collect(agent_addresses(args), 1, args.timeout, 10))
    procs = derive(snap).procs
    if args.json:
        rows = [dict(vars(p), restarts=p.restarts) for p in procs]
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return
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
