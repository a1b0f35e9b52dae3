"""``svc.endpoint``: the adverbs of a service's endpoint, callable from any thread.

A service's calls are routed on the runtime's I/O loop of the calling
process; a call from elsewhere (plain code, another loop) is handed to that
loop and its result handed back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.future import Future
from zmesh._client.calls.launch import run_on
from zmesh._client.calls.runtime import Runtime
from zmesh._errors import (
    ActorStoppedError,
    EncodeError,
    ServiceError,
    SupervisionError,
    ZmeshError,
)
from zmesh._service.routing import Session, current_session
from zmesh._service.streaming import open_service_stream
from zmesh._shared.aio import running_loop
from zmesh._wire.codec import Codec

if TYPE_CHECKING:
    from zmesh._service.service import Service

R = TypeVar("R")
log = logging.getLogger("zmesh.service")


def _copy_to(dst: concurrent.futures.Future[Any], src: asyncio.Future[Any]) -> None:
    _copy_result(src, dst)


def _copy_result(src: asyncio.Future[Any], dst: concurrent.futures.Future[Any]) -> None:
    if dst.done():
        return
    if src.cancelled():
        dst.cancel()
    elif src.exception() is not None:
        dst.set_exception(src.exception())
    else:
        dst.set_result(src.result())


class ServiceEndpoint(Generic[R]):
    """``svc.endpoint``: one endpoint of a service, and its adverbs.

    Calling it directly (``await svc.embed(x)``, ``svc.embed(x).get()``) is
    ``call_one``.
    """

    __slots__ = ("_name", "_session", "_svc", "_timeout", "_window")

    def __init__(
        self,
        svc: Service,
        name: str,
        timeout: float | None = None,
        session: Session | None = None,
        window: int | None = None,
    ) -> None:
        self._svc = svc
        self._name = name
        self._timeout = timeout
        self._session = session
        self._window = window

    def options(
        self,
        *,
        timeout: float | None = None,
        session: str | Session | None = None,
        window: int | None = None,
    ) -> ServiceEndpoint[R]:
        """The same endpoint with a per-call timeout and/or an explicit session.

        For a generator endpoint, ``timeout`` bounds the wait for the first
        item and then for each next one, and ``window`` is how many items its
        producer may run ahead of the reader (default: the endpoint's own).
        """
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be a positive int, not {window!r}")
        s = self._svc.session(session) if isinstance(session, str) else session
        return ServiceEndpoint(self._svc, self._name, timeout, s or self._session, window)

    def _streams(self) -> bool:
        return self._svc.endpoints[self._name].stream

    def _items(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], session: Session | None, least: bool
    ) -> Any:
        """A generator endpoint's stream from one replica (zmesh._service.streaming)."""

        return open_service_stream(
            self._svc, self._name, args, kwargs, timeout=self._timeout, session=session,
            least_loaded=least, window=self._window,
        )  # fmt: skip

    def _no_stream(self, adverb: str) -> None:
        if self._streams():
            raise TypeError(
                f"{self._name!r} is a generator endpoint: {adverb}() is not for streams; "
                f"use svc.{self._name}.call_one(...) or .choose(...), which stream from one "
                "replica"
            )

    def _session_now(self) -> Session | None:
        s = self._session or current_session()
        return s if s is not None and s.service.id == self._svc.id else None

    def __call__(self, *args: Any, **kwargs: Any) -> Future[R]:
        """``call_one``: one healthy replica, with the service's retries and timeout."""
        return self.call_one(*args, **kwargs)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one healthy replica (chosen by the router); its ``return_rank`` value.

        Raises (from the future):
            ActorError: the endpoint raised (the replica stays in service).
            ServiceOverloadedError: every healthy replica is full.
            ServiceError: no replica became healthy before the timeout.
            SessionLostError: the call is in a strict session whose replica
                generation is gone.
            SupervisionError: a ``retry=False`` request was in flight on a
                replica that died.
            CallTimeoutError: the timeout passed while the request ran.

        On a generator endpoint: an ``ItemStream`` of one replica's items
        (``async for`` or ``for``). A replica that dies before the first item
        is replaced by another, unseen; after it, the stream ends with
        ``StreamInterruptedError`` (no item repeats).
        """
        svc, session = self._svc, self._session_now()
        if self._streams():
            return self._items(args, kwargs, session, False)
        rt, _ = _runtime.current()
        return run_on(rt, lambda: svc._submit(rt, self._name, args, kwargs, self._timeout, session))

    route = call_one

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the least loaded healthy replica (whatever the router), with retries.

        Sessions do not apply: ``choose`` is for spreading load. On a
        generator endpoint: the least loaded replica's stream (open streams
        count as load), as ``call_one``.
        """
        if self._streams():
            return self._items(args, kwargs, None, True)
        svc = self._svc
        rt, _ = _runtime.current()
        return run_on(
            rt,
            lambda: svc._submit(
                rt, self._name, args, kwargs, self._timeout, None, least_loaded=True
            ),
        )

    async def _fan_out(
        self, rt: Runtime, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None
    ) -> list[asyncio.Future[Any]]:
        """One request to each healthy replica, once there is one (never to none)."""
        svc = self._svc
        client = svc._client_for(rt)
        left = await client.serving(self._name, timeout)  # or ServiceError
        return [
            svc._submit(rt, self._name, args, kwargs, left, None, pinned=s.index)
            for s in client.dispatcher.healthy()
        ]

    async def _gather(self, rt: Runtime, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        loop = rt.loop
        limit = self._timeout if self._timeout is not None else self._svc.config.request_timeout
        end = loop.time() + limit
        while True:
            futs = await self._fan_out(rt, args, kwargs, end - loop.time())
            values, lost = await _survivors(futs)
            if values or lost is None:
                return values
            # Every replica it went to died under it (killed before the
            # service knew): the fan-out starts again on those that serve
            # now, within the same timeout.
            if loop.time() >= end:
                raise _all_lost(self._svc.name, self._name, len(futs)) from lost

    async def _stream_start(
        self, rt: Runtime, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[concurrent.futures.Future[Any]]:
        return _settled(await self._fan_out(rt, args, kwargs, self._timeout))

    def call(self, *args: Any, **kwargs: Any) -> Future[list[R]]:
        """Call every healthy replica; their values, by replica index.

        With no healthy replica it waits for one (up to its timeout). A
        replica that fails during the call is left out of the list.

        Raises:
            ServiceError: no replica became healthy in time, or every replica
                called failed during the call.
        """
        self._no_stream("call")
        rt, _ = _runtime.current()
        return run_on(rt, lambda: asyncio.ensure_future(self._gather(rt, args, kwargs)))

    fanout = call

    def stream(self, *args: Any, **kwargs: Any) -> ServiceStream[R]:
        """Call every healthy replica; iterate over their values as they arrive.

        ``async for v in svc.ep.stream(...)``, or plain ``for`` in sync code.
        A replica that fails during the call is left out, as with ``call``.

        Raises (while iterating):
            ServiceError: no replica became healthy in time, or every replica
                called failed during the call.
            ActorStoppedError: the service was stopped (before or during it).
        """
        self._no_stream("stream")
        rt, _ = _runtime.current()
        started = run_on(rt, lambda: asyncio.ensure_future(self._stream_start(rt, args, kwargs)))
        svc = self._svc
        return ServiceStream(rt, started, svc.name, self._name, lambda: svc._clients.get(id(rt)))

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every healthy replica (all its ranks); no reply, no retry.

        With no healthy replica it waits for one (up to ``request_timeout``)
        in the background; if none comes, the broadcast is dropped with a
        WARNING on the ``zmesh.service`` logger, counted in
        ``statistics().failed``.

        Raises:
            ServiceError: the service is DOWN (no replica can serve again).
            ActorStoppedError: the service was stopped.
        """
        self._no_stream("broadcast")
        svc, name = self._svc, self._name
        try:
            payload, buffers = Codec.pack(args, kwargs)
        except Exception as exc:
            raise EncodeError(f"arguments of {name!r} cannot be sent: {exc}") from exc
        rt, home = _runtime.current()
        known = svc._clients.get(id(rt))  # (read only: the state it knows now)
        if known is not None and not known.dispatcher.healthy():
            d = known.dispatcher
            if d.stopped:
                raise ActorStoppedError(f"service {svc.name} was stopped", mesh=svc.name)
            if not d.recovering():
                raise ServiceError(
                    f"service {svc.name} is DOWN: no replica can take the broadcast of "
                    f"{name!r} ({d.why_down()})",
                    mesh=svc.name,
                )

        def send() -> None:
            client = svc._client_for(rt)
            if client.dispatcher.healthy():
                client.broadcast(name, payload, buffers)
                return
            task = rt.loop.create_task(_broadcast_later(client, name, payload, buffers))
            _LATER.add(task)  # keep a reference until it ends
            task.add_done_callback(_LATER.discard)

        rt.dispatch(send, here=home)

    def __repr__(self) -> str:
        return f"<service endpoint {self._name} of {self._svc!r}>"


def _skip(value: BaseException) -> bool:
    """A replica failed during a fan-out: it is left out, not an error."""
    return isinstance(value, SupervisionError | ActorStoppedError)


_LATER: set[asyncio.Task[None]] = set()  # broadcasts waiting for a replica


async def _broadcast_later(client: Any, name: str, payload: Any, buffers: list[Any]) -> None:
    """A broadcast made while no replica was healthy: sent once one is, or dropped, said."""
    try:
        await client.serving(name, None)
    except ZmeshError as exc:
        client.dispatcher.failed += 1
        log.warning("broadcast of %r reached no replica: %s", name, exc)
        return
    client.broadcast(name, payload, buffers)


async def _survivors(
    futs: list[asyncio.Future[Any]],
) -> tuple[list[Any], BaseException | None]:
    """The values of a fan-out, less the replicas that failed during it, and
    the first such failure."""
    results = await asyncio.gather(*futs, return_exceptions=True)
    out = []
    lost: BaseException | None = None
    for r in results:
        if isinstance(r, BaseException):
            if _skip(r):
                lost = lost or r
                continue  # that replica failed during the call
            raise r
        out.append(r)
    return out, lost


def _all_lost(service: str, name: str, n: int) -> ServiceError:
    return ServiceError(
        f"every replica of {service} called with {name!r} ({n}) failed during the call",
        mesh=service,
    )


def _lost(service: str, name: str, n: int, lost: list[BaseException]) -> ZmeshError:
    """Why a fan-out stream that every replica failed ends: ``ActorStoppedError``
    when each was stopped (the service was: as its fan-out call says), else
    ``ServiceError``."""
    if all(isinstance(e, ActorStoppedError) for e in lost):
        return ActorStoppedError(f"service {service} was stopped", mesh=service)
    return _all_lost(service, name, n)


def _settled(futs: list[asyncio.Future[Any]]) -> list[concurrent.futures.Future[Any]]:
    """The replies of a fan-out as thread-safe futures (for a stream anywhere)."""
    out: list[concurrent.futures.Future[Any]] = []
    for f in futs:
        c: concurrent.futures.Future[Any] = concurrent.futures.Future()
        f.add_done_callback(functools.partial(_copy_to, c))
        out.append(c)
    return out


class ServiceStream(Generic[R]):
    """The replies of ``svc.ep.stream(...)``, in arrival order; iterate it once."""

    def __init__(
        self,
        rt: Runtime,
        started: Future[list[concurrent.futures.Future[Any]]],
        service: str = "",
        name: str = "",
        client: Callable[[], Any] | None = None,
    ):
        self._rt = rt
        self._started = started
        self._about = (service, name)
        self._client = client  # the service's client that made it (why it is DOWN)

    def _ended(self, n: int, lost: list[BaseException]) -> ZmeshError:
        """Why the stream ends when every replica failed during it."""
        client = self._client() if self._client is not None else None
        service = self._about[0]
        if client is not None and client.dispatcher.orphaned:
            why = client.dispatcher.why_down()
            return ServiceError(f"service {service} is DOWN: {why}", mesh=service)
        return _lost(*self._about, n, lost)

    async def __aiter__(self) -> AsyncIterator[R]:
        futs = await self._started
        lost: list[BaseException] = []
        for next_done in asyncio.as_completed([asyncio.wrap_future(f) for f in futs]):
            try:
                value = await next_done
            except (SupervisionError, ActorStoppedError) as exc:
                lost.append(exc)
                continue
            futs = []  # (one value came: not every replica was lost)
            yield value
        if futs and lost:
            raise self._ended(len(futs), lost) from lost[0]

    def __iter__(self) -> Iterator[R]:
        if running_loop() is self._rt.loop:
            raise RuntimeError("a stream on this loop is iterated with 'async for'")
        futs = self._started.get()
        lost: list[BaseException] = []
        yielded = False
        for f in concurrent.futures.as_completed(futs):
            exc = f.exception()
            if exc is not None:
                if _skip(exc):
                    lost.append(exc)
                    continue
                raise exc
            yielded = True
            yield f.result()
        if not yielded and lost:
            raise self._ended(len(futs), lost) from lost[0]
