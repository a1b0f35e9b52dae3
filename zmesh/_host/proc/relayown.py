"""A relay's own part: the request for its own proc, run in its own process.

A host's relay is one of the mesh's procs there, and a fan-out usually
targets it too. Sending that part through a link to itself would cost a
socket round trip through libzmq and the proc's own ROUTER (a send, a
wake-up and a receive each way, and a probe when the link is made), so a
well-formed ``Call`` or ``GroupCall`` for the relay's own proc is decoded
here and put in its actors' mailboxes directly, as if it had arrived on the
ROUTER, and its answer is fed into the relay's gathering.

The answer is caught the way a group's parts are (``zmesh._host.proc.actors``):
the call's "identity" is a ``Slot`` whose gather is an ``OwnPart``, and the
proc's router, once intercepting, hands what is sent to it to the relay. So
the code that runs and answers the call (``ProcServer.handle``, batching,
``fail``, a ``GroupCall``'s ``Gathered``) is the one of the direct path: an
actor that raises or is missing answers with its ``Failure``, as ever.

The guarantees of ``zmesh._host.proc.relay`` hold:

* Order per sender: the call is in its mailbox before the relay handles
  the sender's next message (the next ``Relay``, or a direct message, which
  the sender sends only once this one is acknowledged), so nothing from
  that sender can overtake it; nothing is left to prove connected, so it
  is acknowledged at once.
* Security: only a target that passed the relay's checks (its own mesh,
  rank, generation and address as its agent knows them) and is this proc
  comes here.
* Anything else in the body (not decodable, another kind of message) goes
  through a link like any other target's, so the proc answers it as it
  would have.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import msgspec

from zmesh._host.proc import actors as _actors
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._host.proc.procserver import ProcServer
    from zmesh._host.proc.relay import RelayServer
    from zmesh._host.proc.relayback import Forward


class OwnPart:
    """Where the answer of the relay's own part of one ``Relay`` goes."""

    __slots__ = ("fwd", "k", "relay")

    def __init__(self, relay: RelayServer, fwd: Forward, k: int, oneway: bool) -> None:
        self.relay: RelayServer | None = None if oneway else relay  # (a oneway has no answer)
        self.fwd = fwd
        self.k = k  # the target's index in the Relay

    def put(self, index: int, frames: list[Any]) -> None:
        """The proc answered with ``frames`` (``[slot, envelope, *buffers]``)."""
        relay = self.relay
        if relay is None:
            return  # (answered once only)
        self.relay = None
        relay.own_answer(self.fwd, self.k, msgspec.Raw(frames[1]), list(frames[2:]))


def dispatch(relay: RelayServer, fwd: Forward, k: int, body: list[Any], oneway: bool) -> bool:
    """Run target ``k``'s request (``body``: envelope then buffers) in this proc.

    ``False``: ``body`` is not a single well-formed ``Call`` or ``GroupCall``
    (or this runs inside a task), and nothing was done: the caller sends it
    on a link instead.
    """
    if asyncio.current_task() is not None:
        # (Never, as the relay is driven: an actor's call starts as its
        # mailbox's task, which cannot be entered from inside another one.)
        return False
    server: ProcServer = relay.server
    try:
        msgs = server.codec.decode_frames(body)
    except Exception:  # the proc's own reading says what is wrong, through a link
        return False
    if len(msgs) != 1 or type(msgs[0]) not in (w.Call, w.GroupCall):
        return False
    msg = msgs[0]
    _actors.intercept(server.router)  # (once) what is sent to a Slot reaches its gather
    to: Any = _actors.Slot(OwnPart(relay, fwd, k, oneway), 0)
    try:
        server._dispatch(to, msg, body)
    except Exception as exc:  # as on the ROUTER: the call fails alone
        server._dispatch_failed(to, msg, exc)
    return True
