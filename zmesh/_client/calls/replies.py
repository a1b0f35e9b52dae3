"""``Stream``: the replies of a fan-out (``ref.stream(...)``), as they arrive.

Iterated sync or async, as often as one likes: a later pass replays what came.
(Generator endpoints stream items instead: ``zmesh._client.ports.streams``.)
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from zmesh._client.calls import pending as _pending
from zmesh._client.calls import runtime as _runtime
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._client.handles.adverbs import EndpointRef

R = TypeVar("R")


class Stream(Generic[R]):
    """Replies of a fan-out, as they arrive. Iterate it sync or async.

    The request goes out when the stream is made (like every adverb, so it
    keeps its place in send order), not when iteration begins.

    A stream can be iterated more than once, as a list can: a later pass
    replays the replies that arrived so far, in arrival order, then waits
    for the rest. A failure ends every pass at the same place, raising the
    same error again. (Python's one-shot iterators would hand a second pass
    nothing, which reads as "no replies"; a hang would be worse.)
    """

    def __init__(self, ref: EndpointRef[R], msg: Callable[[int], w.Call], buffers: list[Any]):
        self._n = len(ref._mesh._refs)
        # (ok, value) per reply, in arrival order: what every pass replays.
        self._seen: list[tuple[bool, Any]] = []
        refs, timeout = ref._mesh._refs, ref._timeout
        rt, home = _runtime.current()
        # A stream plain code made while its mesh spawned is sent later, from the loop.
        plain = not home or _pending.for_plain_code()
        self._loop = rt.loop if not plain else None
        self._aq: asyncio.Queue[tuple[int, bool, Any]] | None = None
        self._sq: queue.SimpleQueue[tuple[int, bool, Any]] | None = None
        self._lock = threading.Lock()  # plain code: passes in several threads
        deliver: Callable[[int, bool, Any], None]
        if not plain:
            aq = self._aq = asyncio.Queue()
            deliver = lambda i, ok, v: aq.put_nowait((i, ok, v))  # noqa: E731
        else:
            sq = self._sq = queue.SimpleQueue()
            deliver = lambda i, ok, v: sq.put((i, ok, v))  # noqa: E731
        targets = (r.addr for r in refs)
        rt.dispatch(rt.send, refs, msg, buffers, deliver, timeout, here=home, targets=targets)

    async def __aiter__(self) -> AsyncIterator[R]:
        loop = asyncio.get_running_loop()
        if self._aq is not None and loop is not self._loop:
            raise RuntimeError("iterate a stream in the event loop that made it")
        i = 0
        while i < self._n:
            if self._aq is None:  # made in plain code, iterated in a loop
                ok, value = await loop.run_in_executor(None, self._pull, i)
                if not ok:
                    raise value
            else:
                value = await self._nth(i)
            i += 1
            yield value

    def __iter__(self) -> Iterator[R]:
        if self._sq is None:
            # Made inside an event loop, iterated with a plain ``for``: as in Monarch,
            # each item is something to await for the next reply, in arrival order.
            if asyncio.get_running_loop() is not self._loop:  # (raises outside a loop)
                raise RuntimeError("iterate a stream in the event loop that made it")
            return (self._nth(i) for i in range(self._n))  # type: ignore[misc]
        return self._values()

    async def _nth(self, i: int) -> R:
        """Reply ``i`` of a stream made in a loop, in arrival order."""
        assert self._aq is not None
        while i >= len(self._seen):
            _, ok, value = await self._aq.get()
            self._seen.append((ok, value))
        ok, value = self._seen[i]
        if not ok:
            raise value
        return value

    def _values(self) -> Iterator[R]:
        i = 0
        while i < self._n:
            ok, value = self._pull(i)
            if not ok:
                raise value
            i += 1
            yield value

    def _pull(self, i: int) -> tuple[bool, Any]:
        """Reply ``i`` of a stream made in plain code, waiting for it if need be."""
        assert self._sq is not None
        with self._lock:  # passes in several threads take replies one at a time
            while i >= len(self._seen):
                _, ok, value = self._sq.get()
                self._seen.append((ok, value))
            return self._seen[i]
