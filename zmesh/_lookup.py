"""``zmesh.lookup(name, Cls)``: attach to a detached service or mesh, typed as ``Cls``.

``zmesh._client.control.lookup`` finds what is filed under a name; this attaches
to it: a service through its orchestrator, a mesh as it is. Given the
actor class, the result is typed as that class (as ``as_actor()`` and
``as_service()`` are, ``zmesh._typing``), and what was
found is checked to be a service or mesh of that class before it is
handed out, so a wrong guess fails at the lookup, with both names, rather
than later, at some call, as an unknown endpoint.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, TypeVar, overload

from zmesh._actor import ActorBase, endpoints_of
from zmesh._client.calls.future import Future
from zmesh._client.calls.runtime import Runtime
from zmesh._client.control.lookup import find, on_home
from zmesh._client.handles.mesh import ActorMesh
from zmesh._errors import HandleTypeError
from zmesh._service.orchestrator import attach
from zmesh._service.service import Service
from zmesh._wire import messages as w

A = TypeVar("A", bound=ActorBase)


@overload
def lookup(name: str) -> Future[Any]: ...
@overload
def lookup(name: str, cls: type[A]) -> Future[A]: ...
def lookup(name: str, cls: type[Any] | None = None) -> Future[Any]:
    """Attach to the detached service or mesh ``name``: a future of its handle.

    ``svc = await zmesh.lookup("embedder", Embedder)`` (or ``.get()`` in
    plain code) finds what a script made with ``Embedder.options(
    name="embedder", detached=True)`` on the configured agents
    (``ZMESH_AGENTS`` or ``zmesh.connect``), for the same keys
    (``ZMESH_KEYS``). A service comes back as a ``Service`` (direct calls,
    adverbs, sessions, failover, and ``svc.stop()``), a mesh as an
    ``ActorMesh``; with ``cls``, either is typed as ``cls``.

    Args:
        name: the name it was detached under.
        cls: the actor class it should be of (optional): the handle is
            checked to be a service or mesh of that class (same class name,
            and every endpoint of ``cls``), and typed as ``cls``.

    Raises (from the future):
        NameNotFoundError: no such name for these keys; its ``names`` are
            the ones that exist.
        HandleTypeError: ``name`` is a service or mesh of another class.
        ServiceError: a service whose orchestrator stays down (its agent
            restarted it too often): at once, with its log path.
        SecurityError, AgentError: no configured agent could be asked.
    """
    if cls is None:
        return _attach(name)
    if not isinstance(cls, type):
        raise HandleTypeError(
            f"zmesh.lookup({name!r}, cls): cls must be an actor class, not {cls!r}",
            name=name, expected=repr(cls), mesh=name,
        )  # fmt: skip
    return _checked(_attach(name), cls, name)


def _attach(name: str) -> Future[Any]:
    """The handle of what is filed under ``name``: a service's or a mesh's."""
    w.check_name(name, "detached name")  # at once, as spawning it would have

    async def go(rt: Runtime) -> Any:
        kind, handle, addr = await find(rt, name)
        if kind == "service":
            return await attach(name, handle, addr)
        handle._detached = name  # its stop() stops it by name (its procs too)
        return handle

    return on_home(go)


def _checked(found: Future[Any], cls: type, name: str) -> Future[Any]:
    """``found``'s handle once ``check_class`` passed it (whichever loop it was found on)."""
    out: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def done(f: concurrent.futures.Future[Any]) -> None:
        if f.cancelled():
            out.cancel()
            return
        try:
            handle = f.result()
            check_class(handle, cls, name)
        except BaseException as exc:  # the lookup's own error, or the check's
            out.set_exception(exc)
        else:
            out.set_result(handle)

    found._concurrent().add_done_callback(done)
    return Future(cfut=out)


def check_class(handle: Any, cls: type, name: str) -> None:
    """Whether ``handle`` (a service or actor mesh) is of actor class ``cls``.

    The handle knows its class by name only (the class itself need not be
    importable where the handle goes): the names must match, and the handle
    must have every endpoint of ``cls``.

    Raises:
        HandleTypeError: it is not (the message names both classes).
    """
    if isinstance(handle, Service):
        kind, host = "service", (handle._agents[0] if handle._agents else None)
    elif isinstance(handle, ActorMesh):
        kind, host = "mesh", (handle._refs[0].host if handle._refs else None)
    else:
        kind, host = type(handle).__name__, None
    found = str(getattr(handle, "cls_name", ""))
    missing = sorted(set(endpoints_of(cls)) - set(getattr(handle, "endpoints", ())))
    if found == cls.__qualname__ and not missing:
        return
    why = f"{name!r} is a {kind} of {found or 'no actor class'}, not of {cls.__qualname__}"
    if found == cls.__qualname__:
        why = f"{name!r} is a {kind} of another {found}: no endpoint {', '.join(missing)}"
    raise HandleTypeError(
        f"zmesh.lookup({name!r}, {cls.__qualname__}): {why}",
        name=name, kind=kind, found=found, expected=cls.__qualname__, mesh=name, host=host,
    )  # fmt: skip
