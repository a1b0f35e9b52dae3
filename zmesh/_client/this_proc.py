"""``this_proc()``: the calling process as a one-proc ``ProcMesh``.

Inside an actor it is the actor's own proc. In a client it is the client
itself: the first call starts a proc server (the same ``ProcServer`` a proc
runs, without an agent) on a thread and event loop of its own, bound to an
ipc:// socket in this user's private runtime directory, so actors spawned
there run in the client's memory and are called like any other. Such a
proc has no agent: nothing supervises it (it lives as long as the client),
``stop()`` on it stops its actors but never the process, and it can be
reached only from this host.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
from typing import Any

from zmesh._client.mesh import ProcMesh, _Shape
from zmesh._client.runtime import ProcRef

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
    from zmesh._context import own_proc

    ref = own_proc()
    if ref is not None:
        return ProcMesh(ref.mesh, _Shape({}, [ref.rank]), [ref])
    global _mine
    with _lock:
        if _mine is None:
            _mine = _start()
        return _mine


def _start() -> ProcMesh:
    from zmesh._errors import SpawnError
    from zmesh._host.proc import ProcServer
    from zmesh._shared import paths as _paths
    from zmesh._wire import security as _security
    from zmesh._wire.boundary import ProcEnv
    from zmesh._wire.zsock import AsyncSocket, configure

    name = f"client-{os.getpid()}-{secrets.token_hex(2)}"
    bind = f"ipc://{os.path.join(_paths.runtime_dir(), name)}.sock"
    host = socket.gethostname() or "local"
    up = threading.Event()
    failed: list[BaseException] = []

    class ClientProcServer(ProcServer):
        """A ``ProcServer`` without an agent: no hello, heartbeats or statistics."""

        async def serve(self) -> None:
            import zmq

            loop = asyncio.get_running_loop()
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
    ref = ProcRef(name, 0, 1, bind, "", host)
    return ProcMesh(name, _Shape({}, [0]), [ref])
