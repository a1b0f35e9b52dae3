"""A warning when an ``async def`` endpoint blocks its proc's event loop.

``time.sleep(2)`` or a blocking ``requests.get`` inside an ``async def``
endpoint stops every other call, the heartbeats and the statistics of the
proc for as long as it runs. Nothing on the call path measures this: a
tick task on the loop notes the time every ``TICK``, and a watchdog thread
that sees the tick late looks at the loop thread's stack
(``sys._current_frames``) for the endpoint it is in. Once the loop runs
again, the tick logs one warning (to the proc's log, which its owner sees
forwarded) naming the endpoint, how long it held the loop and the fix::

    WARNING async endpoint Fetcher.fetch blocked the event loop for 2.0s: ...

The threshold is ``ZMESH_BLOCKED_LOOP_WARN`` seconds (0.5 by default; 0
turns the watch off).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from types import FrameType

from zmesh._actor import ActorBase, endpoints_of

log = logging.getLogger("zmesh.proc")

TICK = 0.25  # a wake-up of the loop and of the watchdog, four times a second
THRESHOLD = float(os.environ.get("ZMESH_BLOCKED_LOOP_WARN", "0.5"))


def start(loop: asyncio.AbstractEventLoop) -> None:
    """Watch ``loop`` (call from its thread) for the life of the process."""
    if THRESHOLD <= 0:
        return
    watch = _Watch(threading.get_ident())
    threading.Thread(target=watch.run, name="zmesh-loopwatch", daemon=True).start()
    loop.create_task(watch.tick())


class _Watch:
    def __init__(self, loop_thread: int) -> None:
        self.loop_thread = loop_thread
        self.last = time.monotonic()
        self.culprit = ""  # the endpoint seen holding the loop, while it does

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            late = now - self.last - TICK
            self.last = now
            if late >= THRESHOLD and self.culprit:
                log.warning(
                    "async endpoint %s blocked the event loop for %.1fs: a blocking call "
                    "inside 'async def' stops every other call of this proc; make it a plain "
                    "'def' endpoint (it then runs in a thread) or await a non-blocking call",
                    self.culprit, late,
                )  # fmt: skip
            self.culprit = ""

    def run(self) -> None:
        while True:
            time.sleep(TICK)
            if time.monotonic() - self.last < THRESHOLD or self.culprit:
                continue
            frame = sys._current_frames().get(self.loop_thread)
            if frame is not None:
                self.culprit = endpoint_in(frame)


def endpoint_in(frame: FrameType | None) -> str:
    """``Class.endpoint`` of the innermost async endpoint on ``frame``'s stack, else ``""``."""

    while frame is not None:
        me = frame.f_locals.get("self") if frame.f_code.co_argcount else None
        if isinstance(me, ActorBase):
            info = endpoints_of(type(me)).get(frame.f_code.co_name)
            if info is not None and info.is_async:
                return f"{type(me).__name__}.{info.name}"
        frame = frame.f_back
    return ""
