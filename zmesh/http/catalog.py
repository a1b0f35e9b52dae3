"""The services a gateway serves: handles found by name, and their sessions.

A handle is looked up once (``zmesh.lookup``) and kept: it follows its
service's replicas by itself. A service stopped (or stopped and made again
under the same name) is forgotten, and looked up again on the next request.
Sessions named by clients (``X-Zmesh-Session``) are kept up to a bound,
least recently used first out, so clients cannot grow the gateway's memory
without bound by inventing session ids.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import zmesh
from zmesh._client.control.lookup import detached_names
from zmesh._errors import NameNotFoundError, ZmeshError
from zmesh.http.binding import Binder

# Sessions kept by default (each is a few hundred bytes).
MAX_SESSIONS = 10_000


class Catalog:
    """Finds and keeps the gateway's service handles.

    Args:
        only: serve these names only (``None``: every detached service of
            the configured agents, for this process's keys).
        max_sessions: how many client sessions to keep.
    """

    def __init__(self, only: Sequence[str] | None = None, max_sessions: int = MAX_SESSIONS) -> None:
        self.only = list(only) if only is not None else None
        self.max_sessions = max_sessions
        self._handles: dict[str, Any] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._binders: dict[tuple[str, str], Binder] = {}
        self._sessions: OrderedDict[tuple[str, str], zmesh.Session] = OrderedDict()

    async def service(self, name: str) -> Any:
        """The handle of service ``name``.

        Raises:
            NameNotFoundError: no detached service of that name is served here.
            HandleTypeError: ``name`` is a detached mesh, not a service.
            ServiceError, AgentError, SecurityError: as ``zmesh.lookup``.
        """
        svc = self._handles.get(name)
        if svc is not None:
            return svc
        if self.only is not None and name not in self.only:
            raise NameNotFoundError(
                f"no service {name!r} here (served: {', '.join(self.only) or 'none'})",
                name=name, names=self.only,
            )  # fmt: skip
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:  # concurrent first requests look it up once
            svc = self._handles.get(name)
            if svc is None:
                try:
                    found = zmesh.lookup(name)
                except ValueError as exc:  # no valid name: nothing can be filed under it
                    raise NameNotFoundError(f"no service {name!r}: {exc}", name=name) from exc
                handle = await found
                zmesh.service_info(handle)  # HandleTypeError: a mesh
                svc = self._handles[name] = handle
        return svc

    def forget(self, name: str, svc: Any) -> None:
        """Drop ``svc`` (stopped): the next request for ``name`` looks it up again."""
        if self._handles.get(name) is svc:
            del self._handles[name]
            for key in [k for k in self._binders if k[0] == name]:
                del self._binders[key]

    async def services(self) -> dict[str, Any]:
        """The services served here now: their handles, by name.

        Raises:
            AgentError, SecurityError: no configured agent could be asked.
        """
        found = await detached_names() if self.only is None else self.only
        out = {}
        for name in sorted(found):
            try:
                out[name] = await self.service(name)
            except ZmeshError:  # a mesh, stopped meanwhile, or its orchestrator down
                continue
        return out

    def binder(self, name: str, svc: Any, endpoint: str) -> Binder | None:
        """The argument binder of ``endpoint`` (``None``: the service has no such endpoint)."""
        key = (name, endpoint)
        binder = self._binders.get(key)
        if binder is None:
            info = svc.endpoints.get(endpoint)
            if info is None:
                return None
            binder = self._binders[key] = Binder(name, info)
        return binder

    def session(self, svc: Any, session_id: str) -> zmesh.Session:
        """The session ``session_id`` of ``svc`` (made on first use; the least recently used
        is dropped past ``max_sessions``: its next call starts it afresh on some replica)."""
        key = (zmesh.service_info(svc).id, session_id)
        s = self._sessions.get(key)
        if s is None:
            s = self._sessions[key] = zmesh.Session(svc, session_id)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(key)
        return s

    def statistics(self) -> dict[str, int]:
        """How many handles and sessions are kept."""
        return {"services": len(self._handles), "sessions": len(self._sessions)}
