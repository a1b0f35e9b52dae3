"""``zmesh logs`` and ``zmesh stop``: a mesh by the name the user gave it (or its full name)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import sys
import time
from typing import Any

from zmesh._shared import registry
from zmesh._wire import messages as w
from zmesh.cli import _runlogs
from zmesh.cli._common import agent_addresses, agent_args, json_arg, print_json
from zmesh.cli._detached import stop_detached
from zmesh.top._actions import stop_one
from zmesh.top._collect import Collector, Snapshot
from zmesh.top._health import LIVE, find_meshes, service_of
from zmesh.top._render import fmt_duration

FOLLOW_EVERY = 0.3  # seconds between reads with -f
LIMIT = 1 << 20  # bytes a read asks for


def configure_logs(parser: argparse.ArgumentParser) -> None:
    """``zmesh logs MESH [RANK]``: what a mesh's procs printed."""
    parser.add_argument(
        "mesh", nargs="?", help="the name given (name=, spawn name) or the full name (ps)"
    )
    parser.add_argument("rank", nargs="?", type=int, default=None, help="one rank (default: all)")
    parser.add_argument(
        "--list", action="store_true", help="the meshes with logs on this machine, ended runs too"
    )
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new output")
    parser.add_argument(
        "--since", type=float, default=0.0, metavar="SECONDS", help="only what came in the last N s"
    )
    agent_args(parser)
    json_arg(parser, 'one {"mesh", "rank", "host", "path", "text"} per read (JSON lines with -f)')


def run_logs(args: argparse.Namespace) -> int:
    """Print the logs; exit 2 when no mesh or rank has that name.

    A mesh no agent knows any more (its script ended, and its embedded agent
    with it) is looked for in the logs of ended runs on this machine.
    """
    if args.list:
        return _list(args)
    if not args.mesh:
        print("zmesh logs: give a MESH (zmesh logs --list shows them)", file=sys.stderr)
        return 2
    local = not (args.agents or args.hostfile)
    addresses = agent_addresses(args, allow_none=local)
    if not addresses:  # nothing runs here now: the logs on disk are all there is
        return _ended(args, "no agent of yours runs on this machine")
    return asyncio.run(_logs(addresses, args, local))


def _list(args: argparse.Namespace) -> int:
    rows = _runlogs.names()
    if args.json:
        print_json(
            [
                {"name": n, "mesh": mesh, "run": run, "ranks": ranks, "modified": mtime}
                for n, mesh, run, ranks, mtime in rows
            ]
        )
        return 0
    if not rows:
        print("(no logs on this machine)")
        return 0
    now = time.time()
    fmt = "{:<20} {:<32} {:>5} {:>8}  {}"
    print(fmt.format("NAME", "MESH", "RANKS", "WRITTEN", "RUN"))
    for n, mesh, run, ranks, mtime in rows:
        age = fmt_duration(max(0.0, now - mtime)) + " ago"
        print(fmt.format(n[:20], mesh[:32], ranks, age, run))
    return 0


def _ended(args: argparse.Namespace, live_error: str) -> int:
    """Print the logs of the newest ended run that had ``args.mesh``; exit 2 if none."""
    logs = _runlogs.find(args.mesh, args.rank)
    if not logs:
        print(
            f"zmesh logs: {live_error}, and no log of a mesh named {args.mesh!r} is on this "
            "machine ('zmesh logs --list' shows the names there are)",
            file=sys.stderr,
        )
        return 2
    prefix = args.rank is None and len(logs) > 1
    for r in logs:
        try:
            with open(r.path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as exc:
            print(f"zmesh logs: {r.mesh}[{r.rank}]: cannot read {r.path}: {exc}", file=sys.stderr)
            continue
        reply = _FileRead(r.path, text)
        _show(args, r.run, r.mesh, r.rank, reply, prefix)
    if not args.json:
        print(f"(the run {logs[0].run} has ended: these are its logs on disk)", file=sys.stderr)
    return 0


@dataclasses.dataclass(frozen=True)
class _FileRead:
    """What ``_show`` needs of a read, for a log file read from disk."""

    path: str
    text: str


async def _targets(
    col: Collector, name: str, rank: int | None, timeout: float
) -> tuple[Snapshot, list[tuple[str, str, str, int]], str]:
    """``(snapshot, [(agent address, host, mesh, rank)], error)`` for ``name``."""
    await col.wait(1, timeout)
    snap = col.snapshot()
    meshes = find_meshes(snap, name)
    if not meshes:
        known = {m.name for a in snap.agents if a.stats for m in a.stats.meshes}
        live = _live_names(snap)
        ended = len(known - set(live))
        more = f"; +{ended} ended" if ended else ""
        said = f"live: {', '.join(live) or 'none'}{more}"
        return snap, [], f"no mesh named {name!r} on {len(snap.agents)} agent(s) ({said})"
    out: list[tuple[str, str, str, int]] = []
    for a in snap.agents:
        if a.stats is None:
            continue
        for m in a.stats.meshes:
            if m.name in meshes:
                out.extend(
                    (a.address, a.stats.agent, m.name, r.rank)
                    for r in m.ranks
                    if rank is None or r.rank == rank
                )
    if not out:
        return snap, [], f"no rank {rank} in {', '.join(meshes)}"
    return snap, sorted(out, key=lambda t: (t[2], t[3])), ""


async def _logs(addresses: list[str], args: argparse.Namespace, local: bool) -> int:
    col = Collector(addresses, 10)
    try:
        snap, targets, error = await _targets(col, args.mesh, args.rank, args.timeout)
        if error and local and not find_meshes(snap, args.mesh):  # ended: its logs on disk
            known = ", ".join(_live_names(snap)) or "none"
            return _ended(args, f"no live mesh named {args.mesh!r} (live: {known})")
        if error:
            print(f"zmesh logs: {error}", file=sys.stderr)
            return 2
        prefix = args.rank is None
        offsets: dict[tuple[str, str, int], int] = {}
        code = 0
        first = True
        while True:
            live = False
            for address, host, mesh, rank in targets:
                key = (address, mesh, rank)
                while True:  # until we have all there is now
                    start = offsets.get(key, -1 if first and args.since else 0)
                    make = functools.partial(
                        w.GetLogs, mesh=mesh, rank=rank, offset=start,
                        since=args.since if start < 0 else 0.0, limit=LIMIT,
                    )  # fmt: skip
                    try:
                        reply = await col.request(address, make, args.timeout)
                    except asyncio.TimeoutError:
                        print(f"zmesh logs: agent {address} did not answer", file=sys.stderr)
                        code = 1
                        break
                    if not reply.ok:
                        print(f"zmesh logs: {mesh}[{rank}]: {reply.error}", file=sys.stderr)
                        code = 1
                        break
                    offsets[key] = reply.offset
                    _show(args, host, mesh, rank, reply, prefix)
                    if reply.offset >= reply.size or not reply.text:
                        live = live or reply.live
                        break
            first = False
            if not args.follow or not live:
                return code
            await asyncio.sleep(FOLLOW_EVERY)
    finally:
        col.close()


def _live_names(snap: Snapshot) -> list[str]:
    """The names of the live meshes, for an error (ended ones would be dozens)."""
    return sorted(
        {
            m.name
            for a in snap.agents
            if a.stats
            for m in a.stats.meshes
            if any(r.status in LIVE for r in m.ranks)
        }
    )


def _show(
    args: argparse.Namespace, host: str, mesh: str, rank: int, reply: Any, prefix: bool
) -> None:
    if args.json:
        if reply.text or not args.follow:
            obj = {"mesh": mesh, "rank": rank, "host": host, "path": reply.path}
            obj["text"] = reply.text
            if args.follow:
                print(json.dumps(obj), flush=True)
            else:
                print_json(obj)
        return
    if not reply.text:
        return
    lines = reply.text.splitlines()
    if prefix:
        sys.stdout.write("".join(f"[{mesh} {rank}] {ln}\n" for ln in lines))
    else:
        sys.stdout.write("".join(f"{ln}\n" for ln in lines))
    sys.stdout.flush()


def configure_stop(parser: argparse.ArgumentParser) -> None:
    """``zmesh stop NAME``: a detached service or mesh, or a mesh (on every agent that has it)."""
    parser.add_argument("mesh", help="the name given (name=, spawn name) or the full name (ps)")
    parser.add_argument(
        "--replicas",
        action="store_true",
        help="stop the replicas of a service its script runs (not detached) anyway: "
        "its owner replaces them at once",
    )
    agent_args(parser)
    json_arg(parser, '[{"mesh", "host", "ok", "error"}]')


def run_stop(args: argparse.Namespace) -> int:
    """Stop it; exit 0 when every agent did, 1 when one refused, 2 when no mesh has that name."""
    return asyncio.run(_stop(agent_addresses(args), args))


async def _stop(addresses: list[str], args: argparse.Namespace) -> int:
    operators = {e.address: e.operator for e in registry.live()}
    col = Collector(addresses, 10)
    try:
        rows = await stop_detached(col, addresses, args.mesh, operators, args.timeout)
        if rows:  # a detached service or mesh of that name: its agents stopped it
            _print_stopped(args, rows)
            return 0
        snap, targets, error = await _targets(col, args.mesh, None, args.timeout)
        if error:
            print(f"zmesh stop: {error}", file=sys.stderr)
            return 2
        owned = _owned_services(snap, {t[2] for t in targets}, col)
        if owned and not args.replicas:
            # Its replicas stopped here would be replaced by its owner a second
            # later: say so, and how to stop it for good, instead of "stopped".
            print(f"zmesh stop: {owned}", file=sys.stderr)
            return 1
        where = sorted({(t[0], t[1], t[2]) for t in targets})
        results = await asyncio.gather(
            *(stop_one(col, a, mesh, operators.get(a, ""), args.timeout) for a, _, mesh in where)
        )
    finally:
        col.close()
    rows = [
        {"mesh": mesh, "host": host, "ok": ok, "error": err}
        for (_, host, mesh), (ok, err) in zip(where, results, strict=True)
    ]
    _print_stopped(args, rows)
    return 0 if all(r["ok"] for r in rows) else 1


def _owned_services(snap: Snapshot, meshes: set[str], col: Collector) -> str:
    """Why stopping ``meshes`` would not stop them, if they are replicas of a
    service a script runs (its orchestrator is in that script, not an agent:
    it replaces a replica that stops); ``""`` if none is."""
    services = {s.name for a in snap.agents if a.stats for s in a.stats.services}
    names = sorted({svc for m in meshes if (svc := service_of(m, services)) is not None})
    if not names:
        return ""
    owners = sorted(
        {
            e.owner
            for a in snap.agents
            if a.stats and any(m.name in meshes for m in a.stats.meshes)
            if (e := col.entries.get(a.address)) is not None and e.owner
        }
    )
    who = f"the script with pid {', '.join(map(str, owners))}" if owners else "the script"
    return (
        f"{', '.join(names)} is a service that {who} runs (not detached): it replaces "
        "a replica that stops, so stopping its replicas here would not stop it. Stop it "
        "in that script (svc.stop()), or end the script; 'zmesh stop --replicas' stops "
        "the replicas anyway (the service then heals)"
    )


def _print_stopped(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    if args.json:
        print_json(rows)
        return
    for r in rows:
        what = f"{r['mesh']} (detached)" if r.get("detached") else r["mesh"]
        print(f"{what} on {r['host']}: " + ("stopped" if r["ok"] else f"error: {r['error']}"))
