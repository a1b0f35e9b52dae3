"""Meshes: hosts, procs and actors laid out on named dimensions.

``HostMesh`` (agents) → ``spawn_procs`` → ``ProcMesh`` (one OS process per
point) → ``spawn`` → ``ActorMesh`` (one actor per proc). Ranks are row-major
over the dims, hosts first: ``{hosts: 2, procs: 4}`` puts rank 5 at
``hosts=1, procs=1``.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import pickle
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar

from zmesh._actor import Actor, Options, Point, endpoints_of
from zmesh._client import local as _local
from zmesh._client import runtime as _runtime
from zmesh._client.adverbs import EndpointRef, submit
from zmesh._client.controller import SupervisionEvent
from zmesh._client.future import Future
from zmesh._client.runtime import ProcRef, Runtime
from zmesh._errors import AgentError, EndpointError, SecurityError, SpawnError, ZmeshError
from zmesh._shared.state import Rank, Status, mesh_status
from zmesh._wire import messages as w
from zmesh._wire import pickling
from zmesh._wire import security as _security
from zmesh._wire.codec import Codec

A = TypeVar("A", bound=Actor)
T = TypeVar("T")

# How long procs may take to start, and actors' __init__ to return.
SPAWN_TIMEOUT = float(os.environ.get("ZMESH_SPAWN_TIMEOUT", "120"))
INIT_TIMEOUT = float(os.environ.get("ZMESH_INIT_TIMEOUT", "120"))


class MeshState:
    """A snapshot of a mesh's ranks, from the client's cached view.

    Attributes:
        name: the proc mesh.
        status: the mesh's status: that of its worst rank.
        ranks: every rank's ``Rank`` (status, generation, reason, pid, log_path).
    """

    def __init__(self, name: str, ranks: dict[int, Rank]) -> None:
        self.name = name
        self.ranks = ranks
        self.status = mesh_status(r.status for r in ranks.values())

    def __repr__(self) -> str:
        return f"<MeshState {self.name} {self.status.value}>"


class _Shape:
    """Named dims over a list of flat ranks (a full mesh or a slice of one)."""

    def __init__(self, dims: dict[str, int], ranks: list[int]) -> None:
        self.dims = dict(dims)
        self.ranks = list(ranks)

    def sliced(self, sel: dict[str, int | slice]) -> _Shape:
        for name in sel:
            if name not in self.dims:
                raise ValueError(f"no dimension {name!r} (dims: {list(self.dims)})")
        names = list(self.dims)
        # Coordinates of each position of this view, row-major.
        keep_dims: dict[str, int] = {}
        picks: dict[str, list[int]] = {}
        for name in names:
            size = self.dims[name]
            s = sel.get(name, slice(None))
            if isinstance(s, int):
                if not -size <= s < size:
                    raise IndexError(f"{name}={s} is out of range for size {size}")
                picks[name] = [s % size]
            else:
                picks[name] = list(range(size))[s]
                keep_dims[name] = len(picks[name])
        out: list[int] = []
        strides = {n: math.prod(self.dims[m] for m in names[i + 1 :]) for i, n in enumerate(names)}

        def walk(i: int, offset: int) -> None:
            if i == len(names):
                out.append(self.ranks[offset])
                return
            n = names[i]
            for c in picks[n]:
                walk(i + 1, offset + c * strides[n])

        walk(0, 0)
        return _Shape(keep_dims, out)


class ValueMesh(Generic[T]):
    """The values of a ``call``, one per actor, in rank order."""

    def __init__(self, dims: dict[str, int], points: list[Point], values: list[T]) -> None:
        self.dims = dims
        self._points = points
        self._values = values

    def values(self) -> list[T]:
        """The values in rank order."""
        return list(self._values)

    def items(self) -> list[tuple[Point, T]]:
        """``(point, value)`` pairs in rank order."""
        return list(zip(self._points, self._values, strict=True))

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[T]:
        return iter(self._values)

    def __getitem__(self, index: int) -> T:
        return self._values[index]

    def __repr__(self) -> str:
        return f"ValueMesh({self.dims}, {self._values!r})"


class _MeshBase:
    """What proc and actor meshes share: a shape over proc refs, state, stop."""

    _shape: _Shape
    _refs: list[ProcRef]  # by position in _shape.ranks
    proc_mesh: str

    def __len__(self) -> int:
        return len(self._refs)

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
                if home:
                    rt.controller.watch(ref)
                else:
                    rt.loop.call_soon_threadsafe(rt.controller.watch, ref)
        return MeshState(self.proc_mesh, {ref.rank: ranks[ref.rank] for ref in self._refs})

    async def supervision_events(self) -> AsyncIterator[SupervisionEvent]:
        """Yield each failure of this mesh's ranks once, as it is known.

        Failures that happened before iteration began are yielded first.
        """
        rt, home = _runtime.current()
        if not home:
            raise RuntimeError("supervision_events() needs a running event loop")
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

        def listen(ev: SupervisionEvent) -> None:
            if ev.rank in mine:
                queue.put_nowait(ev)

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
    return w.check_name(base, "mesh name", reserve=9)


STATE_TIMEOUT = 2.0  # how long state() waits for agents that must be asked


def _followed_ranks(mesh: str, first: Runtime) -> dict[int, Rank]:
    """What the runtimes of this process know of ``mesh``'s ranks, ``first`` first.

    ``Controller.watch`` fills a view with Running and no pid until the
    agent speaks: that guess is no knowledge, so it is left out.
    """
    with _runtime._lock:  # a runtime whose loop does not run hears nothing: stale
        others = [
            rt for rt in _runtime._runtimes.values()
            if rt is not first and not rt.closed and rt.loop.is_running()
        ]  # fmt: skip
    known: dict[int, Rank] = {}
    for rt in (first, *others):
        ctl = rt.controller
        # A released mesh's tombstone still says how each rank ended.
        view = ctl.views.get(mesh) or ctl.tombstones.get(mesh)
        if view is None:
            continue
        for r, st in list(view.ranks.items()):
            if r not in known and (st.pid or st.status is not Status.RUNNING):
                known[r] = st
    return known


def _ask_agents(mesh: str, refs: list[ProcRef]) -> dict[int, Rank]:
    """``refs``' ranks as their agents report them now (``GetState``, one per agent).

    A blocking round trip on sockets of its own (the runtime's belong to its
    loop's thread), bounded by ``STATE_TIMEOUT`` in all.
    """
    import zmq

    from zmesh._wire.security import secure_client
    from zmesh._wire.zsock import configure

    by_agent: dict[str, list[ProcRef]] = {}
    for ref in refs:
        by_agent.setdefault(ref.agent, []).append(ref)
    codec = Codec(w.AGENT_REPLIES)
    ctx: zmq.Context[Any] = zmq.Context.instance()
    socks = {}
    for addr in by_agent:
        sock = secure_client(configure(ctx.socket(zmq.DEALER)))
        sock.connect(addr)
        sock.send_multipart(codec.encode(w.GetState(1, mesh)))
        socks[addr] = sock
    deadline = time.monotonic() + STATE_TIMEOUT
    out: dict[int, Rank] = {}
    try:
        for addr, sock in socks.items():
            reply = None
            while reply is None and sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                try:
                    msg = codec.decode(sock.recv_multipart())
                except Exception:  # garbled: wait for a good one, or the deadline
                    continue
                if isinstance(msg, w.StateReply):
                    reply = msg
            states = {}
            if reply is not None:
                for m in reply.meshes:
                    if m.name == mesh:
                        states = {rs.rank: rs for rs in m.ranks}
            for ref in by_agent[addr]:
                rs = states.get(ref.rank)
                if reply is None:
                    out[ref.rank] = Rank(
                        Status.UNKNOWN, ref.generation, f"agent {addr} did not answer",
                        addr=ref.addr, log_path=ref.log_path,
                    )  # fmt: skip
                elif rs is None:
                    out[ref.rank] = Rank(
                        Status.FAILED, ref.generation, f"agent {reply.agent} no longer knows it",
                        addr=ref.addr, log_path=ref.log_path,
                    )  # fmt: skip
                else:
                    out[ref.rank] = Rank(
                        Status(rs.status), rs.generation, rs.reason, rs.pid, rs.addr,
                        rs.log_path, rs.exit_code,
                    )  # fmt: skip
    finally:
        for sock in socks.values():
            sock.close(linger=0)
    return out


def _event_of(refs: list[ProcRef], rank: int, st: Rank) -> SupervisionEvent:
    host = next((r.host for r in refs if r.rank == rank), "")
    return SupervisionEvent(
        refs[0].mesh, rank, host, st.status, st.reason, st.generation, st.log_path, st.exit_code
    )


class ProcMesh(_MeshBase):
    """OS processes laid out on named dims; spawn actors on them with ``spawn``."""

    def __init__(self, name: str, shape: _Shape, refs: list[ProcRef]) -> None:
        self.proc_mesh = name
        self._shape = shape
        self._refs = refs

    @property
    def name(self) -> str:
        return self.proc_mesh

    def spawn(self, name: str, cls: type[A], *args: Any, **kwargs: Any) -> Future[ActorMesh[A]]:
        """Construct ``cls(*args, **kwargs)`` in every proc; a future of the ``ActorMesh``.

        Raises:
            ValueError: at once, when ``name`` is not a valid name (1-128
                letters, digits, ``_``, ``.`` or ``-``, without ``..``).

        Raises (from the future):
            SpawnError: ``__init__`` raised in some proc (with its traceback).
        """
        w.check_name(name, "actor name")
        return submit(lambda rt: _spawn_actors(rt, self, name, cls, args, kwargs))

    def stop(self) -> Future[None]:
        """Stop every proc; later calls to their actors raise ``ActorStoppedError``."""
        return submit(lambda rt: _stop_procs(rt, self._refs))

    def __repr__(self) -> str:
        dims = ", ".join(f"{k}: {v}" for k, v in self._shape.dims.items())
        return f"<ProcMesh {self.proc_mesh} {{{dims}}}>"


class ActorMesh(_MeshBase, Generic[A]):
    """A handle to actors, one per point. Endpoints are attributes with adverbs.

    A handle is a value: pass it to another actor and call it from there.

    Example::

        mesh = await Counter.options(procs=4).as_actor()
        values = await mesh.incr.call(1)
        first_two = mesh.slice(procs=slice(0, 2))
    """

    def __init__(
        self,
        actor: str,
        cls_name: str,
        endpoints: frozenset[str],
        shape: _Shape,
        refs: list[ProcRef],
        *,
        owns_procs: bool = False,
        full_dims: dict[str, int] | None = None,
    ) -> None:
        self.actor = actor
        self.full_dims = dict(full_dims if full_dims is not None else shape.dims)
        self.cls_name = cls_name
        self.endpoints = endpoints
        self.proc_mesh = refs[0].mesh if refs else ""
        self._shape = shape
        self._refs = refs
        self._owns_procs = owns_procs

    def __getattr__(self, name: str) -> EndpointRef[Any]:
        if name.startswith("_"):
            raise AttributeError(name)
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
        by_rank = {r.rank: r for r in self._refs}
        return ActorMesh(
            self.actor, self.cls_name, self.endpoints, shape,
            [by_rank[r] for r in shape.ranks], full_dims=self.full_dims,
        )  # fmt: skip

    def points(self) -> list[Point]:
        """The point of each actor of this view in the full mesh, in rank order."""
        return [Point(r.rank, self.full_dims) for r in self._refs]

    def stop(self) -> Future[None]:
        """Stop these actors (and their procs, if this mesh made them)."""
        if self._owns_procs:
            return submit(lambda rt: _stop_procs(rt, self._refs))
        return submit(lambda rt: _stop_actors(rt, self))

    def __reduce__(self) -> Any:
        # A handle travels as plain data; the receiver makes its own sockets.
        return (
            _rebuild_actor_mesh,
            (self.actor, self.cls_name, sorted(self.endpoints), self._shape.dims,
             self._shape.ranks, [pickle.dumps(r) for r in self._refs], self.full_dims),
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
) -> ActorMesh[Any]:
    return ActorMesh(
        actor, cls_name, frozenset(endpoints), _Shape(dims, ranks),
        [pickle.loads(r) for r in refs], full_dims=full,
    )  # fmt: skip


class HostMesh:
    """Hosts (one agent each). ``spawn_procs`` places one host slice per agent.

    Args:
        agents: agent control addresses; ``None`` uses the configured agents
            or, with none configured, the embedded local default.
        hosts: how many hosts this mesh spans.
    """

    def __init__(self, agents: list[str] | None = None, hosts: int = 1) -> None:
        self._agents = list(agents) if agents is not None else None
        self._hosts = len(agents) if agents is not None else hosts

    @property
    def sizes(self) -> dict[str, int]:
        return {"hosts": self._hosts}

    def __len__(self) -> int:
        return self._hosts

    def spawn_procs(
        self, per_host: dict[str, int] | None = None, *, name: str = "procs"
    ) -> Future[ProcMesh]:
        """Start procs: ``per_host={"procs": 4}`` starts 4 on every host.

        Returns at once with a future; the procs start in parallel.

        Raises:
            ValueError: at once, when ``name`` is not a valid name (1-119
                letters, digits, ``_``, ``.`` or ``-``, without ``..``; the
                mesh's name is ``name`` and a random suffix), or a dim is not.

        Raises (from the future):
            SpawnError: a proc died or did not become ready (with its log path).
            AgentError: an agent cannot be reached.
        """
        per_host = dict(per_host or {"procs": 1})
        check_mesh_name(name)
        for dim in per_host:
            w.check_name(dim, "dim")
        agents = self._agents
        hosts = self._hosts

        async def go(rt: Runtime) -> ProcMesh:
            addrs = agents
            if addrs is None:
                addrs = await rt.loop.run_in_executor(None, _local.agents, hosts)
            return await _spawn_procs(rt, addrs, per_host, name)

        return submit(go)

    def __repr__(self) -> str:
        return f"<HostMesh {{hosts: {self._hosts}}}>"


def this_host() -> HostMesh:
    """The local host: the first configured agent, or the embedded default."""
    return HostMesh(None, hosts=1)


def connect(addresses: list[str], *, keys: str | None = None) -> HostMesh:
    """Use these agents (``tcp://host:port`` each) from now on; a ``HostMesh`` of them.

    Args:
        addresses: the agents' control addresses, one per host.
        keys: a ``zmesh keygen`` directory, for agents started with ``--keys``
            (default: the ``ZMESH_KEYS`` variable, if set).

    Raises:
        SecurityError: ``keys`` cannot be read.
    """
    if not addresses:
        raise ValueError("connect() needs at least one agent address")
    if keys is not None:
        _security.use(keys)
    _local.configure(addresses)
    return HostMesh(list(addresses))


def spawn_actor_mesh(opts: Options[A], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``Cls.options(...).as_actor(...)``: procs then actors, as one future."""
    return submit(
        lambda rt: spawn_owned_mesh(rt, opts.cls, opts.hosts, opts.procs, opts.name, args, kwargs)
    )


async def spawn_owned_mesh(
    rt: Runtime,
    cls: type[A],
    hosts: int,
    procs: int,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    addrs: list[str] | None = None,
) -> ActorMesh[A]:
    """Start ``hosts x procs`` procs and one actor in each; the mesh owns its procs.

    Args:
        addrs: the agents to place the host slices on (default: the first
            ``hosts`` configured agents, or the embedded default).

    Raises:
        SpawnError: a proc or an actor failed to start; nothing is left running.
    """
    if addrs is None:
        addrs = await rt.loop.run_in_executor(None, _local.agents, hosts)
    pm = await _spawn_procs(rt, addrs, {"procs": procs}, name)
    try:
        mesh = await _spawn_actors(rt, pm, name, cls, args, kwargs)
    except BaseException:
        await _stop_procs(rt, pm._refs)
        raise
    mesh._owns_procs = True
    return mesh


# ------------------------------------------------------------ the work


async def _spawn_procs(
    rt: Runtime, addrs: list[str], per_host: dict[str, int], base: str
) -> ProcMesh:
    check_mesh_name(base)
    name = f"{base}-{secrets.token_hex(4)}"
    ctl = rt.controller
    ctl.creating.add(name)  # not released while it starts, even if a rank fails
    try:
        return await _start_procs(rt, addrs, per_host, name)
    except BaseException:
        ctl.release(name)  # stopped already (or never made): nothing of it stays
        raise
    finally:
        ctl.creating.discard(name)


async def _start_procs(
    rt: Runtime, addrs: list[str], per_host: dict[str, int], name: str
) -> ProcMesh:
    from zmesh._actor import _CURRENT_ACTOR

    dims = {"hosts": len(addrs), **per_host}
    per = math.prod(per_host.values())
    if per < 1:
        raise SpawnError(f"per_host sizes must be at least 1, got {per_host}")
    prep = w.MainSpec(sys_path=list(sys.path), dir=os.getcwd())
    env = {k: v for k, v in os.environ.items() if k.startswith("ZMESH_") and k != "ZMESH_PROC"}
    agents = _local.configured_agents()
    if agents is not None:  # zmesh.connect(): procs spawn on the same agents
        env["ZMESH_AGENTS"] = ",".join(agents)
    ctl = rt.controller
    owner_actor = _CURRENT_ACTOR.get(None)
    if owner_actor is not None:
        ctl.handlers[name] = lambda ev: _supervise(owner_actor, ev)
    conns = []
    for h, addr in enumerate(addrs):
        agent = ctl.agent(addr)
        await _agent_ready(rt, agent.ready, addr)
        _local.note_used(addr)
        ranks = list(range(h * per, (h + 1) * per))
        ctl.track(name, agent, ranks)
        conns.append((agent, ranks))
    spec_of = lambda h, ranks: w.ProcSpec(  # noqa: E731
        owner=_local.owner_id(), ranks=ranks, dims=dims, host_index=h, main=prep, env=env
    )
    try:
        await _create_and_wait(rt, name, conns, spec_of)
    except asyncio.CancelledError:
        # The caller gave up on the spawn: the procs it asked for must not stay.
        await asyncio.shield(_stop_mesh_on(rt, name, conns))
        raise
    view = ctl.views[name]
    refs = []
    for agent, ranks in conns:
        for r in ranks:
            st = view.ranks[r]
            refs.append(
                ProcRef(name, r, st.generation, st.addr, agent.addr, agent.label, st.log_path)
            )
    ctl.owned.add(name)  # from now on, its unhandled failures are ours
    return ProcMesh(name, _Shape(dims, list(range(len(refs)))), refs)


async def _agent_ready(rt: Runtime, ready: asyncio.Event, addr: str) -> None:
    """Wait until we hear the agent at ``addr``; fail fast if it refuses our key.

    Raises:
        SecurityError: the CURVE handshake failed (the reason says which key).
        AgentError: no answer within 10 s.
    """
    if ready.is_set():
        return
    heard = asyncio.ensure_future(ready.wait())
    waits: set[asyncio.Future[Any]] = {heard}
    probe = None
    if _security.active() is not None and addr.startswith("tcp://"):
        # A refused key is silence to the socket, but a monitor hears it.
        probe = rt.loop.run_in_executor(None, _security.probe, addr, 10.0)
        waits.add(probe)
    deadline = rt.loop.time() + 10.0
    try:
        while not heard.done():
            done, _ = await asyncio.wait(
                waits, timeout=max(0.0, deadline - rt.loop.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )  # fmt: skip
            if not done:
                hint = " and whether your keys match its --keys" if probe is not None else ""
                raise AgentError(
                    f"agent at {addr} did not answer within 10s: check that it runs{hint}",
                    host=addr,
                )
            if probe is not None and probe in done:
                waits.discard(probe)
                if why := probe.result():
                    raise SecurityError(why, host=addr)
    finally:
        heard.cancel()


async def _create_and_wait(
    rt: Runtime, name: str, conns: list[Any], spec_of: Callable[[int, list[int]], w.ProcSpec]
) -> None:
    """Ask each agent for its host slice, then wait until every rank is Running.

    Raises:
        SpawnError: a rank failed or did not start in time (the mesh is stopped).
    """
    ctl = rt.controller
    await asyncio.gather(
        *(
            a.request(
                functools.partial(
                    w.CreateOrUpdate, name=name, spec=spec_of(h, r), secret=_local.owner_secret()
                )
            )
            for h, (a, r) in enumerate(conns)
        )
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SPAWN_TIMEOUT
    while True:
        view = ctl.views[name]
        now_ranks = sorted(view.ranks.items())
        bad = [(r, s) for r, s in now_ranks if s.status.failure or s.status.terminal]
        if bad:
            await _stop_mesh_on(rt, name, conns)
            rank, st = bad[0]
            raise SpawnError(
                f"proc failed to start: {st.status.value} ({st.reason}){_tail(st.log_path)}",
                mesh=name, rank=rank, host=ctl.hosts[(name, rank)].label,
                log_path=st.log_path or None,
            )  # fmt: skip
        if all(s.status == Status.RUNNING and s.addr for s in view.ranks.values()):
            break
        left = deadline - loop.time()
        if left <= 0:
            await _stop_mesh_on(rt, name, conns)
            raise SpawnError(f"procs not ready after {SPAWN_TIMEOUT:.0f}s", mesh=name)
        await ctl.wait_changed(name, min(left, 1.0))


def _supervise(actor: Any, ev: SupervisionEvent) -> bool:
    hook = getattr(actor, "__supervise__", None)
    return bool(hook(ev)) if hook is not None else False


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()[-8192:]
    except OSError:
        return ""
    tail = "\n".join(text.rstrip().splitlines()[-lines:])
    return f"\n--- last lines of {path} ---\n{tail}" if tail else ""


async def _spawn_actors(
    rt: Runtime,
    procs: ProcMesh,
    name: str,
    cls: type[A],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> ActorMesh[A]:
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(f"{cls!r} is not a zmesh.Actor subclass")
    try:
        blob, _ = pickling.dumps(cls, lambda _: True)  # by value if it is in __main__
        payload, buffers = Codec.pack(args, kwargs)
    except Exception as exc:
        raise SpawnError(f"cannot send {cls.__qualname__} or its arguments: {exc}") from exc
    fut: asyncio.Future[None] = rt.loop.create_future()
    errors: list[BaseException] = []
    remaining = len(procs._refs)

    def deliver(i: int, ok: bool, value: Any) -> None:
        nonlocal remaining
        remaining -= 1
        if not ok:
            errors.append(value)
        if remaining == 0 and not fut.done():
            fut.set_result(None)

    dims = procs.sizes
    for ref in procs._refs:
        rt.send(
            [ref],
            functools.partial(
                w.SpawnActor,
                actor=name,
                cls=blob,
                payload=payload,
                mesh=procs.name,
                dims=dims,
                rank=ref.rank,
            ),
            buffers,
            deliver,
            INIT_TIMEOUT,  # an __init__ that never returns must not hang the spawn
        )
    await fut
    if errors:
        err = errors[0]
        if isinstance(err, SpawnError):
            tb = getattr(err, "remote_traceback", "")
            raise SpawnError(
                f"{err.message}\n--- remote traceback ---\n{tb}".rstrip(),
                mesh=err.mesh, rank=err.rank, host=err.host, log_path=err.log_path,
            ) from err  # fmt: skip
        if isinstance(err, ZmeshError):
            raise SpawnError(
                f"actor {name} could not start: {err.message}", mesh=err.mesh, rank=err.rank,
                host=err.host, log_path=err.log_path,
            ) from err  # fmt: skip
        raise err
    eps = frozenset(endpoints_of(cls))
    return ActorMesh(name, cls.__qualname__, eps, _Shape(dims, procs._shape.ranks), procs._refs)


def stop_request(name: str) -> Callable[[int], w.Stop]:
    """A ``Stop`` of mesh ``name``, with the proof that we own it."""
    return functools.partial(w.Stop, name=name, secret=_local.owner_secret())


async def _stop_procs(rt: Runtime, refs: list[ProcRef]) -> None:
    by_agent: dict[str, list[ProcRef]] = {}
    for r in refs:
        by_agent.setdefault(r.agent, []).append(r)
    ctl = rt.controller
    for addr, rs in by_agent.items():
        agent = ctl.agent(addr)
        for r in rs:
            ctl.watch(r)
            # Calls made after stop() fail with ActorStoppedError at once,
            # without waiting for the agent's events.
            ctl.judge(agent, r.mesh, r.rank, Status.STOPPING, "")
        names = {r.mesh for r in rs}
        for n in names:
            try:
                await agent.request(stop_request(n), timeout=5.0)
            except AgentError:
                # The agent is gone (so are its procs) or cut off: it will
                # not say more, so nothing of the mesh needs to stay.
                ctl.release(n)
    # Once every rank is Stopped (the agents' events say so), the controller
    # releases the mesh: its sockets and state go, a tombstone stays.
    for n in {r.mesh for r in refs}:
        ctl.release_if_over(n)


async def _stop_mesh_on(rt: Runtime, name: str, conns: list[Any]) -> None:
    for agent, _ in conns:
        try:
            await agent.request(stop_request(name), timeout=5.0)
        except AgentError:
            pass


async def _stop_actors(rt: Runtime, mesh: ActorMesh[Any]) -> None:
    fut: asyncio.Future[None] = rt.loop.create_future()
    remaining = len(mesh._refs)

    def deliver(i: int, ok: bool, value: Any) -> None:
        nonlocal remaining
        remaining -= 1
        if remaining == 0 and not fut.done():
            fut.set_result(None)

    rt.send(mesh._refs, lambda i: w.StopActor(i, mesh.actor), [], deliver, timeout=5.0)
    await fut
