"""``zmesh get NAME``: one mesh by name, from every agent that has a part of it."""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from typing import Any

from zmesh._wire import messages as w
from zmesh.cli._common import agent_addresses, agent_args, json_arg, print_json
from zmesh.top._collect import Collector
from zmesh.top._health import find_meshes


def configure_get(parser: argparse.ArgumentParser) -> None:
    """``zmesh get NAME [--json]``."""
    parser.add_argument("mesh", help="the name given (name=, spawn name) or the full name (ps)")
    agent_args(parser)
    json_arg(
        parser,
        '{"name", "generation", "ranks": [{"rank", "status", "pid", "host", "log"}]} '
        "(a list of them when the name means several meshes)",
    )


def run_get(args: argparse.Namespace) -> int:
    """Print the mesh; exit 2 (one line on stderr) when no mesh has that name."""
    return asyncio.run(_get(agent_addresses(args), args))


async def _get(addresses: list[str], args: argparse.Namespace) -> int:
    col = Collector(addresses, 10)
    try:
        await col.wait(1, args.timeout)
        snap = col.snapshot()
        names = find_meshes(snap, args.mesh)
        if not names:
            known = sorted({m.name for a in snap.agents if a.stats for m in a.stats.meshes})
            print(
                f"zmesh get: no mesh named {args.mesh!r} on {len(snap.agents)} agent(s) "
                f"(known: {', '.join(known) or 'none'})",
                file=sys.stderr,
            )
            return 2
        # Procs whose actors' __init__ runs: Running to their agent, Initializing here.
        starting = {
            (p.mesh, p.rank, p.generation)
            for a in snap.agents
            if a.stats is not None
            for p in a.stats.procs
            if p.initializing
        }
        holders = [
            (a.address, a.stats.agent)
            for a in snap.agents
            if a.stats is not None and any(m.name in names for m in a.stats.meshes)
        ]
        # Asked now, not the snapshot's stats: what the agents say at this moment.
        replies = await asyncio.gather(
            *(col.request(addr, functools.partial(w.GetState, name=""), args.timeout)
              for addr, _ in holders),
            return_exceptions=True,
        )  # fmt: skip
    finally:
        col.close()
    meshes: dict[str, dict[str, Any]] = {
        n: {"name": n, "generation": 0, "ranks": []} for n in names
    }
    for (addr, host), reply in zip(holders, replies, strict=True):
        if isinstance(reply, BaseException):
            print(f"zmesh get: agent {addr} did not answer", file=sys.stderr)
            continue
        for m in reply.meshes:
            if m.name in meshes:
                _add(meshes[m.name], m, host, starting)
    out = [meshes[n] for n in names]
    for m in out:
        m["ranks"].sort(key=lambda r: r["rank"])
    if args.json:
        print_json(out[0] if len(out) == 1 else out)
    else:
        for m in out:
            _print(m)
    return 0


def _add(
    into: dict[str, Any], m: w.MeshReport, host: str, starting: set[tuple[str, int, int]]
) -> None:
    into["generation"] = max(into["generation"], m.generation)
    if m.detached:  # kept past its creator under this name (zmesh.lookup)
        into["detached"] = m.detached
    into["ranks"].extend(
        {"rank": r.rank, "status": _status(m.name, r, starting), "pid": r.pid, "host": host,
         "log": r.log_path}
        for r in m.ranks
    )  # fmt: skip


def _status(mesh: str, r: Any, starting: set[tuple[str, int, int]]) -> str:
    """What a rank is doing: its agent's status, Initializing while an actor's __init__ runs."""
    status: str = r.status.value
    if status == "Running" and (mesh, r.rank, r.generation) in starting:
        return "Initializing"
    return status


def _print(m: dict[str, Any]) -> None:
    kept = f"  detached as {m['detached']!r}" if m.get("detached") else ""
    print(f"{m['name']}  generation {m['generation']}  {len(m['ranks'])} rank(s){kept}")
    for r in m["ranks"]:
        print(f"  {r['rank']:>4}  {r['status']:<12} pid {r['pid']:<8} {r['host']}  {r['log']}")
