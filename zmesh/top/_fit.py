"""Laying a pane's table out in the terminal's width, narrow first.

Numbers keep their units and pids every digit: a numeric column is as wide
as its widest cell, never cut. Names share what is left: each gets at least
its minimum, then the room is shared out evenly up to each name's full
length, and a name that still does not fit is cut in the middle
(``scorer-r0…d30bdf``: its unique suffix stays) or, for free text, at the
end. When even the minimums do not fit, the least needed columns are
dropped, so the columns shown are whole. Pure: the layout is a function of
the cells and the width (``layout``); ``Fitted`` applies it at draw time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

ELLIPSIS = "…"


@dataclass(frozen=True)
class Column:
    """One column: ``cut`` is ``""`` (never cut), ``"middle"`` or ``"end"``.

    ``min`` is the least width of a cut column; a ``later`` one gets room
    after the other cut columns; ``fill`` takes what is left once every
    column has all it needs; columns of higher ``drop`` go
    first when the minimums do not fit (0: never dropped).
    """

    title: str
    right: bool = False
    cut: str = ""
    min: int = 0
    fill: bool = False
    later: bool = False
    drop: int = 0


Cell = str | Text


def ellipsize(s: str, width: int, where: str = "middle") -> str:
    """``s`` in at most ``width`` cells; cut in the middle or at the end with ``…``."""
    if cell_len(s) <= width:
        return s
    if width <= 1:
        return ELLIPSIS[:width]
    if where == "end":
        return s[: width - 1] + ELLIPSIS
    tail = (width - 1) // 2
    head = width - 1 - tail
    return s[:head] + ELLIPSIS + s[len(s) - tail :]


def _plain(c: Cell) -> str:
    return c.plain if isinstance(c, Text) else c


def needs(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> list[int]:
    """The width each column needs to show its title and every cell whole."""
    return [
        max([cell_len(c.title)] + [cell_len(_plain(r[i])) for r in rows])
        for i, c in enumerate(columns)
    ]


def gap(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int) -> int:
    """Spaces between columns: three when everything fits whole with them, else fewer."""
    need = sum(needs(columns, rows))
    return next((g for g in (3, 2) if need + g * (len(columns) - 1) <= width), 1)


def layout(
    columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int, spacing: int = 1
) -> list[int]:
    """Each column's width (0: dropped) so that the table fits ``width`` cells.

    Columns are ``spacing`` spaces apart. A column is as wide as its title
    and cells need, but a cut column only as wide as the room allows (at
    least its ``min``).
    """
    width -= (spacing - 1) * (len(columns) - 1)
    need = needs(columns, rows)
    least = [min(need[i], max(c.min, 1)) if c.cut else need[i] for i, c in enumerate(columns)]
    shown = list(range(len(columns)))
    while sum(least[i] for i in shown) + len(shown) - 1 > width:
        droppable = [i for i in shown if columns[i].drop]
        if not droppable:
            break
        shown.remove(max(droppable, key=lambda i: (columns[i].drop, i)))
    widths = [0] * len(columns)
    for i in shown:
        widths[i] = least[i]
    room = width - (sum(widths) + len(shown) - 1)
    # Share the room out evenly among the cut columns still short of their
    # need: the names first, then the ``later`` ones (free text).
    for later in (False, True):
        group = [i for i in shown if columns[i].later == later]
        while room > 0:
            short = [i for i in group if widths[i] < need[i]]
            if not short:
                break
            each = max(1, room // len(short))
            for i in short:
                give = min(each, need[i] - widths[i], room)
                widths[i] += give
                room -= give
    fills = [i for i in shown if columns[i].fill]
    if room > 0 and fills:
        widths[fills[-1]] += room
    return widths


class Fitted:
    """A table laid out (``layout``) for the width it is drawn in."""

    def __init__(
        self,
        columns: Sequence[Column],
        rows: Sequence[tuple[Sequence[Cell], str]],
    ) -> None:
        self.columns = list(columns)
        self.rows = list(rows)  # (cells, style)

    def table(self, width: int) -> Table:
        """The rich table at ``width`` cells."""
        cells = [c for c, _ in self.rows]
        spacing = gap(self.columns, cells, width)
        widths = layout(self.columns, cells, width, spacing)
        t = Table(
            box=box.SIMPLE_HEAD,  # its divider is the first space between columns
            expand=False,
            pad_edge=False,
            padding=(0, spacing - 1, 0, 0),
            show_edge=False,
        )
        keep = [i for i, w in enumerate(widths) if w]
        for i in keep:
            c = self.columns[i]
            w = widths[i]
            t.add_column(
                c.title,
                justify="right" if c.right else "left",
                width=w,
                min_width=w,
                max_width=w,
                no_wrap=True,
                overflow="ellipsis",
            )
        for row, style in self.rows:
            out: list[Cell] = []
            for i in keep:
                c, cell, w = self.columns[i], row[i], widths[i]
                if c.cut and isinstance(cell, str):
                    cell = ellipsize(cell, w, c.cut)
                elif c.cut and isinstance(cell, Text):
                    cell = cell.copy()
                    cell.truncate(w, overflow="ellipsis")
                out.append(cell)
            t.add_row(*out, style=style or None)
        return t

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)
