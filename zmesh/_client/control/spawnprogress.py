"""A progress line for a spawn that takes more than a second, on a terminal.

A spawn goes on in the background (``zmesh._client.control.spawning``); when it has
not finished after ``DELAY`` seconds and the caller's stdout is a terminal,
a ``rich`` progress line shows how many of its procs are up, then that the
actors' ``__init__`` runs, and goes away when the spawn ends, whatever the
outcome. Nothing is shown in a proc (its stdout is its log file), when
stdout is a pipe or a file, or with ``ZMESH_PROGRESS=0``.

The line is drawn from the spawn's own task on the runtime's loop, from
what the controller knows (no request is sent for it), and never
redirects ``sys.stdout``: output printed meanwhile goes where it went.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from zmesh._shared.state import Status

if TYPE_CHECKING:
    from zmesh._client.calls.runtime import Runtime

DELAY = 1.0  # seconds a spawn runs before its progress is shown
TICK = 0.2  # seconds between redraws


def wanted() -> bool:
    """Whether a slow spawn shows its progress here: stdout is a terminal, not turned off."""
    if os.environ.get("ZMESH_PROGRESS", "1") == "0" or "ZMESH_PROC" in os.environ:
        return False
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced, or closed
        return False


def start(rt: Runtime, mesh: str, procs: int) -> asyncio.Task[None] | None:
    """Show the progress of spawning ``mesh`` (``procs`` procs) once it runs
    over ``DELAY``; the caller cancels the task when the spawn ends."""
    if not wanted():
        return None
    return rt.loop.create_task(_show(rt, mesh, procs))


async def _show(rt: Runtime, mesh: str, procs: int) -> None:
    await asyncio.sleep(DELAY)
    progress = Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=Console(file=sys.stdout), transient=True,
        auto_refresh=False, redirect_stdout=False, redirect_stderr=False,
    )  # fmt: skip
    with progress:
        task = progress.add_task(f"spawning {mesh}: procs starting", total=procs)
        while True:
            view = rt.controller.views.get(mesh)
            up = 0
            if view is not None and view.ranks:  # what the agents said: the real count
                up = sum(1 for r in view.ranks.values() if r.status == Status.RUNNING)
                procs = len(view.ranks)
            what = "procs starting" if up < procs else "actors initializing (__init__)"
            progress.update(task, completed=up, total=procs, description=f"spawning {mesh}: {what}")
            progress.refresh()
            await asyncio.sleep(TICK)  # cancelled when the spawn ends
