"""Actors for tests that start many procs.

A proc imports the module of the class it unpickles. This one imports
nothing but zmesh (a test module imports pytest, ~0.2 s per proc), so a
test that spawns a thousand meshes spends its time on zmesh, not imports.
"""

from __future__ import annotations

import os

import zmesh


class Echo(zmesh.Actor):
    """Answers with its argument, or its pid."""

    @zmesh.endpoint
    async def echo(self, x: int) -> int:
        return x

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()
