"""Failures of meshes, as owners meet them: ``MeshFailure``, ``__supervise__`` and the hook.

A failure of a rank of a mesh goes, once, to its owner: to the
``__supervise__(failure)`` of the actor that spawned the mesh (sync or
``async def``; a truthy return handles it), else, in the client, to
``zmesh.unhandled_fault_hook(failure)``. zmesh's default hook logs the
failure with its mesh, rank and log path and the program goes on (Monarch's
exits; zmesh's calls to the failed ranks fail with ``SupervisionError``, so
nothing hangs). Assign ``zmesh.unhandled_fault_hook = my_hook`` to change it.
Inside a proc, a failure no ``__supervise__`` handles fails the proc, so that
its own owner hears of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from zmesh._client.control import controller as _controller
from zmesh._client.control.controller import SupervisionEvent

log = logging.getLogger("zmesh")


@dataclasses.dataclass(frozen=True)
class MeshFailure(SupervisionEvent):
    """One failure of one rank of a mesh, as an owner is told of it.

    Attributes are those of ``SupervisionEvent`` (``mesh``, ``rank``,
    ``host``, ``status``, ``reason``, ``generation``, ``log_path``,
    ``exit_code``).
    """

    @classmethod
    def of(cls, event: SupervisionEvent) -> MeshFailure:
        if isinstance(event, MeshFailure):
            return event
        return cls(**{f.name: getattr(event, f.name) for f in dataclasses.fields(event)})

    @property
    def mesh_name(self) -> str:
        """The name of the mesh that failed: the actor mesh when an actor died,
        the proc mesh when a proc did."""
        return self.mesh

    @property
    def crashed_ranks(self) -> list[int]:
        """The ranks that failed, as Monarch lists them (one per ``MeshFailure`` here)."""
        return [self.rank]

    @property
    def event(self) -> str:
        """What happened, with zmesh's context (host, status, log path)."""
        return SupervisionEvent.__str__(self)

    def report(self) -> str:
        """A one-line account of the failure."""
        return str(self)

    def __str__(self) -> str:
        return (
            f"MeshFailure(mesh_name={self.mesh}, crashed_ranks={self.crashed_ranks}, "
            f"event={self.event})"
        )


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """zmesh's default for a failure no owner handled: log it and go on.

    Replace it with ``zmesh.unhandled_fault_hook = fn``; ``fn(failure)`` may
    return anything (handled) or raise (logged as unhandled).
    """
    if _logging_configured(log):
        log.error("unhandled mesh failure: %s", failure)
    else:  # the zmesh logger has only its NullHandler: say it where it is seen
        print(f"zmesh: unhandled mesh failure: {failure}", file=sys.stderr, flush=True)


def _logging_configured(logger: logging.Logger) -> bool:
    """Whether a record of ``logger`` reaches a handler that is not a ``NullHandler``."""
    node: logging.Logger | None = logger
    while node is not None:
        if any(not isinstance(h, logging.NullHandler) for h in node.handlers):
            return True
        if not node.propagate:
            return False
        node = node.parent
    return False


def _hook() -> Callable[[MeshFailure], Any]:
    zmesh = sys.modules.get("zmesh")
    return getattr(zmesh, "unhandled_fault_hook", unhandled_fault_hook)


def _run_hook(event: SupervisionEvent) -> None:
    try:
        _hook()(MeshFailure.of(event))
    except Exception:
        log.exception("unhandled_fault_hook raised for %s", event)


def client_handler(ctl: Any) -> Callable[[SupervisionEvent], bool]:
    """The handler of a mesh the client itself owns: the hook, unless iterated."""

    def handle(event: SupervisionEvent) -> bool:
        # supervision_events() handles it otherwise: an iterator of a mesh
        # (or slice) that has the failed rank, not any iterator on the procs.
        if not any(_controller.takes(lis, event) for lis in ctl.listeners.get(event.mesh, ())):
            _run_hook(event)
        return True

    return handle


_tasks: set[asyncio.Task[Any]] = set()  # async __supervise__ calls under way

# Set in a proc (zmesh._host.proc.procserver): kill its actor that is ``owner``, failed
# with ``why``; whether there was one. A failure its owner did not handle
# then fails that actor alone, not its proc, as in Monarch.
kill_owner: Callable[[Any, str], bool] | None = None


def owner_handles(owner: Any, event: SupervisionEvent) -> bool:
    """Give ``event`` to ``owner.__supervise__``; unhandled (a falsy return, an
    exception), ``owner`` fails too. Always handled here, in one way or the other."""
    try:
        handled = supervise(owner, event)
    except Exception as exc:
        log.error("__supervise__ raised for %s", event, exc_info=exc)
        escalate(owner, event, exc)
        return True
    if not handled:
        escalate(owner, event)
    return True


def escalate(owner: Any, event: SupervisionEvent, raised: BaseException | None = None) -> None:
    """``owner`` did not handle ``event`` (its ``__supervise__`` returned falsy,
    or ``raised``): it fails too, and its own owner is told."""
    why = event.reason
    if not why.startswith("The actor "):  # a proc's failure, not an actor's
        why = f"the process of mesh {event.mesh} rank {event.rank} failed: {why}"
    if raised is not None:
        why = f"__supervise__ raised {type(raised).__name__}: {raised}, handling: {why}"
    if kill_owner is not None and kill_owner(owner, why):
        return
    if _controller.ESCALATE_UNHANDLED:
        log.error("unhandled supervision event: %s; failing this proc so its owner is told", event)
        os._exit(1)
    _run_hook(event)


def supervise(actor: Any, event: SupervisionEvent) -> bool:
    """Give ``event`` to ``actor.__supervise__``; whether it was handled.

    An ``async def __supervise__`` runs as a task on the loop; the event counts
    as handled now, and a falsy answer (or an exception) later is treated as
    unhandled then.
    """
    hook = getattr(actor, "__supervise__", None)
    if hook is None:
        return False
    result = hook(MeshFailure.of(event))
    if not inspect.isawaitable(result):
        return bool(result)
    task = asyncio.ensure_future(result)
    _tasks.add(task)

    def done(t: asyncio.Task[Any]) -> None:
        _tasks.discard(t)
        ok = not t.cancelled() and t.exception() is None and bool(t.result())
        if not ok:
            _unhandled_later(actor, event, t)

    task.add_done_callback(done)
    return True


def _unhandled_later(actor: Any, event: SupervisionEvent, task: asyncio.Task[Any]) -> None:
    raised = None if task.cancelled() else task.exception()
    if raised is not None:
        log.error("__supervise__ raised for %s", event, exc_info=raised)
    escalate(actor, event, raised)
