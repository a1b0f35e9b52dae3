"""The running actor's context, as Monarch names it: ``context()``, ``current_*()``.

Everything here reads context variables that the proc sets around each
actor's ``__init__`` and messages (see ``zmesh._host.proc.procserver``), so it answers
for the actor whose code is running, in any thread that code runs in. In
the client, outside any actor, ``context()`` describes the client itself
(rank 0 of a mesh of one, named ``client``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from zmesh._actor import _ACTOR_NAME, _CURRENT, current_rank, own_proc
from zmesh._shared.points import Point
from zmesh._this_proc import this_proc

if TYPE_CHECKING:
    from zmesh._client.handles.mesh import ProcMesh


@dataclass(frozen=True)
class Instance:
    """The running actor: where it is, what it is called, which proc hosts it.

    Attributes:
        rank: its ``Point`` in its mesh.
        name: its actor name (``procs.spawn(name, ...)``), ``client`` outside actors.
        actor_id: ``<proc mesh>/<name>[<rank>]``, unique while the mesh lives.
    """

    rank: Point
    name: str
    actor_id: str

    @property
    def proc(self) -> ProcMesh:
        """The proc this actor runs in, as a one-proc ``ProcMesh`` (``this_proc()``)."""
        return this_proc()

    def abort(self, reason: str | None = None) -> NoReturn:
        """Fail this actor now, as Monarch's ``Instance.abort``: it dies (its
        proc goes on), its calls raise ``SupervisionError`` and its spawner is
        told, with ``reason`` ("no reason provided" without one).

        It raises a ``BaseException`` (``ActorAborted``) out of the endpoint, so
        code between here and the endpoint's return must let it through.
        """
        raise ActorAborted(reason or "no reason provided")


class ActorAborted(BaseException):
    """``Instance.abort()`` was called: the actor dies of it (zmesh._host.proc.actordeath)."""


@dataclass(frozen=True)
class Context:
    """What ``context()`` returns: the actor instance and the message it handles.

    Attributes:
        actor_instance: the running actor.
        message_rank: the actor's point for the message being handled (zmesh
            gives the point in the full mesh, also for a call on a slice).
    """

    actor_instance: Instance
    message_rank: Point


def context() -> Context:
    """The context of the running actor (or of the client, outside actors)."""
    point = _CURRENT.get(None)
    if point is None:
        me = Point(0, {})
        ref = own_proc()
        where = ref.mesh if ref is not None else f"client-{os.getpid()}"
        return Context(Instance(me, "client", f"{where}/client[0]"), me)
    name = _ACTOR_NAME.get("")
    ref = own_proc()
    mesh = ref.mesh if ref is not None else f"client-{os.getpid()}"
    return Context(Instance(point, name, f"{mesh}/{name}[{point.rank}]"), point)


def current_size() -> dict[str, int]:
    """The size of each dim of the running actor's mesh.

    Raises:
        RuntimeError: when called outside an actor.
    """
    return dict(current_rank().dims)


def current_actor_name() -> str:
    """The running actor's name (``client`` outside actors)."""
    return _ACTOR_NAME.get("client")
