"""``this_proc()``: the calling process as a one-proc ``ProcMesh``.

Inside an actor it is the actor's own proc. In a client it is the client
itself: the first call starts a proc server (the same ``ProcServer`` a proc
runs, without an agent) on a thread and event loop of its own, bound to an
ipc:// socket in this user's private runtime directory, so actors spawned
there run in the client's memory and are called like any other. Such a
proc has no agent: nothing supervises it (it lives as long as the client),
``stop()`` on it stops its actors but never the process, and it can be
reached only from this host.

Its actors' ``__cleanup__`` runs when their actor mesh is stopped, and at
the client's normal exit (``atexit``, within the cleanup budget), as a
proc's do when its owner exits. ``zmesh.shutdown()`` leaves them running:
they are the client's own, and zmesh is used again after it.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import secrets
import socket
import threading
from typing import Any

from zmesh._actor import own_proc
from zmesh._client.calls.runtime import ProcRef
from zmesh._client.handles.mesh import ProcMesh
from zmesh._errors import SpawnError
from zmesh._host.proc import lifecycle as _lifecycle
from zmesh._host.proc.procserver import ProcServer
from zmesh._shared import paths as _paths
from zmesh._shared.points import Shape
from zmesh._wire import security as _security
from zmesh._wire.boundary import ProcEnv
from zmesh._wire.zsock import AsyncSocket, configure

log = logging.getLogger("zmesh")

_lock = threading.Lock()
_mine: ProcMesh | None = None


def this_proc() -> ProcMesh:
    """The calling process as a one-proc ``ProcMesh``: spawn actors into it.

    Example::

        counter = zmesh.this_proc().spawn("counter", Counter, 0)
        counter.incr.call_one(1).get()

    Raises:
        SpawnError: the client's proc server could not start.
    """

    ref = own_proc()
    if ref is not None:
        return ProcMesh(ref.mesh, Shape({}, [ref.rank]), [ref])
    global _mine
    with _lock:
        if _mine is None:
            _mine = _start()
        return _mine


def _start() -> ProcMesh:
    name = f"client-{os.getpid()}-{secrets.token_hex(2)}"
    bind = f"ipc://{os.path.join(_paths.runtime_dir(), name)}.sock"
    host = socket.gethostname() or "local"
    up = threading.Event()
    failed: list[BaseException] = []

    class ClientProcServer(ProcServer):
        """A ``ProcServer`` without an agent: no hello, heartbeats or statistics."""

        own_loop: asyncio.AbstractEventLoop | None = None

        async def serve(self) -> None:
            import zmq

            loop = self.own_loop = asyncio.get_running_loop()
            ctx: zmq.Context[Any] = zmq.Context.instance()
            router = _security.secure_server(
                configure(ctx.socket(zmq.ROUTER), data=True), None, bind
            )
            router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            router.bind(bind)
            os.chmod(bind[len("ipc://") :], 0o600)
            self.addr = bind
            self.router = AsyncSocket(router, loop, self._on_message, router=True, batch=True)
            up.set()
            await asyncio.Event().wait()  # serves as long as the client lives

        def _exit_for(self, exc: SystemExit, where: str) -> None:
            # The client is not a proc to exit: the call failed, the actor goes on.
            log.error("%s raised SystemExit(%r) in the client's own proc", where, exc.code)

    server = ClientProcServer(ProcEnv(mesh=name, rank=0, generation=1, host=host))

    def run() -> None:
        try:
            asyncio.run(server.serve())
        except BaseException as exc:  # reported to the caller below
            failed.append(exc)
            up.set()

    threading.Thread(target=run, name="zmesh-this-proc", daemon=True).start()
    if not up.wait(10.0) or failed:
        why = repr(failed[0]) if failed else "it did not start within 10s"
        raise SpawnError(f"the client's own proc cannot serve: {why}", mesh=name)
    # After zmesh's own exit hook (atexit runs the last registered first), so
    # the runtime still serves the calls a cleanup makes.
    atexit.register(_clean_up_at_exit, server)
    ref = ProcRef(name, 0, 1, bind, "", host)
    return ProcMesh(name, Shape({}, [0]), [ref])


def _clean_up_at_exit(server: Any) -> None:
    """Run the ``__cleanup__`` of the actors still in the client's own proc (at exit).

    Sync ones run in this (the exiting) thread, as the actor: no worker
    thread can be started now. ``async def`` ones run on the proc's loop,
    within the cleanup budget.
    """

    loop = server.own_loop
    boxes = list(server.actors.values())
    if loop is None or loop.is_closed() or not boxes:
        return
    for box in boxes:
        _lifecycle.cleanup_here(box, loop)

    async def clean() -> None:  # what is left: the async ones
        await _lifecycle.cleanup_all(boxes, None)

    try:
        done = asyncio.run_coroutine_threadsafe(clean(), loop)
        done.result(_lifecycle.CLEANUP_BUDGET + 0.5)
    except Exception as exc:  # the client exits either way
        log.warning("the cleanups of the client's own actors did not finish: %r", exc)
