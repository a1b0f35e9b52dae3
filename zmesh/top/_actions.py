"""What ``zmesh top`` does besides drawing: a row's details, a proc's logs, stopping a mesh.

Each action fills the screen's overlay (``Screen.stack`` lines under
``Screen.stack_title``; ``Screen.overlay`` says which kind) or its footer
message; the interactive loop (``_app``) starts the ones that ask an agent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from typing import Any

from zmesh._wire import messages as w
from zmesh.top._collect import Collector
from zmesh.top._panes import service_lines
from zmesh.top._render import Screen
from zmesh.top._view import ServiceRow, View

LOG_LINES = 2000  # lines the logs view keeps (it shows the newest)
LOG_EVERY = 0.5  # seconds between reads while the logs view is open


def selected_row(view: View, screen: Screen) -> Any:
    """The row the selection is on in the focused pane, or None."""
    pane = screen.pane
    rows: list[Any]
    if pane == "actors":
        rows = list(view.endpoints[1:])
    elif pane == "services":  # each service, then its replicas: the row is either
        rows = [rep or svc for svc, rep in service_lines(view)]
    else:
        rows = list(getattr(view, pane))
    if not rows:
        return None
    return rows[min(screen.selected.get(pane, 0), len(rows) - 1)]


def open_detail(view: View, screen: Screen) -> None:
    """``Enter``: everything known of the selected row."""
    row = selected_row(view, screen)
    if row is None:
        return
    screen.overlay = "detail"
    if screen.pane == "procs":
        screen.stack_title = f"{row.mesh}[{row.rank}]"
        endpoints = sorted({e.endpoint for e in view.endpoints[1:] if e.mesh == row.mesh})
        screen.stack = [
            f"mesh       {row.mesh}",
            f"rank       {row.rank}",
            f"state      {row.state}" + ("  (history)" if row.history else ""),
            f"pid        {row.pid or '-'}",
            f"host       {row.host}",
            f"agent      {row.address or '-'}",
            f"generation {row.generation} (restarts {row.restarts})",
            f"log        {row.log or '-'}",
            f"last error {row.reason or '-'}",
            f"endpoints  {', '.join(endpoints) or '-'}",
            "",
            "L logs  S stack  K stop this mesh",
        ]
        return
    screen.stack_title = f"{screen.pane} row"
    fields = (
        vars(row)
        if not dataclasses.is_dataclass(row)
        else {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
    )
    if isinstance(row, ServiceRow):  # its replicas are rows of their own
        fields["replicas"] = ", ".join(r.mesh or str(r.index) for r in row.replicas) or "-"
    screen.stack = [f"{k:<12} {v}" for k, v in fields.items() if k != "hist"]


def open_logs(view: View, screen: Screen) -> None:
    """``L`` in the procs pane: the selected proc's log, following new lines."""
    row = selected_row(view, screen)
    if screen.pane != "procs" or row is None:
        return
    screen.overlay = "logs"
    screen.stack_title = f"logs of {row.mesh}[{row.rank}] on {row.host} ({row.log or '?'})"
    screen.stack = ["asking its agent for the log..."]
    screen.logs_wanted = (row.address, row.mesh, row.rank)


def open_stack(view: View, screen: Screen) -> None:
    """``S`` in the procs pane: the selected proc's stack, from the agent that runs it.

    The row carries its agent's address: labels repeat (every embedded
    agent is ``local``) and the hosts pane may be filtered.
    """
    row = selected_row(view, screen)
    if screen.pane != "procs" or row is None:
        return
    screen.overlay = "stack"
    screen.stack_title = f"{row.mesh}[{row.rank}] pid {row.pid or '-'} on {row.host}"
    screen.stack = ["asking its agent for the stack..."]
    screen.stack_wanted = (row.address, row.mesh, row.rank)


def ask_stop(view: View, screen: Screen) -> None:
    """``K``: ask to confirm stopping the selected row's mesh."""
    row = selected_row(view, screen)
    if row is None or screen.pane not in ("procs", "actors"):
        return
    mesh = row.mesh
    live = sum(1 for p in view.procs if p.mesh == mesh and p.state in ("Running", "Initializing"))
    screen.confirm = mesh
    screen.message = f"stop mesh {mesh} ({live} live rank(s))? y to stop, any other key not"


async def follow_logs(col: Collector, screen: Screen, address: str, mesh: str, rank: int) -> None:
    """Fill the logs view until it is closed (or shows another proc)."""
    key = (address, mesh, rank)
    offset = -1  # the first read: the log's tail
    lines: list[str] = []
    partial = ""
    while screen.overlay == "logs" and screen.logs_key == key:
        try:
            make = functools.partial(w.GetLogs, mesh=mesh, rank=rank, offset=offset)
            reply = await col.request(address, make, 5.0)
        except (asyncio.TimeoutError, LookupError):
            screen.stack = [*lines, f"error: the agent at {address or '?'} did not answer"]
            return
        if not reply.ok:
            screen.stack = [*lines, f"error: {reply.error}"]
            return
        offset = reply.offset
        if reply.text:
            *new, partial = (partial + reply.text).split("\n")
            lines = (lines + new)[-LOG_LINES:]
        if screen.overlay == "logs" and screen.logs_key == key:
            screen.stack = lines + ([partial] if partial else []) or ["(nothing printed yet)"]
        await asyncio.sleep(LOG_EVERY)


async def stop_mesh(
    col: Collector, screen: Screen, view: View, mesh: str, operators: dict[str, str]
) -> None:
    """Stop ``mesh`` on every agent that has it; say how it went in the footer."""
    addresses = sorted({p.address for p in view.procs if p.mesh == mesh and p.address})
    results = await asyncio.gather(
        *(stop_one(col, a, mesh, operators.get(a, ""), 5.0) for a in addresses)
    )
    errors = [err for ok, err in results if not ok]
    screen.message = f"stopped {mesh}" if not errors else f"{mesh} not stopped: {errors[0]}"


async def stop_one(
    col: Collector, address: str, mesh: str, secret: str, timeout: float
) -> tuple[bool, str]:
    """Ask one agent to stop ``mesh`` as its user (``secret``: from the registry).

    Returns:
        ``(ok, error)``.
    """
    if not secret:
        return False, (
            "only its owner, or this agent's user on the agent's machine, may stop it "
            "(this agent is not in your registry here)"
        )
    try:
        ack = await col.request(
            address, functools.partial(w.Stop, name=mesh, secret=secret), timeout
        )
    except (asyncio.TimeoutError, LookupError):
        return False, f"agent {address} did not answer"
    return bool(ack.ok), ack.error
