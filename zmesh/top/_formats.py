"""How ``zmesh top`` writes numbers and states: rates, latencies, sizes, ages.

Pure functions of their argument (``zmesh status`` and ``zmesh ps`` use them too).
"""

from __future__ import annotations

from rich.text import Text


def fmt_rate(v: float) -> str:
    if v == 0:
        return "0"
    if v < 10:
        return f"{v:.2f}"
    if v < 1000:
        return f"{v:.1f}"
    if v < 1e6:
        return f"{v / 1e3:.1f}k"
    return f"{v / 1e6:.1f}M"


def fmt_latency(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f}µs"
    if s < 1:
        return f"{s * 1e3:.1f}ms"
    return f"{s:.2f}s"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.1f}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{n}B"


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def fmt_minutes(s: float) -> str:
    """A span of whole seconds or minutes (``"90s"``, ``"5m"``)."""
    return f"{s / 60:g}m" if s >= 60 else f"{s:g}s"


def fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


_STATE_STYLE = {
    "Running": "green",
    "ok": "green",
    "Initializing": "yellow",
    "connecting": "yellow",
    "Stopping": "dim",
    "Stopped": "dim",
    "Failed": "bold red",
    "Timeout": "bold red",
    "Unknown": "red",
    "lost": "bold red",
    "STALE": "bold red",
}


def state_text(s: str) -> Text:
    """A state's word in its colour (failures red, the living green)."""
    return Text(s, style=_STATE_STYLE.get(s, ""))
