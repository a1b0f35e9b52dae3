"""The answers of tree fan-outs: what comes back through relays, and what fails.

A host's part of a fan-out is a ``Carrier``: the future of a request on its
relay's connection (``RelayRequest``). ``Answers`` (the base of
``zmesh._client.calls.tree.Tree``) settles the targets' answers from the relay's
``RelayReply`` messages, from supervision (``broken``) and from the relay's
failure (``relay_failed``), and releases the direct messages that waited
for the relay's acknowledgements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zmesh._client.calls.connections import DISCONNECT_GRACE
from zmesh._client.calls.grouping import Parts
from zmesh._client.calls.inflight import OneRequest, outcome, timeout_error
from zmesh._errors import (
    ActorError,
    CallTimeoutError,
    ConnectionLostError,
    EncodeError,
    ZmeshError,
)
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from collections.abc import Callable

    from zmesh._client.calls.connections import ProcConn
    from zmesh._client.calls.runtime import ProcRef, Runtime
    from zmesh._wire.codec import Codec

    Deliver = Callable[[int, bool, Any], None]


class RelayRequest(OneRequest):
    """A ``Relay`` in flight on its relay's connection (its future is a ``Carrier``)."""

    __slots__ = ()


def direct_in_flight(c: ProcConn) -> bool:
    """Whether ``c`` has direct messages (not relays') sent and unanswered, or waiting."""
    if c.pending and any(type(q) is not RelayRequest for q in c.pending.values()):
        return True
    return any(type(q) is not RelayRequest for _, q, _ in c.waiting)


class Carrier:
    """One host's part of a tree fan-out, in flight on its relay's connection.

    It stands as the future of a ``OneRequest`` on that connection, so the
    connection's failures, timeout and release reach it as they reach any
    call (``set_exception``), and the relay's messages come to ``on_message``.
    """

    __slots__ = (
        "deliver", "folder", "index", "open", "refs", "relay", "req", "timeout", "tree", "unacked",
    )  # fmt: skip

    def __init__(
        self, tree: Answers, relay: ProcRef, refs: list[ProcRef], index: list[int],
        deliver: Deliver | None, timeout: float | None,
    ) -> None:  # fmt: skip
        self.tree = tree
        self.relay = relay
        self.refs = refs  # the targets on this host
        self.index = index  # their places in the fan-out
        self.deliver = deliver
        self.timeout = timeout
        self.open: set[int] = set(range(len(refs))) if deliver is not None else set()
        # Targets whose forwarding the relay has not acknowledged (see Tree.defer).
        self.unacked: set[int] = set(range(len(refs)))
        self.req: OneRequest | None = None
        # A reducing fan-out's: takes ``(ok, value)`` of a relay's folded value.
        self.folder: Callable[[bool, Any], None] | None = None

    # The part of a future the runtime uses (zmesh._client.calls.inflight.Sink).

    def done(self) -> bool:
        return not self.open and not self.unacked

    def cancelled(self) -> bool:
        return False

    def set_result(self, value: Any) -> None:  # a relay answers with RelayReply, never Reply
        self.set_exception(EncodeError(f"unexpected answer from the relay: {value!r}"))

    def set_exception(self, error: BaseException) -> None:
        """The relay's connection failed this part (relay died, dropped, timed out, ...)."""
        self.tree.relay_failed(self, error)

    def on_message(self, conn: ProcConn, req: OneRequest, msg: Any, frames: list[Any]) -> None:
        self.tree.on_relay_reply(self, conn, req, msg, frames)

    def settle(self, k: int, ok: bool, value: Any) -> None:
        """Deliver target ``k``'s answer, once."""
        if k in self.open:
            self.open.discard(k)
            self.tree.untrack(self, k)
            assert self.deliver is not None
            self.deliver(self.index[k], ok, value)
            self._maybe_done()

    def _maybe_done(self) -> None:
        """Done (every target answered or failed, and forwarded or broken): let go.

        What the relay still sends for it (a target supervision failed may
        answer after all) finds no request and is dropped.
        """
        req = self.req
        if not self.done() or req is None:
            return
        if req.timer is not None:
            req.timer.cancel()
        if req.conn.pending.get(req.id) is req:
            del req.conn.pending[req.id]
            req.conn.bytes -= req.size
            req.size = 0


class Answers:
    """The answer side of ``Tree``: relays' replies, supervision, relay failures."""

    if TYPE_CHECKING:
        rt: Runtime
        relays: dict[tuple[str, str], ProcRef]
        by_addr: dict[str, set[Carrier]]
        unacked: dict[str, int]
        _answers: int
        _folded: int

        def _run_queue(self) -> None: ...

    def on_relay_reply(
        self, carrier: Carrier, conn: ProcConn, req: OneRequest, msg: Any, frames: list[Any]
    ) -> None:
        if type(msg) is not w.RelayReply:
            return
        req.size = 0  # its arguments have arrived
        if not msg.done:
            conn.pending[msg.id] = req  # more comes for it (unless it is done: below)
        if msg.forwarded and carrier.unacked:
            self._release_targets(carrier)
        elif msg.acked:  # a part of the tree acknowledged before the rest
            ks = [k for k in msg.acked if k in carrier.unacked]
            self._release_targets(carrier, ks)
        pos = 1
        codec = self.rt.codec
        if msg.reduced:  # the relay folded these targets' values into one
            self._on_folded(carrier, msg, frames)
        for k, answer, nbuf in zip(msg.index, msg.answers, msg.nbufs, strict=False):
            if 0 <= k < len(carrier.refs):
                # The proc's own message, as it sent it: its frames numbered from 1.
                sub = [answer, *frames[pos : pos + nbuf]] if nbuf else [answer]
                self._answers += 1
                carrier.settle(k, *_read(codec, sub, carrier.refs[k]))
            pos += nbuf
        for k in msg.lost:
            if 0 <= k < len(carrier.refs) and k in carrier.open:
                self.rt.loop.call_later(DISCONNECT_GRACE, self._lost, carrier, k)
        if msg.done and carrier.open:
            # The relay is done, but some answers never came (garbled): fail them.
            for k in list(carrier.open):
                self.rt.loop.call_later(DISCONNECT_GRACE, self._lost, carrier, k)
        carrier._maybe_done()

    def _on_folded(self, carrier: Carrier, msg: w.RelayReply, frames: list[Any]) -> None:
        """The folded value (index -1) goes to the folder, then its targets
        settle as ``FOLDED`` (so the caller counts them, but once)."""
        if -1 not in msg.index:
            return
        at = msg.index.index(-1)
        if at >= len(msg.answers) or at >= len(msg.nbufs):
            return
        pos = 1 + sum(msg.nbufs[:at])
        nbuf = msg.nbufs[at]
        sub = [msg.answers[at], *frames[pos : pos + nbuf]]
        ks = [k for k in msg.reduced if 0 <= k < len(carrier.refs) and k in carrier.open]
        if not ks:
            return
        self._folded += 1
        ok, value = _read(self.rt.codec, sub, carrier.refs[ks[0]])
        if not ok and isinstance(value, ActorError) and value.endpoint == "combine":
            value = value.cause or value  # the caller's own combine raised: as itself
        if carrier.folder is not None:
            carrier.folder(ok, value)
        for k in ks:
            carrier.settle(k, True, FOLDED)

    def _lost(self, carrier: Carrier, k: int) -> None:
        ref = carrier.refs[k]
        carrier.settle(k, False, ConnectionLostError(
            "the relay's connection to the proc dropped with this call on it: "
            "it may or may not have run",
            reason="connection lost", mesh=ref.mesh, rank=ref.rank, host=ref.host,
            log_path=ref.log_path or None,
        ))  # fmt: skip

    def _release_targets(self, carrier: Carrier, ks: list[int] | None = None) -> None:
        """The relay forwarded to ``carrier``'s targets ``ks`` (default: all left)."""
        ks = sorted(carrier.unacked) if ks is None else ks
        carrier.unacked.difference_update(ks)
        for k in ks:
            self.untrack(carrier, k)
        self._release_unacked([carrier.refs[k].addr for k in ks])

    def _release_unacked(self, addrs: list[str]) -> None:
        count(self.unacked, addrs, -1)
        count(self.rt.held, addrs, -1)
        self._run_queue()

    def untrack(self, carrier: Carrier, k: int) -> None:
        if k in carrier.open or k in carrier.unacked:
            return  # still waits for something
        addr = carrier.refs[k].addr
        parts = self.by_addr.get(addr)
        if parts is not None:
            parts.discard(carrier)
            if not parts:
                del self.by_addr[addr]

    def relay_failed(self, carrier: Carrier, error: BaseException) -> None:
        """The relay's connection failed ``carrier``: so do its targets not answered yet."""
        relay = carrier.relay
        for k in sorted(carrier.open):
            ref = carrier.refs[k]
            carrier.settle(k, False, _for_target(error, relay, ref, carrier.timeout))
        if carrier.unacked:
            self._release_targets(carrier)
        if isinstance(error, ZmeshError) and self.relays.get((relay.mesh, relay.agent)) == relay:
            del self.relays[(relay.mesh, relay.agent)]  # the next fan-out picks another

    def broken(self, addr: str, error: ZmeshError, mesh: str | None) -> None:
        """Supervision says the proc at ``addr`` broke: its parts' answers fail now,
        and nothing waits any more for it to be forwarded to."""
        for key, relay in list(self.relays.items()):
            if relay.addr == addr:  # the next fan-out picks another relay there
                del self.relays[key]
        parts = self.by_addr.get(addr)
        if not parts:
            return
        for carrier in list(parts):
            ks = [k for k, r in enumerate(carrier.refs) if r.addr == addr]
            ks = [k for k in ks if mesh is None or carrier.refs[k].mesh == mesh]
            for k in ks:
                if k in carrier.open:
                    carrier.settle(k, False, error)
            self._release_targets(carrier, [k for k in ks if k in carrier.unacked])
            carrier._maybe_done()


class _Folded:
    """The answer of a target whose value a relay folded into another's (``FOLDED``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "FOLDED"


FOLDED = _Folded()


def _read(codec: Codec, frames: list[Any], ref: ProcRef) -> tuple[bool, Any]:
    """``(ok, value)`` of a target's answer (``frames``: as its proc sent them)."""
    try:
        msg = codec.decode(frames)
    except Exception as exc:
        return False, EncodeError(f"cannot decode the relayed reply: {exc!r}", mesh=ref.mesh,
                                  rank=ref.rank, host=ref.host)  # fmt: skip
    if type(msg) is w.Gathered or type(msg) is w.GatheredFrames:
        return True, Parts(msg, frames)  # several actors' answers (zmesh._client.calls.grouping)
    return outcome(codec, msg, frames, ref)


def count(counts: dict[str, int], addrs: list[str], step: int) -> None:
    """Add ``step`` to each address's count; a count that reaches 0 is removed."""
    for a in addrs:
        n = counts.get(a, 0) + step
        if n > 0:
            counts[a] = n
        else:
            counts.pop(a, None)


def _for_target(error: BaseException, relay: ProcRef, ref: ProcRef, timeout: float | None) -> Any:
    """The error for ``ref``'s call when its relay's request failed with ``error``."""
    if ref.addr == relay.addr or not isinstance(error, ZmeshError):
        return error
    if isinstance(error, CallTimeoutError):
        return timeout_error(ref, timeout if timeout is not None else 0.0)
    ctx: dict[str, Any] = {
        "mesh": ref.mesh, "rank": ref.rank, "host": ref.host, "log_path": ref.log_path or None,
    }  # fmt: skip
    err = ConnectionLostError(
        f"the relay of host {relay.host} (rank {relay.rank}) failed with this call on it: "
        f"{error.message}; it may or may not have run",
        reason="relay lost", **ctx,
    )  # fmt: skip
    err.__cause__ = error
    return err
