"""The gateway as an ASGI application: routes, auth, and one call per request.

===========================  =============================================
``POST /v1/{svc}/{ep}``      call an endpoint: ``{"args": [...], "kwargs": {...}}``
                             → ``{"result": ...}``, or Server-Sent Events for a
                             generator endpoint (``Accept: text/event-stream``)
``GET /v1/services``         the services, their endpoints and JSON schemas
``GET /openapi.json``        the same as an OpenAPI 3.1 document
``GET /healthz``             ``{"ok": true}``, without a token
===========================  =============================================
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import msgspec

import zmesh
from zmesh._errors import ActorStoppedError, EncodeError, EndpointError, ZmeshError
from zmesh.http import errors, schemas, sse, tokens
from zmesh.http.asgi import BodyTooLarge, Receive, Scope, Send, header, path_of, read_body, respond
from zmesh.http.catalog import MAX_SESSIONS, Catalog

# The largest request body taken (bigger: 413).
MAX_BODY = 16 * 1024 * 1024
_ARGS = msgspec.json.Decoder(dict[str, Any])


class Gateway:
    """An ASGI application serving zmesh's detached services over HTTP/JSON and SSE.

    Made by ``zmesh.http.app(...)``; see there.
    """

    def __init__(
        self,
        services: Sequence[str] | None,
        token: str | None,
        timeout: float | None,
        max_sessions: int,
        max_body: int,
    ) -> None:
        self.catalog = Catalog(services, max_sessions)
        self.token = token
        self.timeout = timeout
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = path_of(scope), scope["method"]
        if path == "/healthz":
            await respond(send, 200, b'{"ok":true}')
            return
        if self.token is not None and not tokens.authorized(
            header(scope, b"authorization"), self.token
        ):
            await _error(send, 401, "Unauthorized", "a valid 'Authorization: Bearer <token>' "
                         "header is needed", [(b"www-authenticate", b"Bearer")])  # fmt: skip
            return
        try:
            if path == "/v1/services" and method in ("GET", "HEAD"):
                await respond(send, 200, msgspec.json.encode(await self.listing()))
            elif path == "/openapi.json" and method in ("GET", "HEAD"):
                await respond(send, 200, msgspec.json.encode(await self.openapi()))
            elif path.startswith("/v1/") and path.count("/") == 3:
                if method != "POST":
                    await _error(send, 405, "MethodNotAllowed", f"{method} {path}: use POST",
                                 [(b"allow", b"POST")])  # fmt: skip
                    return
                _, _, name, endpoint = path.split("/")
                await self._call(scope, receive, send, name, endpoint)
            else:
                await _error(send, 404, "NotFound", f"no route {method} {path}")
        except ZmeshError as exc:  # the listing: no agent could be asked
            status, kind, message = errors.describe(exc)
            await _error(send, status, kind, message, errors.headers_for(status))

    # ------------------------------------------------------------ calls

    async def _call(
        self, scope: Scope, receive: Receive, send: Send, name: str, endpoint: str
    ) -> None:
        """``POST /v1/{name}/{endpoint}``."""
        try:
            raw = await read_body(receive, self.max_body)
        except BodyTooLarge as exc:
            await _error(send, 413, "BodyTooLarge", str(exc))
            return
        for attempt in (1, 2):
            svc = None
            try:
                svc = await self.catalog.service(name)
                binder = self.catalog.binder(name, svc, endpoint)
                if binder is None:
                    known = ", ".join(sorted(svc.endpoints))
                    raise _NoEndpoint(f"service {name!r} has no endpoint {endpoint!r} "
                                      f"(endpoints: {known})")  # fmt: skip
                args, kwargs = binder.bind(*_arguments(raw))
                ref = getattr(svc, endpoint).options(
                    timeout=self._timeout(scope), session=self._session(scope, svc)
                )
                if binder.stream:
                    await self._stream(scope, receive, send, ref, args, kwargs)
                    return
                result = await ref(*args, **kwargs)
                await respond(send, 200, _result(result))
                return
            except ActorStoppedError as exc:  # stopped, perhaps made again under its name
                self.catalog.forget(name, svc)
                if attempt == 2:
                    await _failed(send, exc)
            except _NoEndpoint as exc:
                await _error(send, 404, "EndpointError", str(exc))
                return
            except Exception as exc:
                await _failed(send, exc)
                return

    async def _stream(
        self, scope: Scope, receive: Receive, send: Send, ref: Any, args: Any, kwargs: Any
    ) -> None:
        accept = header(scope, b"accept") or b""
        if b"text/event-stream" not in accept:
            await _error(send, 406, "NotAcceptable", "a generator endpoint streams: send "
                         "'Accept: text/event-stream'")  # fmt: skip
            return
        await sse.serve_stream(ref(*args, **kwargs), send, receive)

    def _timeout(self, scope: Scope) -> float | None:
        given = header(scope, b"x-zmesh-timeout")
        if given is None:
            return self.timeout
        try:
            seconds = float(given)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise EndpointError(f"X-Zmesh-Timeout must be a positive number of seconds, "
                                f"not {given.decode('latin-1')!r}")  # fmt: skip
        return seconds

    def _session(self, scope: Scope, svc: Any) -> zmesh.Session | None:
        sid = header(scope, b"x-zmesh-session")
        if not sid:
            return None
        return self.catalog.session(svc, sid.decode("latin-1"))

    # ------------------------------------------------------------ descriptions

    async def listing(self) -> dict[str, Any]:
        """``{"services": [{"name", "class", "replicas", "endpoints": [...]}], "$defs"}``."""
        out, _ = await self._describe(schemas.Schemas())
        return out

    async def openapi(self) -> dict[str, Any]:
        """The OpenAPI document of the services served."""
        found = schemas.Schemas("#/components/schemas/{name}")
        listing, defs = await self._describe(found)
        return schemas.openapi(
            {s["name"]: s["endpoints"] for s in listing["services"]}, defs, zmesh.__version__
        )

    async def _describe(self, found: schemas.Schemas) -> tuple[dict[str, Any], dict[str, Any]]:
        services = []
        for name, svc in (await self.catalog.services()).items():
            info = zmesh.service_info(svc)
            endpoints = []
            for ep in sorted(svc.endpoints):
                binder = self.catalog.binder(name, svc, ep)
                if binder is not None:
                    endpoints.append(found.endpoint(binder))
            services.append(
                {
                    "name": name,
                    "class": info.cls_name,
                    "replicas": info.replicas,
                    "endpoints": endpoints,
                }
            )
        return {"services": services, "$defs": found.defs}, found.defs


class _NoEndpoint(Exception):
    pass


def _arguments(raw: bytes) -> tuple[list[Any], dict[str, Any]]:
    """``(args, kwargs)`` of a request body (empty: none).

    Raises:
        EndpointError: not a JSON object of ``args`` (a list) and ``kwargs`` (an object).
    """
    if not raw.strip():
        return [], {}
    try:
        doc = _ARGS.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise EndpointError(f"the request body is not a JSON object: {exc}") from exc
    args, kwargs = doc.pop("args", []), doc.pop("kwargs", {})
    if doc or not isinstance(args, list) or not isinstance(kwargs, dict):
        raise EndpointError(
            'the request body is {"args": [...], "kwargs": {...}}, both optional'
            + (f" (unknown keys: {', '.join(sorted(doc))})" if doc else "")
        )
    return args, kwargs


def _result(value: Any) -> bytes:
    try:
        return msgspec.json.encode({"result": value})
    except (TypeError, msgspec.EncodeError) as exc:
        raise EncodeError(
            f"the result, of type {type(value).__qualname__}, cannot be sent as JSON: {exc}"
        ) from exc


async def _failed(send: Send, exc: BaseException) -> None:
    status, kind, message = errors.describe(exc)
    await _error(send, status, kind, message, errors.headers_for(status))


async def _error(
    send: Send,
    status: int,
    kind: str,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    with contextlib.suppress(OSError):  # the client is gone
        await respond(send, status, errors.body(kind, message), headers or [])


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def app(
    services: Sequence[str] | None = None,
    *,
    token: str | None,
    timeout: float | None = None,
    max_sessions: int = MAX_SESSIONS,
    max_body: int = MAX_BODY,
) -> Gateway:
    """The HTTP gateway to detached services, as an ASGI application.

    Serve it with any ASGI server (``uvicorn.run(app, ...)``), or mount it
    in a Starlette or FastAPI application
    (``Mount("/zmesh", app=zmesh.http.app(token=...))``). It calls the
    services of the agents this process is configured with
    (``ZMESH_AGENTS`` or ``zmesh.connect``), for its keys (``ZMESH_KEYS``).

    Args:
        services: serve only these names (default: every detached service).
        token: the bearer token every request but ``/healthz`` must carry
            (``Authorization: Bearer <token>``); ``None`` serves without one
            (when what it is mounted in checks who calls).
        timeout: seconds a request may take (default: each service's
            ``request_timeout``); a request's ``X-Zmesh-Timeout`` header
            sets its own.
        max_sessions: client sessions (``X-Zmesh-Session``) kept, at most.
        max_body: the largest request body taken, in bytes (larger: 413).

    Example::

        gateway = zmesh.http.app(token=open("token").read().strip())
        uvicorn.run(gateway, host="127.0.0.1", port=8000)
    """
    return Gateway(services, token, timeout, max_sessions, max_body)
