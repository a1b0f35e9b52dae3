"""A relay's answers on their way back: gathered per ``Relay``, sent as ``RelayReply``.

``zmesh._host.proc.relay`` forwards a tree fan-out's request and hands each
target's answer here (as the bytes its proc sent, ``msgspec.Raw``, or a
message of the relay's own). Answers that arrive in one turn of the loop
go back to the sender as one ``RelayReply``; a call whose other answers are
still to come waits up to ``ACK_LINGER`` for them, so a host's part mostly
goes back as one message (one wake-up of the sender, not one per loop
turn), and a dead or slow target never holds the others' answers longer
than that. A failure (and a target lost) goes back at once: the caller's
``call()`` fails at its first failure. A reducing ``Relay``'s values are folded here
(``zmesh._host.proc.relayfold``) and go back as one value once all are in.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

import msgspec

from zmesh._host.proc.relayfold import Fold
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._host.proc.procserver import ProcServer

log = logging.getLogger("zmesh.relay")

# Answers gathered into one RelayReply, at most (the rest go in the next).
MAX_ANSWERS = 256
# A call's answers and acknowledgements wait this long (s) for the rest of
# its answers: one message back to the sender when its targets answer
# within it (one wake-up of the sender instead of one per answer here), and
# never more than one per linger. A failure, a lost target and a oneway's
# acknowledgement go at once. (5 ms was too short on a loaded host: a host's
# answers spread over more, and each late one cost the sender a wake-up.)
# ``ZMESH_RELAY_LINGER`` (s) sets it per proc, read when its relay starts.
ACK_LINGER = 0.02


def _linger() -> float:
    """``ZMESH_RELAY_LINGER``, if it is a number of seconds from 0 to 10; else the default."""
    text = os.environ.get("ZMESH_RELAY_LINGER", "")
    if not text:
        return ACK_LINGER
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 10.0:  # (nan fails both)
        log.warning("ZMESH_RELAY_LINGER=%r is not seconds from 0 to 10: %s s is used",
                    text, ACK_LINGER)  # fmt: skip
        return ACK_LINGER
    return value


class _Kind(msgspec.Struct, array_like=True):
    """The first field of any message: its kind."""

    msg: str


_KIND = msgspec.msgpack.Decoder(_Kind)


def failed(answer: msgspec.Raw) -> bool:
    """Whether an answer as its proc sent it is a ``Failure`` (its caller fails at once)."""
    try:
        return _KIND.decode(answer).msg == "Failure"
    except Exception:  # not ours to judge: the caller decodes it
        return False


def raw(msg: Any) -> msgspec.Raw:
    """``msg`` encoded, as an answer a ``RelayReply`` carries."""
    return msgspec.Raw(msgspec.msgpack.encode(msg))


class Forward:
    """One ``Relay`` being served: who asked, and the answers not sent back yet."""

    __slots__ = (
        "acks", "fold", "forwarded", "hops", "id", "ident", "lingering", "local", "open", "out",
        "unproven", "urgent",
    )  # fmt: skip

    def __init__(self, ident: bytes, req_id: int, n: int) -> None:
        self.ident = ident
        self.id = req_id
        self.open = n  # targets not answered yet
        self.out: list[tuple[int, Any, list[Any]]] = []  # (target index, answer, buffers)
        self.forwarded = False  # acknowledged to the sender
        self.unproven = 0  # links it went on that have not proved themselves yet
        self.hops = 0  # relays below it that have not acknowledged yet
        self.local = 0  # its own host's targets (the first indexes)
        self.acks: list[int] = []  # targets acknowledged since the last RelayReply
        # What is here waits for the rest of the answers (ACK_LINGER): the
        # timer, cancelled when they are all in (else it would wake the loop).
        self.lingering: asyncio.TimerHandle | None = None
        self.fold: Fold | None = None  # a reducing Relay's running value (relayfold)
        self.urgent = False  # a failure or a lost target is here: no linger


class Answers:
    """A relay's way back to its senders: what each ``Forward`` has, sent in few messages."""

    def __init__(self, server: ProcServer, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop
        self._flush_due: set[Forward] = set()
        self.linger = _linger()

    def answer(self, fwd: Forward, k: int, answer: Any, bufs: list[Any]) -> None:
        """Target ``k``'s answer: as its proc sent it, or a message of ours."""
        if type(answer) is not msgspec.Raw:
            answer = raw(answer)
            fwd.urgent = True  # (a relay's own answer is a refusal)
        elif fwd.fold is not None and fwd.fold.take(k, answer, bufs):
            fwd.open -= 1  # folded: it goes back with the others, once all are in
            if fwd.open <= 0:
                self.schedule(fwd)
            return
        elif failed(answer):
            fwd.urgent = True
        fwd.open -= 1
        fwd.out.append((k, answer, bufs))
        self.schedule(fwd)

    def acknowledge(self, fwd: Forward) -> None:
        """Everything of ``fwd`` is on its way: the sender may send directly again."""
        fwd.forwarded = True
        self.schedule(fwd)

    def schedule(self, fwd: Forward) -> None:
        """Send what ``fwd`` has at the end of this loop turn (or after its linger)."""
        # Answers that arrive in the same loop turn go back as one message.
        if not self._flush_due:
            self.loop.call_soon(self._flush)
        self._flush_due.add(fwd)

    def _flush(self) -> None:
        due, self._flush_due = self._flush_due, set()
        for fwd in due:
            # A failure goes at once (unless its linger ran first and sent it).
            urgent, fwd.urgent = fwd.urgent and bool(fwd.out or fwd.acks), False
            if fwd.open > 0 and not urgent:  # answers to come: what is here waits for them
                if fwd.lingering is None:
                    fwd.lingering = self.loop.call_later(self.linger, self._linger_over, fwd)
                continue
            if fwd.lingering is not None:  # all in (or sent now): its timer has nothing to do
                fwd.lingering.cancel()
                fwd.lingering = None
            self._send_all(fwd)

    def _send_all(self, fwd: Forward) -> None:
        """Send back what ``fwd`` has: its answers, folded value, acknowledgements."""
        # Each answer's buffer frames are numbered within its own
        # (envelope, frames), so answers with frames travel together too.
        gathered, fwd.out = fwd.out, []
        reduced: list[int] = []
        fold = fwd.fold
        if fold is not None and fwd.open <= 0 and fold.covered:  # all in: the folded value
            value, bufs = fold.answer(fwd.id)
            reduced, fold.covered = fold.covered, []
            gathered.append((-1, value, bufs))
        while True:
            out, gathered = gathered[:MAX_ANSWERS], gathered[MAX_ANSWERS:]
            last = not gathered
            self._send_back(fwd, out, done=last and fwd.open <= 0 and fwd.forwarded,
                            reduced=reduced if last else [])  # fmt: skip
            if last:
                break

    def _linger_over(self, fwd: Forward) -> None:
        fwd.lingering = None
        if fwd.open > 0 and (fwd.out or fwd.acks):  # the rest is late: send what is here
            self._send_all(fwd)

    def _send_back(
        self, fwd: Forward, out: list[tuple[int, Any, list[Any]]], done: bool,
        reduced: list[int] | None = None,
    ) -> None:  # fmt: skip
        index, answers, nbufs, lost, frames = [], [], [], [], []
        for k, answer, bufs in out:
            if answer is None:
                lost.append(k)
                continue
            index.append(k)
            answers.append(answer)
            nbufs.append(len(bufs))
            frames.extend(bufs)
        acks, fwd.acks = fwd.acks, []
        red = reduced if reduced and -1 in index else []
        msg = w.RelayReply(fwd.id, index, answers, nbufs, lost, fwd.forwarded, done, acks, red)
        try:
            env = self.server.codec.encode(msg, frames)
        except Exception as exc:  # too big together: each answer alone
            if len(out) > 1:
                for one in out:
                    self._send_back(fwd, [one], done=False, reduced=reduced)
                if done:
                    self._send_back(fwd, [], done=True)
                return
            log.error("an answer cannot be relayed: %r", exc)
            k = out[0][0]
            f = w.Failure(
                fwd.id, "encode", type(exc).__name__, f"the answer cannot be relayed: {exc}"
            )
            env = self.server.codec.encode(
                w.RelayReply(fwd.id, [k], [raw(f)], [0], [], fwd.forwarded, done)
            )
        self.server.router.send([fwd.ident, *env])
