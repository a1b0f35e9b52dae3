"""Starting a service: its supervisor in this process, or, detached, in an
orchestrator on an agent (``zmesh._service.orchestrator``)."""

from __future__ import annotations

import asyncio
import secrets
from typing import TYPE_CHECKING, Any

from zmesh._actor import ActorBase, endpoints_of
from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.future import Future
from zmesh._service import service as _service
from zmesh._service.client import ServiceClient
from zmesh._service.orchestrator import spawn_detached
from zmesh._service.routing import ServiceConfig, make_router
from zmesh._service.service import Service
from zmesh._service.supervisor import Supervisor
from zmesh._shared.aio import running_loop

if TYPE_CHECKING:
    from zmesh._options import Options


def spawn_service(opts: Options[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``Cls.options(replicas=...).spawn(...)``: a future of the running ``Service``.

    The service runs on this process's I/O loop (see ``runtime.home``), so it
    outlives the event loop of its caller.
    """
    if not (isinstance(opts.cls, type) and issubclass(opts.cls, ActorBase)):
        raise TypeError(f"{opts.cls!r} is not a zmesh.Actor subclass")
    if opts.detached:  # its supervisor runs on an external agent, not here
        return spawn_detached(opts, args, kwargs)
    config = ServiceConfig(**opts.service_config)
    rt = _runtime.home()

    async def go() -> Service:
        svc = Service(
            f"{opts.name}-{secrets.token_hex(6)}", opts.name, opts.cls.__qualname__,
            endpoints_of(opts.cls), opts.replicas, config, make_router(config.router),
        )  # fmt: skip
        client = ServiceClient(
            rt, svc.name, svc._n, config, svc.router, svc.cls_name, frozenset(svc.endpoints)
        )
        svc._clients[id(rt)] = _service._clients[(svc.id, id(rt))] = client
        sup = svc._supervisor = _service._supervisors[svc.id] = Supervisor(
            rt, client, opts, args, kwargs, svc.id
        )
        await sup.start()
        return svc

    if running_loop() is rt.loop:
        return Future(afut=rt.loop.create_task(go()))
    return Future(cfut=asyncio.run_coroutine_threadsafe(go(), rt.loop))
