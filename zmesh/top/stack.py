"""``zmesh stack`` (the module the ``zmesh`` command dispatches to)."""

from __future__ import annotations

from zmesh.top._cli import stack_main as main

__all__ = ["main"]
