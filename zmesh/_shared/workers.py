"""Worker threads for sync endpoints, sync generators, ``__init__`` and hooks.

Used by each proc, and by ``zmesh.testing.local_mesh``'s meshes. Anything
in a proc that may block runs in one of these threads so the event loop (and
with it every other actor, and the heartbeats) keeps going.
Threads that wait for each other are normal here: actors of one proc meeting
at a barrier, a sync generator waiting for its reader's credit, an
``__init__`` waiting for a sibling. A pool that queues work once all its
threads are busy turns those waits into deadlocks (100 actors of one proc at
a ``threading.Barrier`` never met with 64 threads). So the pool is wide
(``ZMESH_PROC_THREADS``, 1024 by default): a thread is only made when every
thread made so far is busy, and an idle one is reused, so a proc pays for
the most it ever ran at once, not for the limit. If the limit is reached
anyway, work waits for a thread and the proc's log says so, once.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger("zmesh.workers")

MAX_THREADS = int(os.environ.get("ZMESH_PROC_THREADS", "1024"))


class Workers(ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` that grows to ``MAX_THREADS`` and says when it is full."""

    def __init__(self, max_threads: int = MAX_THREADS, name: str = "zmesh-endpoint") -> None:
        super().__init__(max_workers=max_threads, thread_name_prefix=name)
        self.limit = max_threads
        self.warned = False

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut = super().submit(fn, *args, **kwargs)
        # Full: every thread exists and work is queued behind them. (The
        # executor's own fields: it exposes no count of busy threads.)
        if not self.warned and len(self._threads) >= self.limit and self._work_queue.qsize():
            self.warned = True
            log.warning(
                "all %d worker threads of this process are busy: sync endpoints, sync generators "
                "and __init__ wait for one (threads that wait for each other may never "
                "finish); raise ZMESH_PROC_THREADS or make long waits async",
                self.limit,
            )
        return fut
