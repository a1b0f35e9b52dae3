"""An actor that fails dies alone, as in Monarch: its proc and its neighbours go on.

An endpoint's ``Exception`` that has a caller to go to (a call with a reply)
is that caller's ``ActorError``, and the actor lives. One with nowhere to go
(a ``broadcast``; an ``explicit_response_port`` endpoint, whose port is the
only way back), and any ``BaseException`` that is not the proc's own stop or
``SystemExit``, kills the actor: its queued and later calls fail with
``SupervisionError`` ("The actor ... and all its descendants have failed"),
and whoever spawned it is told. The spawner asks for that with a ``Call`` of
the reserved method ``__watch__`` per actor, which stays unanswered while
the actor lives: a stop answers it with ``None``, a death with a ``Failure``
of kind ``failed`` (``zmesh._client.control.actorwatch`` reads it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from zmesh._wire import messages as w
from zmesh._wire.codec import NONE

if TYPE_CHECKING:
    from zmesh._host.proc.mailbox import Mailbox
    from zmesh._host.proc.procserver import ProcServer

log = logging.getLogger("zmesh.proc")

WATCH = "__watch__"  # the reserved method a spawner watches an actor with
KIND = "failed"  # the Failure kind of a dead actor's calls and watches


def kills(box: Mailbox, exc: BaseException, call: w.Call, explicit_port: bool) -> bool:
    """Whether ``exc``, raised by ``call``'s endpoint, kills its actor
    (never one that chose ``survive_errors``, zmesh's older rule)."""
    if getattr(box.instance, "survive_errors", False):
        return False
    return call.oneway or explicit_port or not isinstance(exc, Exception)


def describe(server: ProcServer, box: Mailbox) -> str:
    """The actor as Monarch names it: ``module.Class name{'hosts': 0/1, 'gpus': 0/2}``."""
    cls = type(box.instance)
    return f"{cls.__module__}.{cls.__qualname__} {box.label}{box.point.label()}"


def kill(server: ProcServer, box: Mailbox, why: str) -> None:
    """``box``'s actor failed with ``why``: it answers nothing more but this failure."""
    if box.dead or box.stopped:
        return
    box.dead = f"The actor {describe(server, box)} and all its descendants have failed: {why}"
    log.error("%s", box.dead)
    for ident, call, _ in box.queue:
        dead_reply(server, ident, call, box)
    for nbytes in box.sizes:
        server.started(nbytes)
    box.queue.clear()
    box.sizes.clear()
    for ident, req in box.watchers:
        f = w.Failure(req, KIND, "ActorFailed", box.dead, endpoint=WATCH)
        server.router.send([ident, *server.codec.encode(f)])
    box.watchers.clear()


def watch(server: ProcServer, ident: bytes, call: w.Call, box: Mailbox | None) -> None:
    """The spawner of ``box`` asks to be told when it dies (``WATCH``)."""
    if box is None or box.stopped:
        server.router.send([ident, *server.codec.encode(w.Reply(call.id, NONE))])
    elif box.dead:
        f = w.Failure(call.id, KIND, "ActorFailed", box.dead, endpoint=WATCH)
        server.router.send([ident, *server.codec.encode(f)])
    else:
        box.watchers.append((ident, call.id))


def stopped(server: ProcServer, box: Mailbox) -> None:
    """``box`` was stopped on purpose: its watchers hear ``None``, not a failure."""
    for ident, req in box.watchers:
        server.router.send([ident, *server.codec.encode(w.Reply(req, NONE))])
    box.watchers.clear()


def kill_owner(server: ProcServer, instance: Any, why: str) -> bool:
    """Kill the actor of this proc that is ``instance`` (a failure it did not
    handle goes up as its own); whether there was one."""
    for box in list(server.actors.values()):
        if box.instance is instance:
            kill(server, box, why)
            return True
    return False


def dead_reply(server: ProcServer, ident: bytes, call: w.Call, box: Mailbox) -> None:
    """A call to a dead actor: it fails as the actor did (Monarch's words)."""
    why = f"Endpoint call {box.label}.{call.method}() failed, {box.dead}"
    server.fail(ident, call, KIND, "ActorFailed", why)
