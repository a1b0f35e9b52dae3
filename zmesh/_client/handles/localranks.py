"""The actors of an in-process mesh and their loop: the mesh's transport.

``LocalRanks`` stands in for a mesh's procs in ``zmesh.testing.local_mesh``
(``zmesh._client.handles.inprocess`` holds the handle): one event loop in a
daemon thread of its own; async endpoints run on it, sync ones in a thread
pool, one message at a time per actor (in send order, by an
``asyncio.Lock``, which is FIFO) unless ``concurrent``. A call is
encoded and decoded with the wire codec, so an actor gets copies, as over
the wire; its outcome is the proc's (``zmesh._shared.invoke``), carried back
as a proc carries it. ``submit`` and ``fan_out`` are the verbs every
transport has (``zmesh._client.calls.transport``), with a rank for a proc.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import pickle
import threading
import traceback
import weakref
from typing import Any

from zmesh._actor import Endpoint, Point, set_current
from zmesh._client.calls.future import Future
from zmesh._client.calls.inflight import CallSpec
from zmesh._client.calls.transport import Deliver
from zmesh._errors import (
    ActorError,
    ActorStoppedError,
    CallTimeoutError,
    EncodeError,
    EndpointError,
    SupervisionError,
    ZmeshError,
    encode_error,
)
from zmesh._shared.invoke import (
    BAD_ARGUMENTS,
    EXITED,
    RETURNED,
    STOPPED,
    Raised,
    invoke,
    invoke_sync,
    raised,
    returned,
)
from zmesh._shared.workers import Workers
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

log = logging.getLogger("zmesh.testing")
# Every live local mesh, by id: a handle passed as an argument finds its mesh here.
meshes: weakref.WeakValueDictionary[int, LocalRanks] = weakref.WeakValueDictionary()
_HOST = "local"
# Codecs hold no state between messages: one for each direction serves all.
_TO_PROC = Codec(w.PROC_INBOX)
_TO_CLIENT = Codec(w.CLIENT_INBOX)


class LocalRanks:
    """The actors of one local mesh and the loop they run on (what procs would be)."""

    def __init__(
        self,
        mesh_id: int,
        name: str,
        dims: dict[str, int],
        endpoints: dict[str, Endpoint[Any, Any]],
    ) -> None:
        self.id = mesh_id
        self.name = name
        self.dims = dims
        self.endpoints = endpoints
        self.instances: dict[int, Any] = {}
        self.locks: dict[int, asyncio.Lock] = {}
        self.broken: dict[int, str] = {}  # rank -> why it "died"
        self.stopped = False
        self.loop = asyncio.new_event_loop()
        self.pool = Workers(name=f"{name}-ep")  # ranks that wait for each other all get one
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()
        meshes[self.id] = self

    def context(self, **more: Any) -> dict[str, Any]:
        return {"mesh": self.name, "host": _HOST, **more}

    def soon(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def submit(self, rank: int, spec: CallSpec) -> Future[Any]:
        """``spec`` to ``rank``'s actor, run on this mesh's loop; the future of its answer."""
        frames = encode(spec)  # here, in the caller's thread, as EndpointRef does
        cfut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self.stopped:  # its loop is gone: the future fails, as a stopped mesh's calls do
            cfut.set_exception(ActorStoppedError("the mesh was stopped", **self.context()))
        else:
            self.soon(self._deliver(rank, spec.method, frames, spec.timeout)).add_done_callback(
                functools.partial(_settle, cfut, self.context(rank=rank))
            )
        return Future(cfut=cfut, about=(self.name, spec.method))

    def fan_out(self, ranks: list[int], spec: CallSpec, deliver: Deliver | None) -> None:
        """``spec`` to every rank of ``ranks``; a one-way call's error is logged,
        as a proc logs it."""
        for i, rank in enumerate(ranks):
            cfut = self.submit(rank, spec)._concurrent()
            cfut.add_done_callback(functools.partial(_answered, deliver, i, spec.method))

    async def _deliver(
        self, rank: int, method: str, frames: list[Any], timeout: float | None
    ) -> Any:
        if timeout is None:
            return await self.run(rank, method, frames)
        try:
            return await asyncio.wait_for(self.run(rank, method, frames), timeout)
        except asyncio.TimeoutError:
            raise CallTimeoutError(
                f"no reply within {timeout}s", **self.context(rank=rank)
            ) from None

    def check(self, rank: int) -> None:
        """Raise what a call to ``rank`` would meet now: a stopped or broken rank."""
        if self.stopped:
            raise ActorStoppedError("the mesh was stopped", **self.context(rank=rank))
        if rank in self.broken:
            reason = self.broken[rank]
            raise SupervisionError(
                f"rank is Failed: {reason}", reason=reason, **self.context(rank=rank)
            )

    async def run(self, rank: int, method: str, frames: list[Any]) -> Any:
        """Deliver one call to ``rank``: decode it, run the endpoint, encode the result."""
        self.check(rank)
        ep = self.endpoints[method]
        if ep.info.stream or ep.info.port:  # (no proc, no sockets: no streams or ports here)
            what = "a generator" if ep.info.stream else "an explicit-response-port"
            raise EndpointError(
                f"endpoint {method!r} is {what} endpoint, which a local mesh does not run: "
                "test it on a real mesh (Cls.options().as_actor())", **self.context(rank=rank)
            )  # fmt: skip
        lock = self.locks[rank] if not ep.info.concurrent else None
        if lock is not None:
            await lock.acquire()
        try:
            self.check(rank)  # it may have broken while this call waited its turn
            args, kwargs = decode_call(frames)
            instance = self.instances[rank]
            # This call's task has a context of its own: what the endpoint sees.
            set_current(Point(rank, dict(self.dims)), instance)
            try:  # (awaited here, in this frame: see zmesh._shared.invoke)
                if ep.info.is_async:
                    result = await invoke(ep.fn, instance, args, kwargs)
                else:
                    ctx = contextvars.copy_context()
                    result = await self.loop.run_in_executor(
                        self.pool, ctx.run, invoke_sync, ep.fn, instance, args, kwargs
                    )
                    if type(result) is Raised:
                        raise result.exc
            except BaseException as exc:
                out = raised(exc)
            else:
                out = returned(result)
        finally:
            if lock is not None:
                lock.release()
        kind, value = out.kind, out.value
        if kind is RETURNED:
            return _copy(value, method, self.context(rank=rank))
        if kind is BAD_ARGUMENTS:
            msg = f"endpoint {method!r}: {out.why}"
            raise EndpointError(msg, **self.context(rank=rank)) from value.__cause__
        # A cancellation (the mesh stops, the caller cancels) goes on as it is;
        # so does a zmesh error (a call the endpoint made failed).
        if kind is STOPPED or isinstance(value, ZmeshError):
            raise value
        if kind is EXITED:  # a proc would exit: the rank breaks
            self.broken[rank] = f"exited with code {value.code if value.code is not None else 0}"
        elif not isinstance(value, Exception) and not getattr(instance, "survive_errors", False):
            # Not an Exception (a CancelledError of the endpoint's own too):
            # it kills a proc's actor (zmesh._host.proc.actordeath), so the rank breaks.
            self.broken[rank] = f"{type(value).__name__}: {value}"
            self.check(rank)
        raise _actor_error(value, method, self.context(rank=rank)) from None

    def close(self) -> None:
        if not self.loop.is_closed():
            # Calls still running end as a stopped proc's do: cancelled, then gone.
            with contextlib.suppress(Exception):
                self.soon(_cancel_others()).result(5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.loop.close()


def _settle(
    out: concurrent.futures.Future[Any],
    context: dict[str, Any],
    done: concurrent.futures.Future[Any],
) -> None:
    """Pass a delivery's outcome on; one cancelled by ``stop()`` (maybe before it began)
    fails with ``ActorStoppedError``, as a call in flight to a stopped mesh does."""
    if done.cancelled():
        out.set_exception(ActorStoppedError("the mesh was stopped", **context))
    elif done.exception() is not None:
        out.set_exception(done.exception())
    else:
        out.set_result(done.result())


async def _cancel_others() -> None:
    me = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not me]
    for t in others:
        t.cancel()
    await asyncio.gather(*others, return_exceptions=True)


def pack(
    args: tuple[Any, ...], kwargs: dict[str, Any], name: str, mesh: str
) -> tuple[w.Payload, list[Any]]:
    """The arguments of a call, packed as a client packs them (or ``EncodeError``)."""
    try:
        return Codec.pack(args, kwargs)
    except Exception as exc:
        raise _unsendable(exc, name, mesh) from exc


def encode(spec: CallSpec) -> list[Any]:
    """The frames of a call, as a client sends them (``EncodeError`` if they cannot be)."""
    try:
        return _TO_PROC.encode(w.Call(0, spec.actor, spec.method, spec.payload), spec.buffers)
    except Exception as exc:
        raise _unsendable(exc, spec.method, spec.actor) from exc


def _unsendable(exc: Exception, name: str, mesh: str) -> EncodeError:
    return encode_error(
        f"arguments of {name!r} cannot be sent: {type(exc).__name__}: {exc}", exc, mesh=mesh
    )


def _answered(
    deliver: Deliver | None, i: int, method: str, done: concurrent.futures.Future[Any]
) -> None:
    """A fan-out's answer from target ``i``, to ``deliver`` (``None``: an error is logged)."""
    if done.cancelled():
        return
    exc = done.exception()
    if deliver is not None:
        deliver(i, exc is None, done.result() if exc is None else exc)
    elif exc is not None:
        log.error("oneway call %s raised", method, exc_info=exc)


def decode_call(frames: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of a call, as a proc decodes them: copies of the caller's."""
    msg = _TO_PROC.decode(frames)
    return _TO_PROC.unpack(msg.payload, frames)


def _copy(value: Any, method: str, context: dict[str, Any]) -> Any:
    """``value`` as the caller would get it over the wire (a decoded copy)."""
    try:
        payload, buffers = Codec.pack_value(value)
        frames = _TO_CLIENT.encode(w.Reply(0, payload), buffers)
        reply = _TO_CLIENT.decode(frames)
        return _TO_CLIENT.unpack_value(reply.payload, frames)
    except Exception as exc:
        raise EncodeError(f"return value of {method!r} cannot be sent: {exc}", **context) from exc


def _actor_error(exc: BaseException, method: str, context: dict[str, Any]) -> ActorError:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        cause: BaseException | None = pickle.loads(pickle.dumps(exc))
    except Exception:
        cause = None
    qual, mod = type(exc).__qualname__, type(exc).__module__
    name = qual if mod == "builtins" else f"{mod}.{qual}"
    return ActorError(name, str(exc), tb, endpoint=method, cause=cause, **context)
