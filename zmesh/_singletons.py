"""Monarch's process-wide helpers.

``get_or_spawn_controller``, ``shutdown_context`` and ``proc_mesh``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pickle
import secrets
import threading
from typing import Any, TypeVar

from zmesh._actor import ActorBase, endpoint, own_proc
from zmesh._client.calls.future import Future
from zmesh._client.control.shutdown import shutdown
from zmesh._client.handles.hosts import HostMesh
from zmesh._client.handles.mesh import ActorMesh, ProcMesh
from zmesh._options import Actor, Options
from zmesh._this_proc import this_proc

A = TypeVar("A", bound=ActorBase)

_lock = threading.Lock()
_controllers: dict[str, ActorMesh[Any]] = {}
# The job's registry of controllers, for the procs this process starts: a
# pickled handle of the ``_Registry`` on the root client's ``this_proc()``.
REGISTRY_VAR = "ZMESH_CONTROLLERS"
_registry: tuple[int, Any] | None = None  # (our pid, our handle of it), once made or found


class _Registry(Actor):
    """The controllers of a job, on its root client's ``this_proc()``: every
    proc the client (or its actors) started asks here, as Monarch's do."""

    @endpoint(concurrent=True)  # a controller's __init__ may ask for another
    async def get_or_spawn(
        self, name: str, cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        # In a thread of no loop, as the root client's own asks are: the same
        # runtime sees (and keeps) the same meshes.
        mesh = await asyncio.to_thread(_here, name, cls, args, kwargs)
        await mesh.initialized  # a handle travels once its actors are up
        return mesh


def get_or_spawn_controller(name: str, cls: type[A], *args: Any, **kwargs: Any) -> Future[A]:
    """A future of the job's one actor named ``name``, spawned (on a proc of
    its own) on first ask, as Monarch's.

    One registry serves the job: the root client's. Its procs, and theirs
    in turn, ask it (over the root's ``this_proc()``, so from this host);
    later asks, from any thread, actor or proc of the job, get the same
    actor, whatever their arguments. One whose spawn failed, or that was
    stopped, is spawned again.

    Returns:
        a ``Future`` of the actor mesh: ``await`` it or ``.get()`` it. In the
        root client it is ready at once (the mesh may still be spawning:
        calls on it queue until it is up).

    Raises:
        ValueError: ``name`` is not a valid mesh name, or it names a
            controller of another class.
    """
    handle = _registry_here()
    if handle is None:  # the root client (or a proc of a job without one): its own table
        mesh: Any = _here(name, cls, args, kwargs)
        done: concurrent.futures.Future[A] = concurrent.futures.Future()
        done.set_result(mesh)
        return Future(cfut=done)
    return handle.get_or_spawn.call_one(name, cls, args, kwargs)


def _registry_here() -> Any:
    """The job's registry for a proc of the job (found in its environment);
    ``None`` in the root client, which makes its own first (the procs it
    starts from then on find it; one it inherited from a parent process is
    not its job's), and in a proc of a job without one."""
    global _registry
    with _lock:
        if _registry is not None and _registry[0] != os.getpid():
            _registry = None  # a fork's parent's
        if own_proc() is None:
            if _registry is None:
                mine = this_proc().spawn(f"controllers-{secrets.token_hex(4)}", _Registry)
                os.environ[REGISTRY_VAR] = pickle.dumps(mine.get(timeout=60)).hex()
                _registry = (os.getpid(), mine)
            return None
        if _registry is None:
            found = os.environ.get(REGISTRY_VAR)
            if not found:
                return None
            _registry = (os.getpid(), pickle.loads(bytes.fromhex(found)))
        return _registry[1]


def _here(name: str, cls: type[A], args: tuple[Any, ...], kwargs: dict[str, Any]) -> A:
    """The controller ``name`` of this process's own table, spawned if need be."""
    with _lock:
        mesh = _controllers.get(name)
        if mesh is not None:
            if mesh.cls_name != cls.__qualname__:
                raise ValueError(
                    f"controller {name!r} is a {mesh.cls_name}, not a {cls.__qualname__}"
                )
            if not _over(mesh):
                return mesh  # type: ignore[return-value]  # typed as the class (zmesh._typing)
        fresh: Any = Options(cls, name=name).as_actor(*args, **kwargs)
        _controllers[name] = fresh
        return fresh


def _over(mesh: ActorMesh[Any]) -> bool:
    ready = mesh._ready
    if ready.done() and ready.exception() is not None:
        return True
    if not ready.done():
        return False
    try:
        return mesh.state().status.terminal
    except Exception:  # no answer: keep the one we have
        return False


def shutdown_context() -> Future[None]:
    """Stop everything this process owns (``zmesh.shutdown()``), as a future.

    Returns at once; ``await`` the future or ``.get()`` it.
    """

    done: concurrent.futures.Future[None] = concurrent.futures.Future()

    def run() -> None:
        try:
            with _lock:
                _controllers.clear()
            shutdown()
        except BaseException as exc:  # handed to whoever waits
            done.set_exception(exc)
        else:
            done.set_result(None)

    threading.Thread(target=run, name="zmesh-shutdown", daemon=True).start()
    return Future(cfut=done)


def proc_mesh(*, hosts: int = 1, **per_host: int) -> ProcMesh:
    """Monarch's older spelling: ``proc_mesh(gpus=2)`` is
    ``HostMesh(hosts=hosts).spawn_procs(per_host={"gpus": 2})``, returned at once.

    Raises:
        ValueError: a dim or size that is not valid.
    """
    return HostMesh(None, hosts=hosts).spawn_procs(per_host=per_host or {"procs": 1})


local_proc_mesh = proc_mesh
