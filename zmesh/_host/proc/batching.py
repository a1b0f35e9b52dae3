"""Request batching in the proc: many single calls, one invocation.

An endpoint declared ``@zmesh.endpoint(batch=8, batch_wait=0.005)`` takes a
list and returns a list of the same length. Callers send one item each
(``await svc.embed(x)``); the proc gathers up to ``batch`` pending calls, or
what arrived within ``batch_wait`` seconds of the first, and invokes the
endpoint once with their items. Each caller gets its own element back, or,
if the invocation raised, the exception.

Batches of one endpoint run one at a time, beside the actor's other
messages (as a ``concurrent`` endpoint's do): calls that arrive while a
batch runs wait for the next one, so under load batches fill by themselves
and an idle endpoint answers a lone call after ``batch_wait``.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import TYPE_CHECKING, Any

from zmesh._host.proc import bounds as _bounds
from zmesh._shared import stats as _stats
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

if TYPE_CHECKING:
    from zmesh._actor import Endpoint
    from zmesh._host.proc.procserver import ProcServer


class Batcher:
    """The pending calls of one batched endpoint of one actor."""

    def __init__(
        self,
        server: ProcServer,
        instance: Any,
        ep: Endpoint[Any, Any],
        counters: _stats.EndpointCounters,
        context: contextvars.Context | None,
    ) -> None:
        self.server = server
        self.instance = instance
        self.ep = ep
        self.name = ep.info.name
        self.size = ep.info.batch
        self.wait = ep.info.batch_wait
        self.counters = counters
        self.context = context  # the actor's (current rank, ...), once its task set it
        self.pending: list[tuple[bytes, w.Call, list[Any]]] = []
        self.first_at = 0.0  # loop time the oldest pending call arrived
        self.timer: asyncio.TimerHandle | None = None
        self.running: asyncio.Task[None] | None = None
        # The running batch's calls, and whether its task took its first step
        # (close() answers them: a task cancelled before that never runs).
        self.current: list[tuple[bytes, w.Call, list[Any]]] = []
        self.begun = False

    def add(self, ident: bytes, call: w.Call, frames: list[Any]) -> None:
        """A call to the endpoint arrived: batch it."""
        loop = asyncio.get_running_loop()
        if not self.pending:
            self.first_at = loop.time()
        self.pending.append((ident, call, frames))
        self.server.took(_bounds.call_bytes(call, frames))
        if self.running is not None:
            return  # the batch after the running one
        if len(self.pending) >= self.size:
            self._flush()
        elif self.timer is None:
            self.timer = loop.call_at(self.first_at + self.wait, self._flush)

    def _flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.running is not None or not self.pending:
            return
        batch, self.pending = self.pending[: self.size], self.pending[self.size :]
        if self.pending:
            self.first_at = asyncio.get_running_loop().time()
        self.current, self.begun = batch, False
        run = self._run(batch)
        ctx = self.context if self.context is not None else contextvars.copy_context()
        self.running = ctx.run(asyncio.ensure_future, run)
        self.running.add_done_callback(self._ran)

    def _ran(self, task: asyncio.Task[None]) -> None:
        self.running = None
        if not self.pending:
            return
        loop = asyncio.get_running_loop()
        if len(self.pending) >= self.size or loop.time() >= self.first_at + self.wait:
            self._flush()
        else:
            self.timer = loop.call_at(self.first_at + self.wait, self._flush)

    async def _run(self, batch: list[tuple[bytes, w.Call, list[Any]]]) -> None:
        self.begun = True
        server, counters = self.server, self.counters
        items: list[Any] = []
        callers: list[tuple[bytes, w.Call]] = []
        now = time.monotonic()  # deadlines are on this proc's clock (zmesh._wire.deadlines)
        for ident, call, frames in batch:
            server.started(_bounds.call_bytes(call, frames))
            if call.deadline and now > call.deadline:
                server.late += 1
                server.fail(ident, call, "deadline", "DeadlineExceeded", "request arrived too late")
                continue
            try:
                args, kwargs = server.codec.unpack(call.payload, frames)
            except Exception as exc:
                counters.errors += 1
                server.fail(ident, call, "endpoint", type(exc).__name__, f"undecodable: {exc}")
                continue
            if len(args) != 1 or kwargs:
                counters.errors += 1
                server.fail(
                    ident, call, "endpoint", "TypeError",
                    f"batched endpoint {self.name!r} takes one item per call "
                    f"(got {len(args)} arguments and {sorted(kwargs)} keywords)",
                )  # fmt: skip
                continue
            items.append(args[0])
            callers.append((ident, call))
        if not callers:
            return
        counters.batches += 1
        counters.batched += len(callers)
        t0 = counters.begin()
        try:
            results = await self._invoke(items)
            if not isinstance(results, list | tuple) or len(results) != len(items):
                got = len(results) if isinstance(results, list | tuple) else type(results).__name__
                raise TypeError(
                    f"batched endpoint {self.name!r} must return a list of {len(items)} "
                    f"values (one per call), returned {got}"
                )
        except Exception as exc:
            counters.end(t0, 1)
            for ident, call in callers:
                if not call.oneway:
                    server._send_failure(ident, call.id, "actor", exc, call.method)
            return
        counters.end(t0, 0)
        for (ident, call), value in zip(callers, results, strict=True):
            if call.oneway:
                continue
            try:
                payload, buffers = Codec.pack_value(value)
                server.router.send(
                    [ident, *server.codec.encode(w.Reply(call.id, payload), buffers)]
                )
            except Exception as exc:
                server.fail(
                    ident, call, "encode", type(exc).__name__,
                    f"return value of {call.method!r} cannot be sent: {exc}",
                )  # fmt: skip

    async def _invoke(self, items: list[Any]) -> Any:
        fn = self.ep.fn
        if self.ep.info.is_async:
            return await fn(self.instance, items)
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.server.pool, ctx.run, fn, self.instance, items)

    def close(self) -> None:
        """The actor stops: pending calls fail, a running batch is cancelled
        and its calls fail too (none waits for an answer that cannot come)."""
        if self.timer is not None:
            self.timer.cancel()
        if self.running is not None and not self.running.done():
            # Not answered yet: replies go out only after the batch's work ends.
            for ident, call, _ in self.current:
                self.server.fail(ident, call, "stopped", "ActorStopped", "actor stopped")
                if not self.begun:
                    self.server.started()
            self.running.cancel()
        for ident, call, frames in self.pending:
            self.server.fail(ident, call, "stopped", "ActorStopped", "actor stopped")
            self.server.started(_bounds.call_bytes(call, frames))
        self.pending.clear()
