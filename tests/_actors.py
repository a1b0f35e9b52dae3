"""Actors shared by tests in several folders.

A proc imports the module of the class it unpickles, so these live in a
module that imports nothing but zmesh (a test module imports pytest, ~0.2 s
per proc). A test module subclasses them to add what only it needs.
"""

from __future__ import annotations

import asyncio
import os

import zmesh


def expected(i: int) -> int:
    """What ``Worker.work(i)`` answers: a deterministic function of ``i``."""
    return (i * 2654435761) % 1_000_003


class Pid(zmesh.Actor):
    """Says which process it runs in."""

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


class Ranked(Pid):
    """Says its pid and its rank."""

    @zmesh.endpoint
    async def ping(self) -> int:
        return zmesh.current_rank().rank


class Napper(Pid):
    """Takes a while, then says its pid (many calls at once)."""

    @zmesh.endpoint(concurrent=True)
    async def nap(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return os.getpid()


class Journal(zmesh.Actor):
    """Notes numbers in arrival order (for ordering checks); ``take`` hands them over."""

    def __init__(self) -> None:
        self.log: list[int] = []

    @zmesh.endpoint
    async def append(self, i: int) -> int:
        await asyncio.sleep(0)  # a chance to interleave, were it allowed
        self.log.append(i)
        return i

    @zmesh.endpoint
    async def take(self) -> list[int]:
        log, self.log = self.log, []
        return log


class Worker(Pid):
    """Answers ``expected(i)`` after 10 ms (many calls at once)."""

    @zmesh.endpoint(concurrent=True)
    async def work(self, i: int) -> int:
        await asyncio.sleep(0.01)
        return expected(i)
