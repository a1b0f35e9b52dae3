"""The interactive dashboard: keys in, frames out, on one asyncio loop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import termios
import tty
from collections.abc import Iterator

from rich.console import Console
from rich.live import Live

from zmesh._wire import messages as w
from zmesh.top import _actions
from zmesh.top._collect import Collector, Snapshot
from zmesh.top._render import WINDOWS, Screen, pane_rows, render
from zmesh.top._view import KEEP, PANES, SORTS, View, derive

REFRESH = 1.0  # seconds between frames when no key is pressed

_KEYS = {
    b"\x1b[A": "up",
    b"\x1bOA": "up",
    b"\x1b[B": "down",
    b"\x1bOB": "down",
    b"\x1b[5~": "pgup",
    b"\x1b[6~": "pgdn",
    b"\x1b[H": "home",
    b"\x1b[F": "end",
    b"\x1b[Z": "backtab",
    b"\t": "tab",
    b"\r": "enter",
    b"\n": "enter",
    b"\x7f": "backspace",
    b"\x08": "backspace",
    b"\x03": "ctrl-c",
    b"\x1bOP": "f1",
    b"\x1b[11~": "f1",
}


def parse_keys(data: bytes) -> Iterator[str]:
    """Split what the terminal sent into key names (plain keys are themselves)."""
    i = 0
    while i < len(data):
        for seq, name in _KEYS.items():
            if data.startswith(seq, i):
                yield name
                i += len(seq)
                break
        else:
            if data[i] == 0x1B:
                # An unknown escape sequence, or Esc itself.
                end = i + 1
                if end < len(data) and data[end : end + 1] in (b"[", b"O"):
                    end += 2
                    while end < len(data) and not 0x40 <= data[end - 1] <= 0x7E:
                        end += 1
                    yield "unknown"
                else:
                    yield "esc"
                i = end
                continue
            ch = data[i : i + 1].decode("latin-1")
            yield ch
            i += 1


def apply_key(screen: Screen, key: str, view: View, page: int) -> bool:
    """Change ``screen`` for ``key``; return False to quit."""
    if screen.editing:
        if key == "enter":
            screen.editing = False
        elif key == "esc":
            screen.editing = False
            screen.filter = ""
        elif key == "backspace":
            screen.filter = screen.filter[:-1]
        elif len(key) == 1 and key.isprintable():
            screen.filter += key
        screen.selected.clear()
        return True
    if screen.confirm is not None:  # K asked: only y stops it
        mesh, screen.confirm = screen.confirm, None
        screen.stop_wanted = mesh if key == "y" else None
        screen.message = f"stopping {mesh}..." if key == "y" else f"{mesh} not stopped"
        return key != "ctrl-c"
    screen.message = ""
    if screen.help:
        screen.help = False
        return key not in ("q", "ctrl-c")
    if screen.stack is not None:
        detail = screen.overlay == "detail" and screen.pane == "procs"
        screen.stack = None  # any key closes the overlay (stack, detail, logs)
        screen.logs_key = None
        if not (detail and key in ("L", "S", "K")):
            return key not in ("q", "ctrl-c")
        # The proc detail's footer offers these: they act on its row (still selected).
    pane = screen.pane
    n = pane_rows(view, pane)
    sel = screen.selected.get(pane, 0)
    if key in ("q", "ctrl-c"):
        return False
    if key in ("?", "h", "f1"):
        screen.help = True
    elif key == "enter":
        _actions.open_detail(view, screen)
    elif key == "L":
        _actions.open_logs(view, screen)
    elif key == "K":
        _actions.ask_stop(view, screen)
    elif key == "tab":
        screen.focus = (screen.focus + 1) % len(PANES)
    elif key == "backtab":
        screen.focus = (screen.focus - 1) % len(PANES)
    elif key in "12345" and len(key) == 1:
        screen.focus = int(key) - 1
    elif key in ("down", "j", "up", "k", "pgdn", "pgup", "home", "g", "end", "G"):
        moved = {"down": 1, "j": 1, "up": -1, "k": -1, "pgdn": page, "pgup": -page}
        to = 0 if key in ("home", "g") else n - 1 if key in ("end", "G") else sel + moved[key]
        screen.selected[pane] = max(0, min(max(0, n - 1), to))
        if pane == "events":  # at the newest it follows new events again
            screen.follow_events = screen.selected[pane] >= n - 1
    elif key == "/":
        screen.editing = True
    elif key == "esc":
        screen.filter = ""
    elif key in ("<", ">"):
        cols = len(SORTS[pane])
        step = 1 if key == ">" else -1
        screen.sort[pane] = (screen.sort.get(pane, 0) + step) % cols
    elif key == " ":
        screen.paused = not screen.paused
    elif key == "e":
        screen.errors_only = not screen.errors_only
        screen.selected.clear()
    elif key == "H":
        screen.show_history = not screen.show_history
        screen.selected.clear()
    elif key == "S":
        _actions.open_stack(view, screen)
    elif key in ("+", "="):
        screen.window = next((w for w in WINDOWS if w > screen.window), WINDOWS[-1])
    elif key in ("-", "_"):
        screen.window = next((w for w in reversed(WINDOWS) if w < screen.window), WINDOWS[0])
    return True


async def _show_stack(col: Collector, screen: Screen, address: str, mesh: str, rank: int) -> None:
    """Ask the agent for a proc's stack and put it on the screen (``S``)."""
    title = screen.stack_title
    try:
        make = functools.partial(w.GetStack, mesh=mesh, rank=rank)
        reply = await col.request(address, make, 5.0)
        lines = [_short_path(ln) for ln in reply.text.splitlines()] if reply.ok else []
        lines = lines or [f"error: {reply.error}"]
    except (asyncio.TimeoutError, LookupError):
        lines = [f"error: the agent at {address or '?'} did not answer"]
    if screen.stack is not None and screen.stack_title == title:  # not closed meanwhile
        screen.stack = lines


def _short_path(line: str) -> str:
    """``  File "/long/path/x.py", line 3 in f`` -> ``  File "x.py", line 3 in f`` (a
    terminal is narrow; ``zmesh stack`` prints the full paths)."""
    head, sep, rest = line.partition('File "')
    if not sep or '"' not in rest:
        return line
    path, tail = rest.split('"', 1)
    return f'{head}File "{os.path.basename(path)}"{tail}'


@contextlib.contextmanager
def _cbreak(fd: int) -> Iterator[None]:
    old = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


async def run(
    addresses: list[str],
    window: float,
    keep: float = KEEP,
    operators: dict[str, str] | None = None,
    follow: bool = False,
) -> None:
    """Run the dashboard in this terminal until ``q``.

    ``operators``: agent address -> the secret that lets this user stop its
    meshes (``K``), from the registry (read again for agents found later).
    ``follow``: also show the agents this user starts here later (no
    agents were named).
    """
    console = Console()
    screen = Screen(window=window, keep=keep)
    col = Collector(addresses, window, follow=follow)
    loop = asyncio.get_running_loop()
    keys: asyncio.Queue[str] = asyncio.Queue()
    fd = sys.stdin.fileno()

    def on_input() -> None:
        try:
            data = os.read(fd, 1024)
        except OSError:
            data = b""
        if not data:
            keys.put_nowait("q")  # the terminal is gone
            return
        for k in parse_keys(data):
            keys.put_nowait(k)

    snap: Snapshot | None = None
    try:
        with _cbreak(fd), Live(console=console, screen=True, auto_refresh=False) as live:
            loop.add_reader(fd, on_input)
            try:
                await col.wait(1, 1.0)
                while True:
                    if snap is None or not screen.paused:
                        snap = col.snapshot(screen.window)
                    view = derive(snap, screen.options())
                    if screen.follow_events:
                        screen.selected["events"] = max(0, len(view.events) - 1)
                    height = console.size.height
                    live.update(render(view, screen, height), refresh=True)
                    try:
                        every = _actions.LOG_EVERY if screen.logs_key else REFRESH
                        key = await asyncio.wait_for(keys.get(), every)
                    except asyncio.TimeoutError:
                        continue
                    pending = [key]
                    while not keys.empty():
                        pending.append(keys.get_nowait())
                    for k in pending:
                        if not apply_key(screen, k, view, max(1, height - 8)):
                            return
                    if screen.stack_wanted is not None:
                        col.spawn(_show_stack(col, screen, *screen.stack_wanted))
                        screen.stack_wanted = None
                    if screen.logs_wanted is not None:
                        screen.logs_key, screen.logs_wanted = screen.logs_wanted, None
                        col.spawn(_actions.follow_logs(col, screen, *screen.logs_key))
                    if screen.stop_wanted is not None:
                        mesh, screen.stop_wanted = screen.stop_wanted, None
                        known = {a: e.operator for a, e in col.entries.items()}
                        known.update(operators or {})
                        col.spawn(_actions.stop_mesh(col, screen, view, mesh, known))
            finally:
                loop.remove_reader(fd)
    finally:
        col.close()
