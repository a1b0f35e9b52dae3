"""One call in flight on a thread's lane, and the future a sync ``call_one`` returns.

``zmesh._client.calls.lanes`` says what a lane is; a ``SyncCall`` is its unit:
registered in the lane's ``calls`` before it is sent, settled once (by its
reply, supervision, its timeout or ``cancel``), and waited on by driving
the lane's socket from the waiting thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import zmq

from zmesh._client.calls.future import Future
from zmesh._client.calls.grouping import for_actor
from zmesh._client.calls.inflight import abandon
from zmesh._errors import CallTimeoutError
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._client.calls.lanes import Lane
    from zmesh._client.calls.runtime import ProcRef

_NOBLOCK = int(zmq.NOBLOCK)
# The Cython method under pyzmq's Python wrapper (see zmesh._wire.zsock).
_send = zmq.backend.Socket.send
_monotonic = time.monotonic
# A blocked .get() looks up at least this often (ms): for a failure that
# supervision delivered meanwhile, and to let another waiter drive the lane.
SLICE_MS = 20
_SLICE_S = SLICE_MS / 1000


class SyncCall(Future[Any]):
    """One call in flight on a lane, and the ``zmesh.Future`` of its result.

    Settled once, by a reply or a failure (the first wins), from any thread;
    ``.get()`` drives the lane's socket until then.
    """

    __slots__ = (
        "actor", "expires", "id", "lane", "method", "ok", "ref", "settled", "timeout", "value",
    )  # fmt: skip

    def __init__(
        self, lane: Lane, ref: ProcRef, req_id: int, method: str, timeout: float | None,
        actor: str = "",
    ) -> None:  # fmt: skip
        self.lane = lane
        self.ref = ref
        self.id = req_id
        self.method = method
        self.actor = actor  # its name in the proc, which a ``CancelCall`` gives
        self.timeout = timeout
        self.expires = _monotonic() + timeout if timeout is not None else 0.0
        self.settled = False
        self.ok = False
        self.value: Any = None
        self._mesh: Any = None  # set for an endpoint call (see Future)
        self._about = (ref, method)

    def settle(self, ok: bool, value: Any) -> None:
        """Give the call its outcome (the first one wins), from any thread."""
        # Whoever takes the call out of its lane's ``calls`` settles it: a
        # reply (its lane's thread, or a waiter driving the lane), supervision
        # (the I/O thread) or the call's timeout. One dict operation on int
        # keys, atomic under the GIL: no lock on the path of every reply.
        if self.lane.calls.pop(self.id, None) is None:
            return
        if not ok and self.ref.index >= 0:  # one of several actors of its proc
            value = for_actor(value, self.ref)
        self.ok = ok
        self.value = value
        self.settled = True  # last: a reader that sees it sees the outcome

    def get(self, timeout: float | None = None) -> Any:
        """Block until the result is ready and return it (or raise its error).

        Args:
            timeout: seconds to wait; ``None`` waits as long as it takes.

        Ctrl+C while it waits cancels the call (``cancel()``) before it propagates.

        Raises:
            CallTimeoutError: the timeout passed first (the call goes on).
            concurrent.futures.CancelledError: the call was cancelled.
        """
        try:
            return self._get(timeout)
        except KeyboardInterrupt:
            self.cancel()
            raise

    def _get(self, timeout: float | None) -> Any:
        if not self.settled:
            lane = self.lane
            # The usual wait, the reply within a slice: one blocking receive
            # without ``wait``'s bookkeeping (measured: 5-7 µs, ~3 % of a
            # sync round trip, alternating in one process). Not under a call's own deadline, which
            # ``wait`` keeps to the millisecond.
            if (
                not self.expires
                and (timeout is None or timeout >= _SLICE_S)
                and lane.lock.acquire(False)
            ):
                t0 = _monotonic() if timeout is not None else 0.0
                try:
                    sock = lane.socks.get(self.ref.addr)
                    if sock is not None and not self.settled:
                        lane._receive(sock, SLICE_MS)
                finally:
                    lane.lock.release()
                if timeout is not None and not self.settled:
                    timeout = max(0.0, timeout - (_monotonic() - t0))
            if not self.settled:
                lane.wait(self, timeout)
            if not self.settled:
                ref = self.ref
                raise CallTimeoutError(
                    f"{self.method!r}: no result within {timeout}s (the call goes on; "
                    ".cancel() ends it)",
                    mesh=ref.mesh, rank=ref.rank, host=ref.host, log_path=ref.log_path or None,
                )  # fmt: skip
        if self.ok:
            return self.value
        raise self._failure(self.value)

    def done(self) -> bool:
        """Whether the result (or error) is ready, reading what has arrived (never blocks)."""
        if not self.settled:
            self.lane.wait(self, 0.0)
        return self.settled

    def cancel(self) -> bool:
        """Cancel the call unless it has ended (see ``Future.cancel``), from any thread."""
        lane = self.lane
        if self.settled or lane.calls.get(self.id) is not self:
            return False
        with lane.lock:
            sock = lane.socks.get(self.ref.addr)
            if sock is not None:  # the call's own connection: the cancel arrives after it
                _send(sock, lane.encode(w.CancelCall(self.id, self.actor)), _NOBLOCK)
        abandon(lane.abandoned, self.id, "cancelled")
        self.settle(False, concurrent.futures.CancelledError())
        return True

    def __await__(self) -> Generator[Any, None, Any]:
        return self._await().__await__()

    async def _await(self) -> Any:
        # Its lane's socket is driven by a blocking wait: in another thread.
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self.get)
        except asyncio.CancelledError:
            self.cancel()
            raise
