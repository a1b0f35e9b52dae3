"""Actors shared by the core-fabric integration tests.

A proc imports the module of the class it unpickles, so shared actors live
in a module that imports nothing but zmesh; the shared helpers (waiting,
processes) are in ``tests/_helpers.py``.
"""

from __future__ import annotations

import zmesh


class Notebook(zmesh.Actor):
    """An actor that records tokens in arrival order (for ordering checks)."""

    notes: list[str]

    @zmesh.endpoint
    async def note(self, token: str) -> None:
        self.notes.append(token)

    @zmesh.endpoint
    async def seen(self) -> list[str]:
        return list(self.notes)
