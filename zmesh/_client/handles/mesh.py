"""Meshes: hosts, procs and actors laid out on named dimensions.

``HostMesh`` (agents) → ``spawn_procs`` → ``ProcMesh`` (one OS process per
point) → ``spawn`` → ``ActorMesh`` (one actor per proc, or ``actors_per_proc``
of them on one more dim, ``actors``). Ranks are row-major over the dims, hosts
first: ``{hosts: 2, procs: 4}`` puts rank 5 at ``hosts=1, procs=1``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import pickle
from collections.abc import AsyncIterator, Generator, Iterable
from typing import Any, Generic, TypeVar

from zmesh._actor import ActorBase
from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.future import Future
from zmesh._client.calls.launch import submit
from zmesh._client.calls.pending import Gate, NotReady
from zmesh._client.calls.runtime import ProcRef
from zmesh._client.calls.values import ValueMesh  # noqa: F401  (zmesh.ValueMesh)
from zmesh._client.control import grants as _grants
from zmesh._client.control.controller import SupervisionEvent
from zmesh._client.control.lookup import stop_detached_mesh
from zmesh._client.control.meshstate import (  # noqa: F401  (zmesh.MeshState)
    STATE_TIMEOUT,
    MeshListener,
    MeshState,
    _ask_agents,
    _event_of,
    _followed_ranks,
)
from zmesh._client.control.stopping import stop_when_ready
from zmesh._client.handles.adverbs import EndpointRef
from zmesh._errors import EndpointError
from zmesh._shared.aio import running_loop
from zmesh._shared.points import Extent, Point, Shape
from zmesh._wire import names as _names

A = TypeVar("A", bound=ActorBase)
T = TypeVar("T")
M = TypeVar("M", bound="_MeshBase")


_DONE: concurrent.futures.Future[None] = concurrent.futures.Future()
_DONE.set_result(None)


class _MeshBase:
    """What proc and actor meshes share: a shape over proc refs, readiness, state.

    A mesh is returned while it is still spawning. ``_ready`` settles when its
    procs (and actors) are up, or with the spawn's error; until then
    ``_refs`` is empty and calls wait in ``_gate`` (see ``zmesh._client.calls.pending``).
    """

    _shape: Shape
    _refs: list[ProcRef]  # by position in _shape.ranks; empty while spawning
    proc_mesh: str
    _gate: Gate | None = None  # set while calls must wait: the fast path tests this only
    _ready: concurrent.futures.Future[None] = _DONE
    _ready_loop: asyncio.AbstractEventLoop | None = None  # the loop the spawn runs on
    _spawning: Future[None] | None = None  # the spawn's work, while it runs
    _given_up = False  # stop() gave the spawn up
    _stopped = False  # stop() was called on this handle (a ProcMesh's)

    def stop(self) -> Future[None]:
        """Stop this mesh (see ``ProcMesh.stop``, ``ActorMesh.stop``)."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._shape.ranks)

    @property
    def initialized(self) -> Future[None]:
        """A future that resolves once every proc (and actor ``__init__``) is up.

        Raises (from the future):
            SpawnError: a proc failed to start or ``__init__`` raised (with
                the remote traceback); the mesh's calls fail with it too.
            AgentError: an agent could not be reached.
        """
        ready = self._ready
        loop = running_loop()
        if loop is not None and loop is self._ready_loop and not ready.done():
            # On the spawn's own loop: .get() must refuse to block it.
            return Future(
                afut=asyncio.wrap_future(ready, loop=loop), about=(self.proc_mesh, "spawn")
            )
        return Future(cfut=ready, about=(self.proc_mesh, "spawn"))

    def __await__(self: M) -> Generator[Any, None, M]:
        return self._until_ready().__await__()

    async def _until_ready(self: M) -> M:
        await self.initialized
        return self

    def _wait_ready(self: M, timeout: float | None = None) -> M:
        try:
            self.initialized.get(timeout)
        except RuntimeError:
            if self._ready.done():
                raise  # the spawn's own outcome
            # .get() refused on the loop that must do the spawn: nothing will
            # wait for this mesh, so it must not stay behind.
            self.stop()
            raise
        return self

    def _check_up(self) -> None:
        """Before pickling: raise ``NotReady`` while spawning (the call that
        sends the mesh waits for it: ``pending.py``), or the spawn's error."""
        ready = self._ready
        if not ready.done():
            raise NotReady(ready)
        if (exc := ready.exception()) is not None:
            raise exc

    @property
    def extent(self) -> Extent:
        """The mesh's shape: an ordered mapping of dim to size."""
        return Extent(self._shape.dims)

    def size(self, dim: str | Iterable[str] | None = None) -> int:
        """How many points: in all, along ``dim``, or along several dims."""
        dims = self._shape.dims
        if dim is None:
            return len(self._shape.ranks)
        if isinstance(dim, str):
            return dims[dim]
        return math.prod(dims[d] for d in dim)

    @property
    def sizes(self) -> dict[str, int]:
        """Size of each dim, e.g. ``{"hosts": 2, "procs": 4}``."""
        return dict(self._shape.dims)

    def state(self) -> MeshState:
        """The mesh's ranks as their agents last reported them.

        A runtime of this process that follows the mesh (the one that
        spawned it, in whatever event loop or thread this is called from)
        answers at once, with no round trip. Where none does (a handle
        passed to an actor, or to another process), the mesh's agents are
        asked, within ``STATE_TIMEOUT`` seconds: a rank whose agent does not
        answer is Unknown, and one its agent no longer knows is Failed.
        """
        rt, home = _runtime.current()
        ranks = _followed_ranks(self.proc_mesh, rt)
        missing = [ref for ref in self._refs if ref.rank not in ranks]
        if missing:
            ranks.update(_ask_agents(self.proc_mesh, missing))
            # From now on this runtime follows the mesh itself.
            for ref in missing:
                rt.dispatch(rt.controller.watch, ref, here=home)
        return MeshState(self.proc_mesh, {ref.rank: ranks[ref.rank] for ref in self._refs})

    async def supervision_events(self) -> AsyncIterator[SupervisionEvent]:
        """Yield each failure of this mesh's ranks once, as it is known.

        Failures that happened before iteration began are yielded first.
        """
        rt, home = _runtime.current()
        if not home:
            raise RuntimeError("supervision_events() needs a running event loop")
        await self.initialized
        mine = {ref.rank for ref in self._refs}
        queue: asyncio.Queue[SupervisionEvent] = asyncio.Queue()
        for ref in self._refs:
            rt.controller.watch(ref)
        ctl = rt.controller
        view = ctl.views.get(self.proc_mesh) or ctl.tombstones.get(self.proc_mesh)
        if view is not None:
            for rank, st in sorted(view.ranks.items()):
                if rank in mine and st.status.failure:
                    queue.put_nowait(_event_of(self._refs, rank, st))

        listen = MeshListener(self.proc_mesh, getattr(self, "actor", None), self._refs, queue)
        listeners = rt.controller.listeners.setdefault(self.proc_mesh, [])
        listeners.append(listen)
        try:
            while True:
                yield await queue.get()
        finally:
            listeners.remove(listen)


def check_mesh_name(base: str) -> str:
    """Refuse a mesh name (before its ``-<8 hex>`` suffix) that is not safe.

    Raises:
        ValueError: it is not 1-119 letters, digits, ``_``, ``.`` or ``-``.
    """
    return _names.check_name(base, "mesh name", reserve=9)


class ProcMesh(_MeshBase):
    """OS processes laid out on named dims; spawn actors on them with ``spawn``.

    Returned by ``HostMesh.spawn_procs`` at once, while the procs start:
    ``await procs`` (or ``procs.initialized``) waits for them.
    """

    def __init__(self, name: str, shape: Shape, refs: list[ProcRef]) -> None:
        self.proc_mesh = name
        self._shape = shape
        self._refs = refs

    @property
    def name(self) -> str:
        return self.proc_mesh

    def spawn(
        self, name: str, cls: type[A], *args: Any, actors_per_proc: int = 1, **kwargs: Any
    ) -> A:
        """Construct ``cls(*args, **kwargs)`` in every proc; the ``ActorMesh``, at once.

        The actors start in the background, after the procs. Calls made
        meanwhile wait and go out in order; ``await mesh`` waits for every
        ``__init__``. Meshes in the arguments that are still spawning are
        waited for first.

        With ``actors_per_proc=N`` (N > 1), each proc hosts N actors, each
        with its own mailbox: the mesh has one more dim, ``actors`` (the
        last), and a fan-out sends one message per proc.

        Raises:
            ValueError: at once, when ``name`` is not a valid name (1-128
                letters, digits, ``_``, ``.`` or ``-``, without ``..``), or
                ``actors_per_proc`` is below 1.
            TypeError: at once, when ``cls`` is not a ``zmesh.Actor`` subclass.

        Raises (from ``await mesh``, ``mesh.initialized`` and every call):
            SpawnError: ``__init__`` raised in some proc (with its traceback),
                or the procs did not start.
        """
        # Late: spawning builds this module's handles; the one verb that
        # needs it reaches it when called.
        from zmesh._client.control import spawning

        _names.check_name(name, "actor name")
        # Typed as the class: the handle has its endpoints (zmesh._typing).
        return spawning.start_actors(  # type: ignore[return-value]
            self, name, cls, args, kwargs, actors_per_proc
        )

    def get(self, timeout: float | None = None) -> ProcMesh:
        """Wait until the procs are up (``initialized.get``); this mesh.

        Raises:
            SpawnError: a proc did not start.
            CallTimeoutError: ``timeout`` passed first.
        """
        return self._wait_ready(timeout)

    def stop(self) -> Future[None]:
        """Stop every proc; later calls to their actors raise ``ActorStoppedError``,
        and so does a spawn on this handle (Monarch's "`ProcMesh` has already been
        stopped")."""
        if all(r.agent for r in self._refs):  # (a client's this_proc() is never stopped)
            self._stopped = True
        return submit(lambda rt: stop_when_ready(rt, self, procs=True))

    def __reduce__(self) -> Any:
        # A handle travels as plain data, once its procs are up (see ActorMesh);
        # to actors of its owner, with the right to spawn there (zmesh._client.control.grants).
        self._check_up()
        granted = _grants.grant(self.proc_mesh)
        return (_rebuild_proc_mesh, (self.proc_mesh, self._shape, list(self._refs), granted))

    def __repr__(self) -> str:
        dims = ", ".join(f"{k}: {v}" for k, v in self._shape.dims.items())
        return f"<ProcMesh {self.proc_mesh} {{{dims}}}>"


def _rebuild_proc_mesh(name: str, shape: Shape, refs: list[ProcRef], grant: str) -> ProcMesh:
    _grants.take(name, grant)
    return ProcMesh(name, shape, refs)


class ActorMesh(_MeshBase, Generic[A]):
    """A handle to actors, one per point. Endpoints are attributes with adverbs.

    A handle is a value: pass it to another actor and call it from there.

    Example::

        mesh = await Counter.options(procs=4).as_actor()
        values = await mesh.incr.call(1)
        first_two = mesh.slice(procs=slice(0, 2))
    """

    # The actor class's module, for Monarch's "module.Class" in failures
    # (zmesh._client.calls.callfailure); "" where the mesh was not spawned here.
    cls_module = ""

    def __init__(
        self,
        actor: str,
        cls_name: str,
        endpoints: frozenset[str],
        shape: Shape,
        refs: list[ProcRef],
        *,
        owns_procs: bool = False,
        full_dims: dict[str, int] | None = None,
        modes: dict[str, int] | None = None,
    ) -> None:
        self.actor = actor
        # Endpoints that do not just return: a generator's window (> 0), or 0
        # for an explicit response port (zmesh._client.ports.streams, ports).
        self.modes = modes or {}
        self.full_dims = dict(full_dims if full_dims is not None else shape.dims)
        self.cls_name = cls_name
        self.endpoints = endpoints
        self.proc_mesh = refs[0].mesh if refs else ""
        self._shape = shape
        self._refs = refs
        self._owns_procs = owns_procs
        self._detached = ""  # the name it is kept under past its creator (stop() by name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "get" and name not in self.endpoints:
            # ``Cls.options().as_actor().get(timeout)``: wait, then the mesh
            # (unless an endpoint is named ``get``, as Monarch allows: it wins).
            return self._wait_ready
        if name not in self.endpoints:
            known = ", ".join(sorted(self.endpoints)) or "none"
            raise EndpointError(
                f"{self.cls_name} has no endpoint {name!r} (endpoints: {known})",
                mesh=self.proc_mesh,
            )
        ref: EndpointRef[Any] = EndpointRef(self, name)
        self.__dict__[name] = ref  # next time a plain attribute, not __getattr__
        return ref

    def slice(self, **sel: int | slice) -> ActorMesh[A]:
        """A view of some points: ``mesh.slice(hosts=0, procs=slice(0, 2))``.

        An integer index drops its dim; a slice keeps it.
        """
        shape = self._shape.sliced(sel)
        by_rank = dict(zip(self._shape.ranks, self._refs, strict=False))
        part: ActorMesh[A] = ActorMesh(
            self.actor, self.cls_name, self.endpoints, shape,
            [by_rank[r] for r in shape.ranks] if by_rank else [], full_dims=self.full_dims,
            modes=self.modes,
        )  # fmt: skip
        part._ready, part._ready_loop = self._ready, self._ready_loop
        part.cls_module = self.cls_module
        gate = self._gate
        if gate is not None:  # calls through the slice keep their place among the mesh's
            gate.join(part)
        return part

    def flatten(self, name: str) -> ActorMesh[A]:
        """The same actors on one dim ``name``, in rank order."""
        _names.check_name(name, "dim")
        part = self.slice()
        part._shape = Shape({name: len(self._shape.ranks)}, self._shape.ranks)
        return part

    def points(self) -> list[Point]:
        """The point of each actor of this view in the full mesh, in rank order."""
        cached = self.__dict__.get("_points")
        if cached is not None and cached[0] is self._shape:
            return cached[1]  # every call() of a view needs them: made once (never mutated)
        points = [Point(r, self.full_dims) for r in self._shape.ranks]
        self.__dict__["_points"] = (self._shape, points)
        return points

    def stop(self) -> Future[None]:
        """Stop these actors (and their procs, if this mesh made them).

        A mesh still spawning is stopped once it is up; one whose spawn
        failed has nothing left to stop.
        """
        if self._detached:  # by name, as its keys' (zmesh._client.control.lookup): every proc of it
            return stop_detached_mesh(self)
        return submit(lambda rt: stop_when_ready(rt, self, procs=self._owns_procs))

    def __reduce__(self) -> Any:
        # A handle travels as plain data; the receiver makes its own sockets.
        self._check_up()
        return (
            _rebuild_actor_mesh,
            (self.actor, self.cls_name, sorted(self.endpoints), self._shape.dims,
             self._shape.ranks, [pickle.dumps(r) for r in self._refs], self.full_dims,
             self.modes, self._detached, self.cls_module),
        )  # fmt: skip

    def __repr__(self) -> str:
        dims = ", ".join(f"{k}: {v}" for k, v in self._shape.dims.items())
        return f"<ActorMesh {self.actor} {{{dims}}}>"


def _rebuild_actor_mesh(
    actor: str,
    cls_name: str,
    endpoints: list[str],
    dims: dict[str, int],
    ranks: list[int],
    refs: list[bytes],
    full: dict[str, int],
    modes: dict[str, int] | None = None,
    detached: str = "",
    cls_module: str = "",
) -> ActorMesh[Any]:
    mesh: ActorMesh[Any] = ActorMesh(
        actor, cls_name, frozenset(endpoints), Shape(dims, ranks),
        [pickle.loads(r) for r in refs], full_dims=full, modes=modes,
    )  # fmt: skip
    mesh._detached = detached
    mesh.cls_module = cls_module
    return mesh
