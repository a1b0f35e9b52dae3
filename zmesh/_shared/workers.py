"""Worker threads for sync endpoints, sync generators, ``__init__`` and hooks.

Used by each proc, and by ``zmesh.testing.local_mesh``'s meshes. Anything
in a proc that may block runs in one of these threads so the event loop (and
with it every other actor, and the heartbeats) keeps going. (In a proc, a
sync endpoint runs in its actor's own thread when that is free,
``zmesh._host.proc.actorthread``; here otherwise.)

Threads that wait for each other are normal here: actors of one proc meeting
at a barrier, a sync generator waiting for its reader's credit, an
``__init__`` waiting for a sibling. A pool that only queues work once all its
threads are busy turns those waits into deadlocks (100 actors of one proc at
a ``threading.Barrier`` never met with 64 threads). More threads for every
burst is no answer either: a pipeline of short calls to a ``concurrent``
sync endpoint would make hundreds, which then fight over the GIL.

So the pool keeps ``BASE`` threads (64) while work flows, and a watcher
grows it when work waits and no queued item has started for ``PATIENCE``
(20 ms, four GIL switch intervals) while no other thread of the process is
runnable: then every thread is blocked, and each waiting item gets a thread
of its own, up to ``ZMESH_PROC_THREADS`` (1024). If the limit is reached,
work waits for a thread and the log says so, once. The watcher sleeps while
nothing is queued.

"Nothing started" alone is not "blocked": on a starved machine (load 27 on
2 cores) a process can go 20 ms without the CPU, and a pool that grew then
would make a hundred threads just when the machine can least afford them.
So on Linux the watcher also asks the kernel (``/proc/self/task/*/stat``)
whether any other thread is runnable; a runnable thread will start work
once it gets a core. Only a stall of ``STUCK`` (1 s) grows the pool anyway,
so a thread that spins for ever beside blocked workers cannot starve them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger("zmesh.workers")

BASE = 64
MAX_THREADS = int(os.environ.get("ZMESH_PROC_THREADS", "1024"))
PATIENCE = 0.02  # four GIL switch intervals: a busy GIL alone is not "blocked"
STUCK = 1.0  # no item started for this long: grow even if some thread is runnable


class Workers(ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` that grows past ``base`` threads when they are all blocked."""

    def __init__(
        self, max_threads: int = MAX_THREADS, name: str = "zmesh-endpoint", base: int = BASE
    ) -> None:
        super().__init__(max_workers=min(base, max_threads), thread_name_prefix=name)
        self.limit = max_threads
        self.warned = False
        self.started = 0  # items a thread took (racy increments: a progress hint only)
        self._queued = threading.Condition()
        self._watcher: threading.Thread | None = None

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut = super().submit(self._run, fn, args, kwargs)
        if self._work_queue.qsize():  # every thread is busy: have the watcher look
            with self._queued:
                if self._watcher is None:
                    self._watcher = threading.Thread(
                        target=self._watch, name=f"{self._thread_name_prefix}-watch", daemon=True
                    )
                    self._watcher.start()
                self._queued.notify()
        return fut

    def _run(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.started += 1
        return fn(*args, **kwargs)

    def _watch(self) -> None:
        me = threading.get_native_id()
        stalled_since: float | None = None
        while not self._shutdown:
            with self._queued:
                if not self._work_queue.qsize():
                    stalled_since = None
                    self._queued.wait(1.0)
                    continue
            before = self.started
            time.sleep(PATIENCE)
            waiting = self._work_queue.qsize()
            if not waiting or self.started != before:
                stalled_since = None
                continue
            now = time.monotonic()
            stalled_since = stalled_since or now
            if now - stalled_since >= STUCK or not runnable_threads(exclude=me):
                stalled_since = None
                self._grow(waiting)

    def _grow(self, waiting: int) -> None:
        with self._shutdown_lock:  # as submit() holds it around the same calls
            if not self._shutdown:
                self._grow_locked(waiting)

    def _grow_locked(self, waiting: int) -> None:
        if self._max_workers >= self.limit:
            if not self.warned:
                self.warned = True
                log.warning(
                    "all %d worker threads of this process are blocked: sync endpoints, sync "
                    "generators and __init__ wait for one (threads that wait for each other may "
                    "never finish); raise ZMESH_PROC_THREADS or make long waits async",
                    self.limit,
                )
            return
        self._max_workers = min(self.limit, self._max_workers + waiting)
        for _ in range(waiting):
            self._adjust_thread_count()  # one more thread each (none is idle)


def runnable_threads(exclude: int) -> bool:
    """Whether a thread of this process other than ``exclude`` is running or runnable.

    Reads each thread's state from ``/proc/self/task/*/stat`` (the letter after
    the parenthesised name: ``R`` is running or waiting for a core). A thread
    waiting for the GIL sleeps on a lock, but the thread that holds it is
    runnable, so a busy GIL counts as "runnable" too. Where ``/proc`` is
    missing this says False, and the pool grows on "nothing started" alone.
    """
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tids:
        if tid == str(exclude):
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        if stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"R":
            return True
    return False
