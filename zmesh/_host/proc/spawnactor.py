"""Starting an actor in its proc: a ``SpawnActor`` becomes a running mailbox.

The class is unpickled and its ``__init__`` runs in a worker thread, in a
context where ``current_rank()``, ``current_actor_name()`` and the owner of
meshes spawned inside ``__init__`` are the new actor's, so the proc's loop
(and its heartbeats) go on meanwhile. A failure of either is the spawn's
answer; the proc serves on. A new actor of a name replaces the old one.
A ``SpawnActor`` of several actors (``count``) is ``zmesh._host.proc.actors``'s.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import pickle
from typing import TYPE_CHECKING, Any

from zmesh._actor import Point, set_actor_name, set_current
from zmesh._errors import SpawnError
from zmesh._host.proc import actors as _actors
from zmesh._host.proc import lifecycle as _lifecycle
from zmesh._host.proc.mailbox import Mailbox
from zmesh._wire import messages as w
from zmesh._wire.codec import NONE

if TYPE_CHECKING:
    from zmesh._host.proc.procserver import ProcServer


async def spawn(server: ProcServer, ident: bytes, msg: w.SpawnActor, frames: list[Any]) -> None:
    """Build ``msg``'s actor, put it in its mailbox, and answer ``ident``."""
    point = Point(msg.rank, dict(msg.dims))

    def build() -> Any:
        # Unpickling may import the user's modules, and __init__ may block
        # (loading a model): both run off the loop, so heartbeats go on.
        try:
            cls = pickle.loads(msg.cls)
            args, kwargs = server.codec.unpack(msg.payload, frames)
        except Exception as exc:
            raise SpawnError(
                f"the proc cannot load the actor class or its arguments: {exc!r}"
            ) from exc
        instance = cls.__new__(cls)
        # Meshes spawned inside __init__ are owned (supervised) by this actor.
        set_current(actor=instance)
        instance.__init__(*args, **kwargs)
        return instance

    try:
        ctx = contextvars.copy_context()
        ctx.run(set_current, point)
        ctx.run(set_actor_name, msg.actor)
        instance = await asyncio.get_running_loop().run_in_executor(
            server.pool, functools.partial(ctx.run, build)
        )
    except BaseException as exc:
        if _lifecycle.cancelled(exc):
            raise
        # SystemExit or any BaseException from __init__ fails the spawn
        # (the actor never started); the proc serves on.
        server._send_failure(ident, msg.id, "spawn", exc, "__init__")
        return
    _actors.stop(server, msg.actor)  # a new actor (or group) of a name replaces the old one
    server.actors[msg.actor] = Mailbox(server, msg.actor, instance, point)
    if hasattr(instance, "__cleanup__"):
        _lifecycle.on_sigterm(server)  # its __cleanup__ runs when the agent stops us
    server.router.send([ident, *server.codec.encode(w.Reply(msg.id, NONE))])
