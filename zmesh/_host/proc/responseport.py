"""Explicit response ports, the proc's half: every call gets its answer, or says why not.

An endpoint declared ``@endpoint(explicit_response_port=True)`` gets, as its
first argument, the port its caller waits on (``zmesh._client.ports.portcalls``),
and answers by sending on it, now or later. Its call is also answered as any
call is (so a raise, or a proc that dies, fails the caller), but that
answer carries no value. Three mistakes would leave the caller waiting for
ever; ``ProcServer.handle`` arms a ``Guard`` on the port so that none does:

* the endpoint **returns a value** instead of sending it (and has not sent):
  the call fails with ``ResponsePortError`` saying to send it on the port;
* the port is **dropped** (garbage collected) with nothing sent on it: the
  call fails with ``ResponsePortError`` at once when that happened before
  the endpoint returned; later (a port kept, then let go) the error goes
  through the port itself. Either way the proc's log says so too, since a
  caller may be gone;
* a **second answer** on the port raises ``ResponsePortError`` at the sender.

A port kept and never sent on (held for ever) is the caller's to bound: the
call's timeout covers the wait on the port, and without one the caller's
log says it is still waiting (``zmesh._client.ports.portcalls``).

A port handed on (pickled into a call to another actor, or copied) is no
longer guarded here: another process holds its answer now.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Any

from zmesh._actor import current_point
from zmesh._client.ports.channels import Port, _PortError
from zmesh._errors import ResponsePortError
from zmesh._wire.codec import Codec

if TYPE_CHECKING:
    from zmesh._actor import Endpoint

log = logging.getLogger("zmesh.proc")

_told: dict[str, int] = {}  # dropped ports logged, by endpoint


def _log_dropped(why: str, endpoint: str) -> None:
    """Log a dropped port: an endpoint's first, then one in a thousand (a flood stays small)."""
    n = _told[endpoint] = _told.get(endpoint, 0) + 1
    if n == 1 or n % 1000 == 0:
        log.error("%s; its caller gets ResponsePortError (%d so far)", why, n)


class Guard:
    """What a response port has done; the port tells it when it is gone (``Port.__del__``)."""

    __slots__ = (
        "addr", "context", "done", "dropped", "endpoint", "host", "key", "lock", "loop", "method",
        "number", "once", "rank", "sent", "tcp", "watched",
    )  # fmt: skip

    def __init__(self, port: Port[Any], cls: str, method: str, context: dict[str, Any]) -> None:
        # Where the port goes, without holding the port (its death is what we watch).
        self.addr, self.number, self.once = port.addr, port.number, port.once
        self.tcp, self.key, self.host = port.tcp, port.key, port.host
        self.endpoint = f"{cls}.{method}"  # for messages
        self.method = method  # for the error's ``endpoint``, as ``ActorError`` has it
        point = current_point()
        self.rank = point.rank if point is not None else -1
        self.context = {**context, "rank": self.rank}  # for the error: the actor's place
        self.loop = asyncio.get_running_loop()
        self.lock = threading.Lock()  # sends and drops may come from any thread
        self.sent = False
        self.done = False  # nothing more to watch: answered, handed on, or the caller told
        self.dropped = False
        self.watched = True  # the endpoint runs: a drop now is told by returned()

    def sending(self) -> None:
        """The port sends its answer (``Port.send``); a second one is refused."""
        with self.lock:
            if self.sent:
                raise ResponsePortError(
                    f"the response port of endpoint {self.endpoint!r} has sent its answer "
                    "already: a call gets one answer from each actor (open a Channel to send "
                    "more values)",
                    endpoint=self.method, mistake="sent twice", **self.context,
                )  # fmt: skip
            self.sent = self.done = True

    def handed_on(self) -> None:
        """The port was pickled (passed to another actor, or copied): the copy answers."""
        with self.lock:
            self.done = True

    def disarm(self, exc: BaseException | None) -> None:
        """The endpoint raised ``exc`` (``None``: the actor stops): that answers the call,
        unless the port did already."""
        with self.lock:
            sent, self.done, self.watched = self.sent, True, False
        if sent and exc is not None:  # its caller may have the port's value: the error goes nowhere
            log.error("endpoint %s raised after it answered on its response port",
                      self.endpoint, exc_info=exc)  # fmt: skip

    def returned(self, result: Any) -> tuple[str, str] | None:
        """The endpoint returned ``result``: ``(mistake, message)`` to fail the call, or None."""
        with self.lock:
            self.watched = False
            if self.sent:
                if result is not None:
                    log.warning(
                        "endpoint %s sent on its response port and returned %s: the return "
                        "value is ignored", self.endpoint, _short(result),
                    )  # fmt: skip
                return None
            if result is not None:
                self.done = True
                return "returned a value", (
                    f"endpoint {self.endpoint!r} has an explicit response port and returned "
                    f"{_short(result)}: send the value on the port (port.send(value)) instead"
                )
            if self.dropped:
                self.done = True
                why = (
                    f"endpoint {self.endpoint!r} returned without sending on its response "
                    "port and kept no reference to it: no answer can come"
                )
                _log_dropped(why, self.endpoint)
                return "dropped the port", why
            return None  # kept: it may answer later (a drop then goes through the port)

    def port_gone(self) -> None:
        """The port was garbage collected (in any thread: the error is sent from the loop)."""
        try:
            with self.lock:
                if self.done:
                    return
                self.dropped = True
                if self.watched:
                    return  # returned() tells the caller, in the call's own answer
                self.done = True
            why = (
                f"endpoint {self.endpoint!r} dropped its response port without sending on "
                "it: no answer can come"
            )
            _log_dropped(why, self.endpoint)
            err = ResponsePortError(
                why, endpoint=self.method, mistake="dropped the port", **self.context
            )
            port: Port[Any] = Port(self.addr, self.number, self.once, self.tcp, self.key, self.host)
            self.loop.call_soon_threadsafe(_send_error, port, err, self.rank)
        except Exception:  # (at exit the loop may be closed: nothing is left to tell)
            pass


def arm(port: Any, ep: Endpoint[Any, Any], cls: str, context: dict[str, Any]) -> Guard | None:
    """Guard ``port``, the first argument of a call of ``ep`` (an explicit port endpoint)."""
    if type(port) is not Port:
        return None  # (not a port: the endpoint's own error, if any, says so)
    guard = Guard(port, cls, ep.info.name, context)
    port.guard = guard
    return guard


def _send_error(port: Port[Any], err: ResponsePortError, rank: int) -> None:
    try:
        payload, buffers = Codec.pack_value(_PortError(err))
        port._send(payload, buffers, rank)
    except Exception:
        log.exception("cannot tell the caller of %s that its response port was dropped",
                      err.endpoint)  # fmt: skip


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
