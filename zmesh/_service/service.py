"""Services: R replicas of an actor mesh behind one handle, self-healing.

``Cls.options(replicas=3, procs=2).spawn()`` spawns three actor meshes and
routes each request to one healthy replica. Three parts, each in its module:

* the ``Supervisor`` (``supervisor``) spawns and replaces replicas, checks
  their health and reports the replica table; it runs on the runtime's I/O
  loop of the process that made the service, so the service lives as long
  as that process;
* the ``Dispatcher`` (``dispatch``) decides where each request goes and what
  a reply, a failure or a timeout does to it; it has no sockets;
* the ``ServiceClient`` (``client``) carries the dispatcher's decisions out
  over this process's runtime and follows the replicas' supervision streams.

There is a client per event loop that calls the service (a call from
``async`` code is routed on the caller's loop, with no thread hop); the
supervisor feeds the clients of its process each change of the table. A
``Service`` handle is a value: passed to an actor (or returned from one),
it carries the replica table, and calls made there are routed, retried and
failed over by a client in that process, which follows the orchestrator's
table through the agents.
"""

from __future__ import annotations

import asyncio
import itertools
import pickle
import secrets
import weakref
from typing import TYPE_CHECKING, Any

from zmesh._actor import EndpointInfo
from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.future import Future
from zmesh._client.calls.launch import run_on
from zmesh._client.calls.runtime import Runtime
from zmesh._client.control.lookup import on_home, stop_name
from zmesh._client.handles.mesh import ActorMesh
from zmesh._errors import EndpointError, ServiceError
from zmesh._service.client import Follower, ServiceClient, decode_table, encode_table
from zmesh._service.endpoint import ServiceEndpoint
from zmesh._service.routing import (
    HEALTHY,
    RoundRobinRouter,
    Router,
    ServiceConfig,
    ServiceStatistics,
    Session,
)
from zmesh._service.supervisor import Supervisor
from zmesh._shared.state import service_state

if TYPE_CHECKING:
    pass

# Clients of services in this process, by service id and runtime: handles of
# one service (the owner's, one unpickled here) share them.
_clients: weakref.WeakValueDictionary[tuple[str, int], ServiceClient] = (
    weakref.WeakValueDictionary()
)
# The supervisors of the services made in this process, by service id.
_supervisors: weakref.WeakValueDictionary[str, Supervisor] = weakref.WeakValueDictionary()


class Service:
    """R replicas of an actor mesh behind one handle. Made by ``.spawn()``.

    Every endpoint of the class is an endpoint of the service: call it
    directly (``await svc.embed(x)``: one healthy replica, with the
    service's retries and timeout), or with an adverb: ``call_one``/``route``,
    ``choose``, ``call``/``fanout``, ``stream`` and ``broadcast``.

    A handle is a value: pass it to an actor and call it from there.
    """

    def __init__(
        self,
        service_id: str,
        name: str,
        cls_name: str,
        endpoints: dict[str, EndpointInfo],
        replicas: int,
        config: ServiceConfig,
        router: Router,
    ) -> None:
        self.id = service_id
        self.name = name
        self.cls_name = cls_name
        self.endpoints = endpoints
        self.config = config
        self.router = router
        self._n = replicas
        self._clients: dict[int, ServiceClient] = {}  # by runtime (id), each on its loop
        self._supervisor: Supervisor | None = None  # in the process that made it
        self._table = b""  # for a handle from elsewhere: the table it arrived with
        self._agents: list[str] = []
        # Anonymous sessions are weak: one nobody holds is forgotten.
        self._sessions: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
        self._named: dict[str, Session] = {}
        self._ids = itertools.count(1)
        self._req_tag = f"{name}-{secrets.token_hex(4)}"
        # A detached service's name and orchestrator (``orchestrator.py``): any
        # handle that has them may stop it.
        self._detached: tuple[str, ActorMesh[Any]] | None = None

    # ------------------------------------------------------------ public face

    def __getattr__(self, name: str) -> ServiceEndpoint[Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self.endpoints:
            known = ", ".join(sorted(self.endpoints)) or "none"
            raise EndpointError(
                f"{self.cls_name} has no endpoint {name!r} (endpoints: {known})", mesh=self.name
            )
        ep: ServiceEndpoint[Any] = ServiceEndpoint(self, name)
        self.__dict__[name] = ep
        return ep

    def __len__(self) -> int:
        return self._n

    def replica(self, index: int) -> ActorMesh[Any] | None:
        """The actor mesh of replica ``index``'s current generation (``None`` while down)."""
        client = self._client_now()
        if client.dispatcher.slots[index].state == "UNHEALTHY":
            return None
        return client.meshes[index]

    def session(self, session_id: str | None = None, *, strict: bool = False) -> Session:
        """A session: calls made inside ``with``/``async with`` it stay on one replica.

        A session with an id you chose is kept (``svc.session("user-42")``
        later is the same session); an anonymous one lives as long as you
        hold it.

        Args:
            strict: when the session's replica generation is gone, raise
                ``SessionLostError`` on the next call instead of moving the
                session silently (``rebound`` tells you either way).
        """
        if session_id is None:
            s = Session(self, f"s{next(self._ids)}", strict)
            self._sessions[s.id] = s
            return s
        named = self._named.get(session_id) or self._sessions.get(session_id)
        if named is None:
            named = self._named[session_id] = Session(self, session_id, strict)
        return named

    def statistics(self) -> ServiceStatistics:
        """Per-replica state and counters, and the service's state (OK/DEGRADED/DOWN).

        From this process's view (no round trip).
        """
        client = self._client_now()
        d = client.dispatcher
        now = client.rt.loop.time()
        reps = [s.statistics(now) for s in d.slots]
        healthy = sum(r.state == HEALTHY for r in reps)
        state = service_state(healthy, len(reps), d.stopped)
        return ServiceStatistics(
            self.name, state, reps, d.completed, d.failed, d.retried, len(d.waiting)
        )

    def stop(self) -> Future[None]:
        """Stop every replica; calls after it raise ``ActorStoppedError``.

        A detached service (``detached=True``) may be stopped from any
        handle ``zmesh.lookup`` gave, or the creator's: its orchestrator and
        replicas end.

        Raises (from the future):
            ServiceError: this handle is not the one that made the service.
        """
        sup = self._supervisor or _supervisors.get(self.id)  # a handle come back home
        rt = _runtime.home()
        if sup is None and self._detached is not None:
            return _stop_detached(self)
        if sup is None:
            err = ServiceError(
                f"service {self.name} is stopped by the process that made it", mesh=self.name
            )

            def refuse() -> asyncio.Future[None]:
                fut: asyncio.Future[None] = rt.loop.create_future()
                fut.set_exception(err)
                return fut

            return run_on(rt, refuse)
        return run_on(rt, lambda: rt.loop.create_task(sup.stop()))

    def __repr__(self) -> str:
        return f"<Service {self.name} replicas={self._n}>"

    # ------------------------------------------------------------ calls

    def _client_now(self) -> ServiceClient:
        """The client of the caller's runtime (the I/O loop's, from plain code)."""
        rt, home = _runtime.current()
        if home:
            return self._client_for(rt)
        client = self._clients.get(id(rt))
        if client is not None and client.rt is rt:
            return client

        def make() -> asyncio.Future[ServiceClient]:
            done: asyncio.Future[ServiceClient] = rt.loop.create_future()
            done.set_result(self._client_for(rt))
            return done

        return run_on(rt, make).get(timeout=10.0)

    def _client_for(self, rt: Runtime) -> ServiceClient:
        """This service's client on ``rt``, made on first use; call it on ``rt``'s loop.

        A new client starts from the freshest table this process has: the
        supervisor's if the service was made here (which then feeds it every
        change), else the table the handle arrived with (and a ``Follower``
        reads the orchestrator's updates from the agents).
        """
        client = self._clients.get(id(rt))
        if client is not None and client.rt is rt and not rt.closed:
            return client
        shared = _clients.get((self.id, id(rt)))
        if shared is not None and shared.rt is rt and not rt.closed:
            self._clients[id(rt)] = shared
            return shared
        for key in [k for k, c in self._clients.items() if c.rt.closed]:
            del self._clients[key]  # its loop ended
        client = ServiceClient(
            rt, self.name, self._n, self.config, self.router, self.cls_name,
            frozenset(self.endpoints),
        )  # fmt: skip
        self._clients[id(rt)] = _clients[(self.id, id(rt))] = client
        sup = _supervisors.get(self.id)
        if sup is not None and not sup.stopped:
            client.apply_table(sup.client.table())
            sup.attach(client)
            return client
        known = [c for (sid, _), c in _clients.items() if sid == self.id and c is not client]
        rows = known[0].table() if known else decode_table(self._table) if self._table else []
        client.apply_table(rows)
        Follower(client, self.id, set(self._agents))
        return client

    def _submit(
        self,
        rt: Runtime,
        endpoint: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
        session: Session | None,
        pinned: int | None = None,
        least_loaded: bool = False,
    ) -> asyncio.Future[Any]:
        """Make a request and route it; runs on ``rt``'s loop."""
        client = self._client_for(rt)
        return client.submit(
            endpoint, args, kwargs, timeout, session, self.endpoints[endpoint].retry,
            pinned, least_loaded, f"{self._req_tag}-{next(self._ids)}",
        )  # fmt: skip

    def __reduce__(self) -> Any:
        # A handle travels as plain data: the replica table it knows, and the
        # agents that hear the orchestrator's updates.
        client = self._client_now()
        table = encode_table(client.table())
        agents = sorted({r.agent for m in client.meshes if m is not None for r in m._refs})
        try:
            router_blob = pickle.dumps(self.router)
        except Exception:  # a router that cannot travel: round robin over there
            router_blob = pickle.dumps(RoundRobinRouter())
        return (
            _rebuild_service,
            (self.id, self.name, self.cls_name, self.endpoints, self._n, self.config,
             router_blob, table, agents, self._detached),
        )  # fmt: skip


def _rebuild_service(
    service_id: str,
    name: str,
    cls_name: str,
    endpoints: dict[str, EndpointInfo],
    replicas: int,
    config: ServiceConfig,
    router_blob: bytes,
    table: bytes,
    agents: list[str],
    detached: tuple[str, ActorMesh[Any]] | None = None,
) -> Service:
    svc = Service(
        service_id, name, cls_name, endpoints, replicas, config, pickle.loads(router_blob)
    )
    svc._table = table
    svc._agents = agents
    svc._detached = detached  # a detached service's name: stop() by name, for its keys
    return svc


def _stop_detached(svc: Service) -> Future[None]:
    """``svc.stop()`` of a detached service, from any script or actor acting for its keys.

    Raises (from the future):
        NameNotFoundError: not ours (other keys), or stopped already.
    """
    name, orch = svc._detached  # type: ignore[misc]

    async def go(rt: Runtime) -> None:
        # Only by name: the agents check that we act for the keys that made it
        # (an endpoint of the orchestrator could not: any key that reaches a
        # proc may call it). They stop the orchestrator, whose cleanup stops
        # the replicas, and the replicas filed under the name.
        client = svc._client_now()
        replicas = {r.agent for m in client.meshes if m is not None for r in m._refs}
        await stop_name(rt, name, sorted({r.agent for r in orch._refs} | replicas))
        for client in list(svc._clients.values()):
            try:
                client.rt.loop.call_soon_threadsafe(client.stop)  # calls after this: stopped
            except RuntimeError:  # its loop ended (an asyncio.run() that used the handle)
                continue

    return on_home(go)
