"""Meshes whose actors live in this process: the handles of ``zmesh.testing.local_mesh``.

A ``LocalMesh`` is a mesh handle with ``ActorMesh``'s adverbs, futures,
values and errors; what it stands in for is everything between the handle
and the endpoint (runtime, sockets, agent, proc). That is one transport,
``LocalRanks`` (``zmesh._client.handles.localranks``): each mesh has one
event loop in a daemon thread of its own, the actors' "procs": async
endpoints run on it, sync ones in a thread pool, one message at a time per
actor (in send order, by an ``asyncio.Lock``, which is FIFO) unless
``concurrent``. Arguments and results go through the wire codec
(``Codec.pack``/``unpack``), so an actor gets copies, as over the wire, and
a value that cannot be sent fails with ``EncodeError`` as it would for
real. Exceptions are carried back as the proc carries them: ``ActorError``
with the remote type, message, traceback and an unpickled copy as ``cause``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import itertools
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, Generic, TypeVar

from zmesh._actor import ActorBase, Endpoint, Point, set_current
from zmesh._client.calls.future import Future
from zmesh._client.calls.inflight import CallSpec
from zmesh._client.handles.localranks import LocalRanks, decode_call, encode, meshes, pack
from zmesh._client.handles.mesh import ValueMesh
from zmesh._errors import (
    ActorStoppedError,
    EndpointError,
    SpawnError,
)

A = TypeVar("A", bound=ActorBase)
R = TypeVar("R")
_ids = itertools.count()


class LocalMesh(Generic[A]):
    """A mesh handle whose actors are instances in this process; see ``local_mesh``."""

    def __init__(self, ranks: LocalRanks, points: list[Point], dims: dict[str, int]) -> None:
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

    def _spec(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallSpec:
        """This call, built once (``EncodeError`` here, as ``EndpointRef`` raises it)."""
        ranks = self._mesh._ranks
        payload, buffers = pack(args, kwargs, self._name, ranks.name)
        return CallSpec(ranks.name, self._name, payload, buffers, timeout=self._timeout)

    def _send(self, rank: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[R]:
        return self._mesh._ranks.submit(rank, self._spec(args, kwargs))

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
        spec = self._spec(args, kwargs)
        futs = [mesh._ranks.submit(p.rank, spec) for p in mesh._points]
        points, dims = list(mesh._points), mesh.sizes

        async def gather() -> ValueMesh[R]:
            values = [await asyncio.wrap_future(f._concurrent()) for f in futs]
            return ValueMesh(dims, points, values)

        cfut = mesh._ranks.soon(gather())
        return Future(cfut=cfut, about=(mesh._ranks.name, self._name))

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor and do not wait; an error is logged, as a proc logs it."""
        mesh = self._mesh
        mesh._ranks.fan_out([p.rank for p in mesh._points], self._spec(args, kwargs), None)

    def stream(self, *args: Any, **kwargs: Any) -> LocalStream[R]:
        """Call every actor; iterate (``for`` or ``async for``) the values as they arrive."""
        mesh = self._mesh
        spec = self._spec(args, kwargs)
        return LocalStream([mesh._ranks.submit(p.rank, spec) for p in mesh._points])

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
    payload, buffers = pack(args, kwargs, "__init__", name)
    frames = encode(CallSpec(name, "__init__", payload, buffers))
    endpoints = {
        n: v for k in reversed(cls.__mro__) for n, v in vars(k).items() if isinstance(v, Endpoint)
    }
    ranks = LocalRanks(next(_ids), name, dims, endpoints)
    points = [Point(r, dict(dims)) for r in range(_size(dims))]

    async def make(point: Point) -> None:
        def build() -> Any:
            instance: Any = cls.__new__(cls)
            set_current(point, instance)
            a, kw = decode_call(frames)  # each instance its own copy
            instance.__init__(*a, **kw)
            return instance

        ctx = contextvars.copy_context()
        ranks.instances[point.rank] = await ranks.loop.run_in_executor(ranks.pool, ctx.run, build)
        ranks.locks[point.rank] = asyncio.Lock()

    try:
        for p in points:
            ranks.soon(make(p)).result()
    except Exception as exc:
        ranks.close()
        raise SpawnError(
            f"actor __init__ raised {type(exc).__name__}: {exc}", **ranks.context()
        ) from exc
    return LocalMesh(ranks, points, dict(dims))


# ------------------------------------------------------------ helpers


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
    found = meshes.get(mesh_id)
    if found is None:
        raise ActorStoppedError("the local mesh this handle names is gone")
    by_rank = {r: Point(r, dict(found.dims)) for r in ranks}
    return LocalMesh(found, [by_rank[r] for r in ranks], dims)
