"""Meshes whose actors live in this process: the transport behind ``zmesh.testing.local_mesh``.

A ``LocalMesh`` is a mesh handle with ``ActorMesh``'s adverbs, futures,
values and errors; what it stands in for is everything between the handle
and the endpoint (runtime, sockets, agent, proc). Each mesh has one event
loop in a daemon thread of its own, the actors' "procs": async endpoints
run on it, sync ones in a thread pool, one message at a time per actor (in
send order, by an ``asyncio.Lock``, which is FIFO) unless ``concurrent``.
Arguments and results go through the wire codec (``Codec.pack``/``unpack``),
so an actor gets copies, as over the wire, and a value that cannot be sent
fails with ``EncodeError`` as it would for real. Exceptions are carried back
as the proc carries them: ``ActorError`` with the remote type, message,
traceback and an unpickled copy as ``cause``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import itertools
import logging
import pickle
import queue
import threading
import traceback
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any, Generic, TypeVar

from zmesh._actor import ActorBase, Endpoint, Point, set_current
from zmesh._client.calls.future import Future
from zmesh._client.handles.mesh import ValueMesh
from zmesh._errors import (
    ActorError,
    ActorStoppedError,
    CallTimeoutError,
    EncodeError,
    EndpointError,
    SpawnError,
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

A = TypeVar("A", bound=ActorBase)
R = TypeVar("R")
log = logging.getLogger("zmesh.testing")
_ids = itertools.count()
_meshes: weakref.WeakValueDictionary[int, _Ranks] = weakref.WeakValueDictionary()
_HOST = "local"
# Codecs hold no state between messages: one for each direction serves all.
_TO_PROC = Codec(w.PROC_INBOX)
_TO_CLIENT = Codec(w.CLIENT_INBOX)


class _Ranks:
    """The actors of one local mesh and the loop they run on (what procs would be)."""

    def __init__(self, name: str, dims: dict[str, int], endpoints: dict[str, Endpoint[Any, Any]]):
        self.id = next(_ids)
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
        _meshes[self.id] = self

    def context(self, **more: Any) -> dict[str, Any]:
        return {"mesh": self.name, "host": _HOST, **more}

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

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
            args, kwargs = _decode_call(frames)
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
        if kind is STOPPED or isinstance(value, ZmeshError | asyncio.CancelledError):
            raise value
        if kind is EXITED:  # a proc would exit: the rank breaks
            self.broken[rank] = f"exited with code {value.code if value.code is not None else 0}"
        raise _actor_error(value, method, self.context(rank=rank)) from None

    def close(self) -> None:
        if not self.loop.is_closed():
            # Calls still running end as a stopped proc's do: cancelled, then gone.
            with contextlib.suppress(Exception):
                self.submit(_cancel_others()).result(5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.loop.close()


class LocalMesh(Generic[A]):
    """A mesh handle whose actors are instances in this process; see ``local_mesh``."""

    def __init__(self, ranks: _Ranks, points: list[Point], dims: dict[str, int]) -> None:
        self._ranks = ranks
        self._points = points
        self._dims = dims

    def __getattr__(self, name: str) -> LocalEndpoint[Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._ranks.endpoints:
            known = ", ".join(sorted(self._ranks.endpoints)) or "none"
            cls = next(iter(self._ranks.instances.values())).__class__.__name__
            raise EndpointError(
                f"{cls} has no endpoint {name!r} (endpoints: {known})", mesh=self._ranks.name
            )
        return LocalEndpoint(self, name)

    @property
    def sizes(self) -> dict[str, int]:
        """Size of each dim, e.g. ``{"hosts": 1, "procs": 4}``."""
        return dict(self._dims)

    def __len__(self) -> int:
        return len(self._points)

    def points(self) -> list[Point]:
        """The points of this mesh (or slice), in rank order."""
        return list(self._points)

    def slice(self, **sel: int | slice) -> LocalMesh[A]:
        """A view of some points: ``mesh.slice(procs=slice(0, 2))``; an int drops its dim."""
        unknown = set(sel) - set(self._dims)
        if unknown:
            raise ValueError(f"no dims {sorted(unknown)} in {self._dims}")
        dims: dict[str, int] = {}
        keep = list(self._points)
        for i, (dim, size) in enumerate(self._dims.items()):
            pick = sel.get(dim, slice(None))
            idx = [pick] if isinstance(pick, int) else list(range(size))[pick]
            if any(not 0 <= k < size for k in idx):
                raise IndexError(f"{dim}={pick!r} is outside 0..{size - 1}")
            keep = [p for p in keep if _coord(self, p, i) in idx]
            if not isinstance(pick, int):
                dims[dim] = len(idx)
        return LocalMesh(self._ranks, keep, dims)

    def kill(self, rank: int, reason: str = "killed by SIGKILL") -> None:
        """Make ``rank`` fail as a crashed proc would: later calls raise ``SupervisionError``."""
        self._ranks.broken[rank] = reason

    def stop(self) -> Future[None]:
        """Stop every actor of the mesh (its loop and threads); later calls raise
        ``ActorStoppedError``. A future, done at once, as ``ActorMesh.stop()``."""
        self._ranks.stopped = True
        self._ranks.close()
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        done.set_result(None)
        return Future(cfut=done)

    def __enter__(self) -> LocalMesh[A]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __reduce__(self) -> tuple[Any, ...]:
        # Passed to another local actor (as an argument), it stays this mesh.
        return (_lookup, (self._ranks.id, [p.rank for p in self._points], self._dims))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}: {v}" for k, v in self._dims.items())
        return f"<LocalMesh {self._ranks.name} {{{inner}}}>"


class LocalEndpoint(Generic[R]):
    """``mesh.endpoint`` of a ``LocalMesh``: the adverbs, as ``EndpointRef`` has them."""

    def __init__(self, mesh: LocalMesh[Any], name: str, timeout: float | None = None) -> None:
        self._mesh = mesh
        self._name = name
        self._timeout = timeout

    def options(self, *, timeout: float | None = None, block: bool = True) -> LocalEndpoint[R]:
        """The same endpoint with a timeout (``block`` is accepted: no in-flight limit here)."""
        return LocalEndpoint(self._mesh, self._name, timeout)

    def _send(self, rank: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[R]:
        ranks = self._mesh._ranks
        frames = _encode_call(args, kwargs, self._name, ranks.name)  # here, as EndpointRef does
        if ranks.stopped:  # its loop is gone: the future fails, as a stopped mesh's calls do
            cfut: concurrent.futures.Future[R] = concurrent.futures.Future()
            cfut.set_exception(ActorStoppedError("the mesh was stopped", **ranks.context()))
        else:
            cfut = concurrent.futures.Future()
            ranks.submit(self._deliver(rank, frames)).add_done_callback(
                functools.partial(_settle, cfut, ranks.context(rank=rank))
            )
        return Future(cfut=cfut, about=(ranks.name, self._name))

    async def _deliver(self, rank: int, frames: list[Any]) -> Any:
        ranks = self._mesh._ranks
        if self._timeout is None:
            return await ranks.run(rank, self._name, frames)
        try:
            return await asyncio.wait_for(ranks.run(rank, self._name, frames), self._timeout)
        except asyncio.TimeoutError:
            raise CallTimeoutError(
                f"no reply within {self._timeout}s", **ranks.context(rank=rank)
            ) from None

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the one actor of this mesh (``ValueError`` if it has more or none)."""
        points = self._mesh._points
        if len(points) != 1:
            raise ValueError(
                f"call_one() needs exactly one actor, but {self._mesh!r} has {len(points)}; "
                "use call(), choose() or slice the mesh"
            )
        return self._send(points[0].rank, args, kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one actor of this mesh (in turn; there is no load to compare here)."""
        points = self._mesh._points
        if not points:
            raise ValueError(f"{self._mesh!r} is empty")
        return self._send(points[next(_ids) % len(points)].rank, args, kwargs)

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Call every actor; a future of their values (the first failure fails it)."""
        mesh = self._mesh
        futs = [self._send(p.rank, args, kwargs) for p in mesh._points]
        points, dims = list(mesh._points), mesh.sizes

        async def gather() -> ValueMesh[R]:
            values = [await asyncio.wrap_future(f._concurrent()) for f in futs]
            return ValueMesh(dims, points, values)

        cfut = mesh._ranks.submit(gather())
        return Future(cfut=cfut, about=(mesh._ranks.name, self._name))

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor and do not wait; an error is logged, as a proc logs it."""
        for p in self._mesh._points:
            cfut = self._send(p.rank, args, kwargs)._concurrent()
            cfut.add_done_callback(self._log_failure)

    def _log_failure(self, fut: concurrent.futures.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            log.error("oneway call %s raised", self._name, exc_info=fut.exception())

    def stream(self, *args: Any, **kwargs: Any) -> LocalStream[R]:
        """Call every actor; iterate (``for`` or ``async for``) the values as they arrive."""
        return LocalStream([self._send(p.rank, args, kwargs) for p in self._mesh._points])

    def __repr__(self) -> str:
        return f"<endpoint {self._name} of {self._mesh!r}>"


class LocalStream(Generic[R]):
    """Replies of a fan-out in arrival order; replayed by a later pass, as ``Stream`` is."""

    def __init__(self, futs: list[Future[R]]) -> None:
        self._n = len(futs)
        self._arrived: queue.SimpleQueue[concurrent.futures.Future[R]] = queue.SimpleQueue()
        self._seen: list[concurrent.futures.Future[R]] = []
        self._lock = threading.Lock()
        for f in futs:
            f._concurrent().add_done_callback(self._arrived.put)

    def _pull(self, i: int) -> concurrent.futures.Future[R]:
        with self._lock:
            while i >= len(self._seen):
                self._seen.append(self._arrived.get())
            return self._seen[i]

    def __iter__(self) -> Iterator[R]:
        for i in range(self._n):
            yield self._pull(i).result()

    async def __aiter__(self) -> AsyncIterator[R]:
        loop = asyncio.get_running_loop()
        for i in range(self._n):
            done = await loop.run_in_executor(None, self._pull, i)
            yield done.result()


def spawn(
    cls: type[A], args: tuple[Any, ...], kwargs: dict[str, Any], dims: dict[str, int]
) -> LocalMesh[A]:
    """Make the instances of a local mesh (``zmesh.testing.local_mesh``)."""
    if min(dims.values()) < 1:
        raise ValueError(f"sizes must be at least 1, got {dims}")
    name = f"{cls.__name__.lower()}-local{next(_ids)}"
    frames = _encode_call(args, kwargs, "__init__", name)
    endpoints = {
        n: v for k in reversed(cls.__mro__) for n, v in vars(k).items() if isinstance(v, Endpoint)
    }
    ranks = _Ranks(name, dims, endpoints)
    points = [Point(r, dict(dims)) for r in range(_size(dims))]

    async def make(point: Point) -> None:
        def build() -> Any:
            instance: Any = cls.__new__(cls)
            set_current(point, instance)
            a, kw = _decode_call(frames)  # each instance its own copy
            instance.__init__(*a, **kw)
            return instance

        ctx = contextvars.copy_context()
        ranks.instances[point.rank] = await ranks.loop.run_in_executor(ranks.pool, ctx.run, build)
        ranks.locks[point.rank] = asyncio.Lock()

    try:
        for p in points:
            ranks.submit(make(p)).result()
    except Exception as exc:
        ranks.close()
        raise SpawnError(
            f"actor __init__ raised {type(exc).__name__}: {exc}", **ranks.context()
        ) from exc
    return LocalMesh(ranks, points, dict(dims))


# ------------------------------------------------------------ helpers


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


def _size(dims: dict[str, int]) -> int:
    n = 1
    for v in dims.values():
        n *= v
    return n


def _coord(mesh: LocalMesh[Any], point: Point, i: int) -> int:
    """``point``'s coordinate along the ``i``-th dim of ``mesh`` (as sliced)."""
    name = list(mesh._dims)[i]
    return point.coords[name] if name in point.dims else 0


def _lookup(mesh_id: int, ranks: list[int], dims: dict[str, int]) -> LocalMesh[Any]:
    found = _meshes.get(mesh_id)
    if found is None:
        raise ActorStoppedError("the local mesh this handle names is gone")
    by_rank = {r: Point(r, dict(found.dims)) for r in ranks}
    return LocalMesh(found, [by_rank[r] for r in ranks], dims)


def _encode_call(args: tuple[Any, ...], kwargs: dict[str, Any], name: str, mesh: str) -> list[Any]:
    """The frames of a call, as a client sends them (``EncodeError`` if they cannot be)."""
    try:
        payload, buffers = Codec.pack(args, kwargs)
        return _TO_PROC.encode(w.Call(0, mesh, name, payload), buffers)
    except Exception as exc:
        raise encode_error(
            f"arguments of {name!r} cannot be sent: {type(exc).__name__}: {exc}", exc, mesh=mesh
        ) from exc


def _decode_call(frames: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
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
