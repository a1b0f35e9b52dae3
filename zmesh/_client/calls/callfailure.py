"""A call that fails because its rank is gone, in Monarch's words.

A dead actor's proc words its calls' failures itself
(``zmesh._host.proc.actordeath``): ``Endpoint call worker.step() failed, The
actor train.Worker worker{'hosts': 0/1, 'gpus': 1/2} and all its
descendants have failed: ...``. When the whole proc is gone (it crashed,
exited, was killed or stopped) nothing is left there to say it, and the
error is made once per rank by supervision (``zmesh._client.control.controller``),
which knows neither the actor nor the endpoint. The future the caller holds
knows both, and gives the caller the same words through ``for_call``: the
same class and context (mesh, rank, host, log), the message in Monarch's
shape, zmesh's own reason after it.
"""

from __future__ import annotations

from typing import Any

from zmesh._errors import (
    ActorStoppedError,
    ConnectionLostError,
    StreamInterruptedError,
    SupervisionError,
    _rebuild,
)
from zmesh._shared.points import Point

PREFIX = "Endpoint call "  # a message that starts so is in Monarch's words already


def for_call(err: BaseException, mesh: Any, endpoint: str) -> BaseException:
    """``err``, a failure of a call of ``mesh.endpoint``, in Monarch's words.

    Only a ``SupervisionError`` whose rank is gone changes (a lost
    connection, whose proc may live, and other errors stay as they are).

    Args:
        err: what the call failed with.
        mesh: the ``ActorMesh`` called (its ``actor``, ``cls_name``,
            ``cls_module``, ``full_dims`` and ``_refs``).
        endpoint: the endpoint's name.
    """
    if (
        not isinstance(err, SupervisionError)
        or isinstance(err, ConnectionLostError | StreamInterruptedError)
        or err.message.startswith(PREFIX)
    ):
        return err
    cls = f"{mesh.cls_module}.{mesh.cls_name}" if mesh.cls_module else mesh.cls_name
    who = f"{cls} {mesh.actor}{_point(mesh, err.rank)}"
    if isinstance(err, ActorStoppedError):
        text = f"Supervision event: actor {who} has status: stopped ({err.message})"
    else:
        why = err.message
        if err.rank is not None and err.mesh:
            # Supervision's "rank is Failed: <reason>" is said by its reason
            # alone; any other message (one that says more) is kept whole.
            said = err.reason if err.reason and why.endswith(err.reason) else why
            why = f"the process of mesh {err.mesh} rank {err.rank} failed: {said}"
        text = f"The actor {who} and all its descendants have failed: {why}"
    again = _rebuild(type(err), f"{PREFIX}{mesh.actor}.{endpoint}() failed, {text}", {})
    again.__dict__.update(err.__dict__)
    again.message = again.args[0]
    return again


def _point(mesh: Any, rank: int | None) -> str:
    """The point of the actor at proc rank ``rank`` (one actor per proc), else ``""``."""
    refs = mesh._refs
    if rank is None or not refs or refs[0].index >= 0:  # several actors per proc: not one
        return ""
    return Point(rank, mesh.full_dims).label()
