"""Reduction at a relay: its targets' values folded into one answer.

A reducing ``Relay`` (``reduce``: a pickled ``combine(a, b)``, from an
``Accumulator`` declared associative, ``zmesh._client.handles.accumulate``) asks the
relay to answer its targets' values as one: ``Fold`` folds each ``Reply`` as
it arrives (each actor's part of a ``Gathered`` too) and, once every target
has answered, the relay sends the folded value as the answer at index -1 of
its last ``RelayReply``, with ``reduced`` naming the targets it covers. A
top relay folds its lower relays' folded values the same way, so the sender
receives one value per top relay instead of one per actor.

What is not a value passes through as it came: a ``Failure`` (the caller
fails at once, as it would have), a ``Gathered`` with a failed part, a lost
target. The identity is not applied here: the caller folds each relay's
value into its own running value (``combine(acc, value)``), so the identity
counts once. If ``combine`` raises here, the folded answer is a ``Failure``
carrying the exception, which the caller raises as itself.
"""

from __future__ import annotations

import pickle
from typing import Any

import msgspec

from zmesh._wire import excpickle
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

# Decoded combines, by their pickle (the same Accumulator sends the same bytes).
_combines: dict[bytes, Any] = {}
MAX_COMBINES = 64


def combine_of(blob: bytes) -> Any:
    """The ``combine`` function pickled in ``blob`` (cached)."""
    fn = _combines.get(blob)
    if fn is None:
        if len(_combines) >= MAX_COMBINES:
            _combines.clear()
        fn = _combines[blob] = pickle.loads(blob)
    return fn


class Fold:
    """The running fold of one reducing ``Relay``."""

    __slots__ = ("codec", "combine", "covered", "error", "has", "value")

    def __init__(self, combine: Any, codec: Codec) -> None:
        self.combine = combine
        self.codec = codec  # decodes answers (the client's inbox)
        self.covered: list[int] = []  # the target indexes folded in
        self.has = False
        self.value: Any = None
        self.error: BaseException | None = None

    def add(self, value: Any) -> None:
        if self.error is not None:
            return
        if not self.has:
            self.value, self.has = value, True
            return
        try:
            self.value = self.combine(self.value, value)
        except Exception as exc:  # the caller's function: its error travels back
            self.error = exc

    def take(self, k: int, raw: msgspec.Raw, bufs: list[Any]) -> bool:
        """Fold target ``k``'s answer if it is all values; ``False``: pass it on."""
        frames = [raw, *bufs]
        try:
            msg = self.codec.decode(frames)
            values = _values(self.codec, msg, frames)
        except Exception:  # not decodable here: the caller says what is wrong
            return False
        if values is None:
            return False
        for v in values:
            self.add(v)
        self.covered.append(k)
        return True

    def take_folded(self, ks: list[int], raw: msgspec.Raw, bufs: list[Any]) -> bool:
        """Fold a lower relay's folded answer of targets ``ks`` (our indexes)."""
        frames = [raw, *bufs]
        try:
            msg = self.codec.decode(frames)
        except Exception:
            return False
        if type(msg) is w.Failure:  # combine raised down there
            if self.error is None:
                self.error = _exception_of(msg)
        else:
            values = _values(self.codec, msg, frames)
            if values is None:
                return False
            for v in values:
                self.add(v)
        self.covered.extend(ks)
        return True

    def answer(self, req_id: int) -> tuple[msgspec.Raw, list[Any]]:
        """The folded value as an encoded answer (and its buffer frames)."""
        if self.error is not None:
            exc = self.error
            f = w.Failure(req_id, "actor", type(exc).__name__, str(exc), "",
                          excpickle.dumps(exc), "combine")  # fmt: skip
            return msgspec.Raw(msgspec.msgpack.encode(f)), []
        payload, bufs = Codec.pack_value(self.value)
        env = self.codec.encode(w.Reply(req_id, payload), bufs)
        return msgspec.Raw(env[0]), env[1:]


def _values(codec: Codec, msg: Any, frames: list[Any]) -> list[Any] | None:
    """The values in an answer, or ``None`` if any part of it failed."""
    if type(msg) is w.Reply:
        return [codec.unpack_value(msg.payload, frames)]
    if type(msg) is w.Gathered:
        out = []
        for part in msg.parts:
            if type(part) is not w.Reply:
                return None
            out.append(codec.unpack_value(part.payload, frames[:1]))
        return out
    if type(msg) is w.GatheredFrames:
        out, at = [], 1
        for raw, n in zip(msg.parts, msg.nbufs, strict=False):
            sub = [raw, *frames[at : at + n]]
            at += n
            part = codec.decode(sub)
            if type(part) is not w.Reply:
                return None
            out.append(codec.unpack_value(part.payload, sub))
        return out
    return None


def _exception_of(f: w.Failure) -> BaseException:
    if f.exc is not None:
        try:
            exc = pickle.loads(f.exc)
            if isinstance(exc, BaseException):
                return exc
        except Exception:
            pass
    return RuntimeError(f"{f.type}: {f.message}")
