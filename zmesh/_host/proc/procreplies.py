"""How a proc answers a call that failed, and exits when an endpoint raises ``SystemExit``.

A part of ``ProcServer`` (``proc.py``): every ``Failure`` a proc sends is
built here (an endpoint's exception, with its traceback and, when it can
travel, the exception itself), and ``sys.exit`` in an endpoint ends the
proc once its caller has its answer and its actors' ``__cleanup__`` ran.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import traceback
from typing import TYPE_CHECKING, Any

import zmq

from zmesh._host.proc import lifecycle as _lifecycle
from zmesh._wire import excpickle as _excpickle
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._host.proc.mailbox import Mailbox
    from zmesh._wire.boundary import ProcEnv
    from zmesh._wire.codec import Codec
    from zmesh._wire.zsock import AsyncSocket

log = logging.getLogger("zmesh.proc")


class ProcReplies:
    """Failures sent back, and the proc's own exit."""

    if TYPE_CHECKING:  # the ProcServer's, which this is a part of
        spec: ProcEnv
        mesh: str
        host: str
        codec: Codec
        router: AsyncSocket
        agent: AsyncSocket
        actors: dict[str, Mailbox]
        spawning: set[asyncio.Task[None]]

    def _where(self) -> dict[str, Any]:
        """This proc, as an error's context names it."""
        return {"mesh": self.mesh, "host": self.host, "log_path": self.spec.log_path or None}

    def _stopped(self, box: Mailbox, ident: bytes, call: w.Call) -> None:
        """``call`` was running when its actor was stopped: its caller learns so now
        (``ActorStoppedError``) rather than waiting for an answer that will never come."""
        if box.stopped and (ident, call.id) not in box.told:
            self.fail(ident, call, "stopped", "ActorStopped", f"actor {box.name} stopped")

    def fail(self, ident: bytes, call: w.Call, kind: str, type_name: str, message: str) -> None:
        if call.oneway:
            return
        f = w.Failure(call.id, kind, type_name, message, endpoint=call.method)
        self.router.send([ident, *self.codec.encode(f)])

    def _exit_for(self, exc: SystemExit, where: str) -> None:
        """``where`` raised ``SystemExit``: the proc exits as ``sys.exit`` asked.

        Its caller has its answer (``ActorError``); the agent then sees the
        proc exit unasked, so the owner sees the rank fail (``SupervisionError``,
        "exited with code N"), and every later call to it fails the same way.
        """
        code = _lifecycle.exit_code(exc)
        log.error("%s raised SystemExit(%r): this proc exits with code %d", where, exc.code, code)
        task = asyncio.ensure_future(_lifecycle.cleanup_all(list(self.actors.values()), exc))
        task.add_done_callback(lambda _: self._exit_now(code))
        self.spawning.add(task)

    def _exit_now(self, code: int) -> None:
        self.router.close()
        self.agent.close()
        # The answer is queued in libzmq: term() returns once the lingering
        # sockets are flushed, or never while sockets of others are open, so
        # it gets a bounded wait in a thread of its own.
        term = threading.Thread(target=zmq.Context.instance().term, daemon=True)
        term.start()
        term.join(0.5)
        _lifecycle.exit_process(code)

    def _send_failure(self, ident: bytes, req: int, kind: str, exc: BaseException, ep: str) -> None:
        self.router.send([ident, *self.codec.encode(self.failure(req, kind, exc, ep))])

    @staticmethod
    def failure(req: int, kind: str, exc: BaseException, ep: str) -> w.Failure:
        """The ``Failure`` answering request ``req`` whose endpoint ``ep`` raised ``exc``."""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        blob = _excpickle.dumps(exc)  # None: it cannot come back, and is sent as text only
        qual = type(exc).__qualname__
        mod = type(exc).__module__
        name = qual if mod == "builtins" else f"{mod}.{qual}"
        return w.Failure(req, kind, name, str(exc), tb, blob, endpoint=ep)
