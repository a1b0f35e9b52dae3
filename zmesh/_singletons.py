"""Monarch's process-wide helpers.

``get_or_spawn_controller``, ``shutdown_context`` and ``proc_mesh``.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, TypeVar

from zmesh._actor import ActorBase
from zmesh._client.future import Future
from zmesh._client.hosts import HostMesh
from zmesh._client.mesh import ActorMesh, ProcMesh
from zmesh._client.shutdown import shutdown
from zmesh._options import Options

A = TypeVar("A", bound=ActorBase)

_lock = threading.Lock()
_controllers: dict[str, ActorMesh[Any]] = {}


def get_or_spawn_controller(name: str, cls: type[A], *args: Any, **kwargs: Any) -> A:
    """The one actor named ``name`` of this process, spawned (on a proc of its own) on first ask.

    Later asks, from any thread or actor of this process, get the same
    actor, whatever their arguments. One whose spawn failed, or that was
    stopped, is spawned again. Like every mesh it is returned at once
    (``await`` it, or ``.get()``, to wait for its ``__init__``).

    Raises:
        ValueError: ``name`` is not a valid mesh name, or it names a
            controller of another class.
    """
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
