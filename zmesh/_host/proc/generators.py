"""Generator endpoints, the proc's half: run a generator and stream its items.

A ``StreamCall`` of an endpoint written as a generator (``def`` with
``yield``) or an async generator runs like any message of its actor (one at a
time, unless the endpoint is ``concurrent``), but answers with a
``StreamItem`` per item, then ``StreamEnd``, or a ``Failure`` after the items
before it.

Flow control is credit-based: the producer starts with ``window`` credits,
spends one per item, and waits when it has none until the consumer's
``Credit`` arrives, so neither this process nor the consumer holds more than
``window`` items of one stream. ``Cancel`` (the consumer broke out of its loop,
closed the stream, or dropped it) closes the generator: its ``finally`` runs.
A consumer that dies sends nothing: a producer waiting for credit checks
every ``PROBE_INTERVAL`` that its consumer's connection is still there
(``ROUTER_MANDATORY`` refuses a message to a peer that is gone) and closes
the generator when it is not.

However a stream ends, its actor goes on with its next message: only the
actor's own stop (its task cancelled) ends the actor. A consumer that goes
away, a generator that raises, even in its ``finally`` while it closes, ends
that stream alone (what nobody is left to read is logged).

An async generator runs on the loop, in a task of its own so that a cancel
reaches it even while it awaits. A sync generator runs in one worker thread
for the whole stream (one thread hop per item would halve the rate); its
items reach the loop through one queue, in order, with one wake-up per batch.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

import zmq

from zmesh._host.proc import bounds as _bounds
from zmesh._host.proc import lifecycle as _lifecycle
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

if TYPE_CHECKING:
    from zmesh._actor import Endpoint
    from zmesh._host.proc.procserver import ProcServer
    from zmesh._shared.stats import EndpointCounters

log = logging.getLogger("zmesh.proc")

PROBE_INTERVAL = 0.25  # seconds without credit between checks that the consumer is there
# Cancels of streams not started yet, remembered at most: as many as calls
# may wait in the proc (its backlog bound), so none of a queued stream is
# forgotten. A forgotten one would start with its reader still connected but
# no longer reading, and wait for its credit for ever: its actor wedged.
_EARLY_CANCELS = _bounds.MAX_BACKLOG


class _Cancelled(Exception):
    """The consumer cancelled the stream, or is gone."""


class Producer:
    """One running stream: its credit, and whether its consumer is done with it."""

    __slots__ = (
        "cancelled", "cond", "credit", "id", "ident", "inside", "out", "posted", "task", "thrown",
        "wake",
    )  # fmt: skip

    def __init__(self, ident: bytes, req_id: int, window: int) -> None:
        self.ident = ident
        self.id = req_id
        self.credit = window
        self.cancelled = False
        self.wake = asyncio.Event()  # credit or a cancel arrived (async generators)
        self.cond = threading.Condition()  # the same, for a sync generator's thread
        self.out: deque[Any] = deque()  # a sync generator's items, for the loop to send
        self.posted = False  # a flush of ``out`` is scheduled on the loop
        self.task: asyncio.Task[Any] | None = None
        self.inside = False  # an async generator's task is inside ``__anext__``
        self.thrown = False  # the cancel was thrown into that task (once at most)

    def grant(self, n: int) -> None:
        with self.cond:
            self.credit += n
            self.cond.notify()
        self.wake.set()

    def cancel(self) -> None:
        """The consumer is done with the stream (or gone): the generator stops."""
        with self.cond:
            if self.cancelled:
                return  # (once: a second cancel must not reach a generator that closes)
            self.cancelled = True
            self.cond.notify()
        self.wake.set()
        task = self.task
        # Only a generator awaiting inside ``__anext__`` needs the cancel thrown
        # in; one waiting for credit has the wake-up. Never the task's own
        # cancel (the probe runs in it): that CancelledError would leave the
        # actor's task too, and the actor would serve nothing more.
        if task is not None and self.inside and task is not asyncio.current_task():
            self.thrown = True
            task.cancel()


class Producers:
    """The streams running in one proc, by (caller identity, request id)."""

    def __init__(self, server: ProcServer) -> None:
        self.server = server
        self.running: dict[tuple[bytes, int], Producer] = {}
        self.early: dict[tuple[bytes, int], None] = {}  # cancelled before they started

    def control(self, ident: bytes, msg: w.Credit | w.Cancel) -> None:
        """A consumer's ``Credit`` or ``Cancel`` for one of its streams."""
        key = (ident, msg.id)
        p = self.running.get(key)
        if type(msg) is w.Credit:
            if p is not None:
                p.grant(msg.n)
        elif p is not None:
            p.cancel()
        else:  # still queued behind other messages of its actor (or over)
            self.early[key] = None
            if len(self.early) > _EARLY_CANCELS:
                del self.early[next(iter(self.early))]

    async def run(
        self,
        instance: Any,
        ident: bytes,
        call: w.Call,
        ep: Endpoint[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        counters: EndpointCounters,
    ) -> None:
        """Serve ``call`` of the generator endpoint ``ep``, from start to end."""
        server = self.server
        if type(call) is not w.StreamCall:
            if call.oneway:
                log.error("%s is a generator endpoint: a oneway call of it is ignored", call.method)
                return
            server.fail(
                ident, call, "endpoint", "EndpointError",
                f"{call.method!r} is a generator endpoint: iterate ref.{call.method}.call_one(...) "
                f"or mesh.{call.method}.call(...) to read its items",
            )  # fmt: skip
            return
        key = (ident, call.id)
        if key in self.early:
            del self.early[key]
            return  # the consumer gave up before it started
        try:
            gen = ep.fn(instance, *args, **kwargs)
        except TypeError as exc:
            tb = exc.__traceback__
            if tb is not None and tb.tb_next is None:  # the arguments did not fit
                server.fail(ident, call, "endpoint", "TypeError", f"bad arguments: {exc}")
                return
            raise
        t0 = counters.begin()
        p = Producer(ident, call.id, call.window or ep.info.window)
        self.running[key] = p
        error: BaseException | None
        try:
            if inspect.isasyncgen(gen):
                p.task = asyncio.ensure_future(self._drive_async(p, gen))
                error = await p.task
                if _stopping():  # (the actor's cancel reached a stream that was ending anyway)
                    raise asyncio.CancelledError
            else:
                loop = asyncio.get_running_loop()
                error = await loop.run_in_executor(server.pool, self._pump, p, gen, loop)
                self._flush(p)
        except BaseException as exc:
            if _lifecycle.cancelled(exc):  # the actor stops: so does its generator
                p.cancel()
                counters.in_flight -= 1
                raise
            error = exc  # whatever else: this stream fails, the actor goes on
        finally:
            del self.running[key]
        counters.end(t0, int(error is not None and not isinstance(error, _Cancelled)))
        if isinstance(error, _Cancelled):
            return  # nobody is reading: nothing more to send
        if p.cancelled and error is not None:
            # (An error thrown out of the generator's ``finally`` as it closed.)
            log.error("stream %d of %s raised after its consumer went", call.id, call.method,
                      exc_info=error)  # fmt: skip
            return
        if error is None:
            server.router.send([ident, *server.codec.encode(w.StreamEnd(call.id))])
        elif isinstance(error, _Unsendable):
            server.fail(ident, call, "encode", error.type, error.message)
        else:
            server._send_failure(ident, call.id, "actor", error, call.method)

    # ------------------------------------------------------------ async

    async def _drive_async(self, p: Producer, agen: Any) -> BaseException | None:
        """Run an async generator: the error that ended it, or ``None``."""
        error: BaseException | None
        try:
            error = await self._items_async(p, agen)
        except asyncio.CancelledError:
            if not p.cancelled:
                # The actor stops (its task was cancelled, and so this one):
                # the generator closes on the way out.
                await _aclose(p, agen)
                raise
            error = _Cancelled()
        except BaseException as exc:  # whatever the generator raised fails this stream alone
            error = exc
        if p.thrown:
            # The consumer's cancel is spent: the generator's ``finally`` runs
            # in a task that is not being cancelled (its awaits, its
            # ``asyncio.timeout``s work), and this task ends with a value.
            task = asyncio.current_task()
            if _stopping():  # (Python 3.11+: cancelling() and uncancel() exist)
                task.uncancel()  # type: ignore[union-attr]
        await _aclose(p, agen)  # a no-op once it ended; else its ``finally`` runs now
        return error

    async def _items_async(self, p: Producer, agen: Any) -> BaseException | None:
        """Send ``agen``'s items as credit allows, until it ends or the consumer goes."""
        while True:
            while p.credit <= 0 and not p.cancelled:
                p.wake.clear()
                try:
                    await asyncio.wait_for(p.wake.wait(), PROBE_INTERVAL)
                except TimeoutError:
                    self._probe(p)
            if p.cancelled:
                return _Cancelled()
            p.credit -= 1
            p.inside = True  # a cancel from now on is thrown in where the generator awaits
            try:
                item = await agen.__anext__()
            except StopAsyncIteration:
                return None
            finally:
                p.inside = False
            if p.cancelled:
                return _Cancelled()  # (it caught the cancel and yielded anyway)
            bad = self._send_item(p, item)
            if bad is not None:
                return bad

    # ------------------------------------------------------------ sync

    def _pump(self, p: Producer, gen: Any, loop: asyncio.AbstractEventLoop) -> Any:
        """Run a sync generator, in a worker thread: its items go through ``p.out``."""
        try:
            while True:
                with p.cond:
                    while p.credit <= 0 and not p.cancelled:
                        if not p.cond.wait(PROBE_INTERVAL):
                            loop.call_soon_threadsafe(self._probe, p)
                    if p.cancelled:
                        return _Cancelled()
                    p.credit -= 1
                try:
                    item = next(gen)
                except StopIteration:
                    return None
                with p.cond:
                    p.out.append(item)
                    if p.posted:
                        continue
                    p.posted = True
                loop.call_soon_threadsafe(self._flush, p)
        except BaseException as exc:  # carried back as a value (see zmesh._shared.invoke)
            return exc
        finally:
            # In this thread, as the generator ran: its ``finally`` runs. What
            # that raises has no reader left (the stream ended or was cancelled).
            try:
                gen.close()
            except Exception:
                log.exception("the generator of stream %d raised while it closed", p.id)

    def _flush(self, p: Producer) -> None:
        """Send what a sync generator made so far, in order (on the loop)."""
        with p.cond:
            items = list(p.out)
            p.out.clear()
            p.posted = False
        for item in items:
            if p.cancelled:
                return
            bad = self._send_item(p, item)
            if bad is not None:
                p.cancel()
                return

    # ------------------------------------------------------------ sending

    def _send_item(self, p: Producer, item: Any) -> _Unsendable | None:
        server = self.server
        try:
            payload, buffers = Codec.pack_value(item)
            frames = server.codec.encode(w.StreamItem(p.id, payload), buffers)
            server.router.send([p.ident, *frames])
        except Exception as exc:
            return _Unsendable(type(exc).__name__, f"an item cannot be sent: {exc}")
        return None

    def _probe(self, p: Producer) -> None:
        """Cancel ``p`` if its consumer's connection is gone."""
        if p.cancelled:
            return
        frames = [p.ident, *self.server.codec.encode(w.StreamAlive(p.id))]
        router = self.server.router
        try:
            # Straight on the socket, to see ROUTER_MANDATORY's refusal
            # (under its lock: an actor's thread may send on it too).
            with router.guard():
                router.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            pass  # there, and busy
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                log.info("the consumer of stream %d is gone: closing its generator", p.id)
                p.cancel()
        finally:
            # That send may have taken the wake-up of a message that arrived
            # meanwhile (ZMQ_FD is edge-triggered): without a second look the
            # proc stays deaf to it until something else arrives.
            router.recheck()


def _stopping() -> bool:
    """Whether the running task (the actor's) is being cancelled: the actor stops."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return cancelling is not None and cancelling() > 0


async def _aclose(p: Producer, agen: Any) -> None:
    """Close ``agen``: what its ``finally`` raises has no reader left, so it is logged."""
    try:
        await agen.aclose()
    except Exception:
        log.exception("the generator of stream %d raised while it closed", p.id)


class _Unsendable(Exception):
    """An item that cannot be encoded: the stream fails with ``EncodeError``."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(message)
        self.type = type_name
        self.message = message
