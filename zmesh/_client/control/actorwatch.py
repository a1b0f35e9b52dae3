"""The spawner of an actor mesh hears when one of its actors dies, as Monarch's owners do.

An actor dies alone (``zmesh._host.proc.actordeath``): its proc lives on, so its
agent has nothing to report. The spawner asks each proc of the new mesh to
tell it instead: one ``__watch__`` call per actor, left unanswered while the
actor lives. A death answers it with a failure, which goes as a
``MeshFailure`` (one per dead rank) where a proc's failure goes: to the
spawning actor's ``__supervise__`` (a falsy return or an exception makes
that actor die too, and its own spawner is told, and so on up), or in the
client to ``zmesh.unhandled_fault_hook``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from zmesh._actor import owner_actor
from zmesh._client.calls import grouping as _grouping
from zmesh._client.calls import tree as _tree
from zmesh._client.calls.runtime import ProcRef, Runtime
from zmesh._client.control import controller as _controller
from zmesh._client.control import faults as _faults
from zmesh._client.control.controller import SupervisionEvent
from zmesh._client.control.meshstate import MeshListener
from zmesh._client.handles.mesh import ActorMesh
from zmesh._errors import SpawnError, SupervisionError
from zmesh._shared.state import Status
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

log = logging.getLogger("zmesh")

WATCH = "__watch__"  # zmesh._host.proc.actordeath.WATCH (a proc's module: not imported here)
DIED = "ActorFailed"  # the type of a dead actor's failure


def handler() -> Callable[[SupervisionEvent], Any]:
    """Where the failures of meshes spawned here go: the spawning actor, or the client."""
    owner = owner_actor()
    if owner is None:
        if _controller.ESCALATE_UNHANDLED:  # a proc's own code, not an actor of it
            return lambda ev: log.error("unhandled actor failure: %s", ev)
        return lambda ev: _faults._run_hook(ev)
    return functools.partial(_faults.owner_handles, owner)


def watch(rt: Runtime, mesh: ActorMesh[Any], on_death: Callable[[SupervisionEvent], Any]) -> None:
    """Ask the procs of ``mesh`` to say when one of its actors dies; each death to ``on_death``.

    One ``__watch__`` per actor: a proc's only actor by the mesh's name, one
    of several (``actors_per_proc``) by its own (``name#k``), so a death in a
    group is told as its own rank's, as a proc's only actor's is.
    """
    refs = mesh._refs
    if not refs:
        return
    if _tree.wide(mesh):
        # A mesh wide enough for the relay tree is not watched actor by actor
        # (one open call per actor, sent flat, would undo what the tree saves):
        # its procs' deaths still reach the owner through their agents.
        return
    payload, buffers = Codec.pack((), {})

    def deliver(ref: ProcRef, ok: bool, value: Any) -> None:
        if ok or not isinstance(value, SupervisionError) or value.reason != DIED:
            return  # stopped (None), or the proc broke: its agent reports that
        rank = ref.point if ref.index >= 0 else ref.rank  # the actor's, in its mesh
        event = SupervisionEvent(
            mesh.actor, rank, ref.host, Status.FAILED, value.message, 1, ref.log_path or ""
        )
        try:
            listeners = [  # mesh.supervision_events() iterated (not a sibling mesh's)
                listener
                for listener in rt.controller.listeners.get(mesh.proc_mesh, ())
                if not isinstance(listener, MeshListener) or listener.takes(event)
            ]
            if listeners:  # it goes there
                for listener in listeners:
                    listener(event)
            else:
                on_death(event)
        except Exception as exc:  # never into the socket's reader
            log.error("handling the death of %s failed", event, exc_info=exc)

    if refs[0].index < 0:  # one actor per proc: one message to them all
        msg = functools.partial(w.Call, actor=mesh.actor, method=WATCH, payload=payload)
        req_id = rt.send(list(refs), msg, buffers, lambda i, ok, v: deliver(refs[i], ok, v))
        _standing(rt, refs, req_id)
        return
    for ref in refs:  # several per proc: each actor by its own name, to its proc
        proc = msgspec.structs.replace(ref, index=-1, point=-1)
        name = _grouping.member(mesh.actor, ref)
        msg = functools.partial(w.Call, actor=name, method=WATCH, payload=payload)
        req_id = rt.send([proc], msg, buffers, functools.partial(_one, deliver, ref))
        _standing(rt, [proc], req_id)


def _one(
    deliver: Callable[[ProcRef, bool, Any], None], ref: ProcRef, _: int, ok: bool, value: Any
) -> None:
    deliver(ref, ok, value)


def _standing(rt: Runtime, refs: list[ProcRef], req_id: int) -> None:
    """Answered only at a death: not a call anything waits behind."""
    for ref in refs:
        sent = rt.conn(ref).pending.get(req_id)
        if sent is not None:
            sent.standing = True  # type: ignore[union-attr]


def init_failed(
    name: str, cls: type, errors: list[BaseException], on_death: Callable[[SupervisionEvent], Any]
) -> None:
    """``__init__`` of actor mesh ``name`` failed at some ranks: one failure per rank
    goes to its owner (the spawn's ``SpawnError`` still fails ``await`` and calls)."""
    for err in errors:
        if not isinstance(err, SpawnError):
            continue  # refused, or the procs broke: not an __init__ that raised
        why = f"The actor {cls.__module__}.{cls.__qualname__} {name} failed to start: {err.message}"
        event = SupervisionEvent(
            name, err.rank or 0, err.host or "", Status.FAILED, why, 1, err.log_path or ""
        )
        try:
            on_death(event)
        except Exception as exc:
            log.error("handling the failed start of %s failed", event, exc_info=exc)
