"""``svc.endpoint``: the adverbs of a service's endpoint, callable from any thread.

The service lives on the loop that made it; a call from elsewhere (plain
code, another loop) is handed to that loop and its result handed back.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from zmesh._client.adverbs import run_on
from zmesh._client.future import Future
from zmesh._errors import ActorStoppedError, EncodeError, SupervisionError
from zmesh._service.routing import HEALTHY, Session, current_session
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

if TYPE_CHECKING:
    from zmesh._service.service import Service

R = TypeVar("R")


class ServiceEndpoint(Generic[R]):
    """``svc.endpoint``: the adverbs of one endpoint of a service."""

    __slots__ = ("_name", "_session", "_svc", "_timeout")

    def __init__(
        self,
        svc: Service,
        name: str,
        timeout: float | None = None,
        session: Session | None = None,
    ) -> None:
        self._svc = svc
        self._name = name
        self._timeout = timeout
        self._session = session

    def options(
        self, *, timeout: float | None = None, session: str | Session | None = None
    ) -> ServiceEndpoint[R]:
        """The same endpoint with a per-call timeout and/or an explicit session."""
        s = self._svc.session(session) if isinstance(session, str) else session
        return ServiceEndpoint(self._svc, self._name, timeout, s or self._session)

    def _session_now(self) -> Session | None:
        s = self._session or current_session()
        return s if s is not None and s.service is self._svc else None

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one healthy replica (chosen by the router); its ``return_rank`` value.

        Raises (from the future):
            ActorError: the endpoint raised (the replica stays in service).
            ServiceOverloadedError: every healthy replica is full.
            ServiceError: no replica became healthy before the timeout.
            SupervisionError: a ``retry=False`` request was in flight on a
                replica that died.
            CallTimeoutError: the timeout passed while the request ran.
        """
        svc, session = self._svc, self._session_now()
        return run_on(svc.rt, lambda: svc._submit(self._name, args, kwargs, self._timeout, session))

    route = call_one

    def call(self, *args: Any, **kwargs: Any) -> Future[list[R]]:
        """Call every healthy replica; their values, by replica index.

        A replica that fails during the call is left out of the list.
        """
        svc = self._svc

        def start() -> asyncio.Future[list[R]]:
            targets = [r for r in svc._replicas if r.state == HEALTHY]
            futs = [
                svc._submit(self._name, args, kwargs, self._timeout, None, pinned=r)
                for r in targets
            ]
            return asyncio.ensure_future(_gather_survivors(futs))

        return run_on(svc.rt, start)

    fanout = call

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every healthy replica (all its ranks); no reply, no retry."""
        svc = self._svc
        try:
            payload, buffers = Codec.pack(args, kwargs)
        except Exception as exc:
            raise EncodeError(f"arguments of {self._name!r} cannot be sent: {exc}") from exc
        name = self._name

        def send() -> None:
            for rep in svc._replicas:
                if rep.state == HEALTHY and rep.mesh is not None:
                    call = functools.partial(
                        w.Call, actor=rep.mesh.actor, method=name, payload=payload, oneway=True
                    )
                    svc.rt.send(rep.mesh._refs, call, buffers, None)

        svc.rt.dispatch(send)

    def __repr__(self) -> str:
        return f"<service endpoint {self._name} of {self._svc!r}>"


async def _gather_survivors(futs: list[asyncio.Future[Any]]) -> list[Any]:
    results = await asyncio.gather(*futs, return_exceptions=True)
    out = []
    for r in results:
        if isinstance(r, SupervisionError | ActorStoppedError):
            continue  # that replica failed during the call
        if isinstance(r, BaseException):
            raise r
        out.append(r)
    return out
