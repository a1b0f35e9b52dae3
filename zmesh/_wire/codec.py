"""The payload codec: user values in and out of wire messages, and batches.

A message travels as ZeroMQ frames ``[envelope, *buffers]``. User values
(arguments and return values) are carried in two ways:

* *plain*: when every top-level value is a scalar msgpack carries exactly
  (``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``), they go in the
  envelope; large ``bytes``/``bytearray``/``memoryview`` values become extra
  frames referenced by an msgpack ``Ext`` instead of being copied into it.
* *pickled*: anything else (containers, user classes, exceptions, arrays) is
  pickled with protocol 5 (classes and functions of ``__main__`` by value,
  see ``zmesh._wire.pickling``); out-of-band buffers (numpy arrays, bytearrays)
  travel as extra frames without a copy.

Pickle keeps Python values exact (a tuple stays a tuple), which is what a
user of Ray or Monarch expects; the plain path makes the common small call
cheap.

A *batch* is one frame that carries several envelopes: ``BATCH_MARK``, then a
msgpack array header, then the envelopes back to back, so the bytes after
the mark are one msgpack array of messages (``encode_batch``). The sockets
make batches (``zmesh._wire.zsock``); receivers read a frame with
``Codec.decode_frames``, which tells a batch from a single message.
"""

from __future__ import annotations

import os
import pickle
import re
from typing import Any

import msgspec
import zmq

from zmesh._errors import EncodeError
from zmesh._wire import pickling
from zmesh._wire.messages import KINDS, Payload
from zmesh._wire.names import NAME_PATTERN, NAME_RULE

# Values at or above this size travel as their own ZeroMQ frame.
BIG_BUFFER = 64 * 1024
# One frame, at most; a larger one makes the receiver drop the connection
# (the sockets' MAXMSGSIZE), so ``Codec.encode`` refuses it first.
MAX_MSG_SIZE = int(os.environ.get("ZMESH_MAX_MSG_SIZE", str(1 << 31)))
# The first byte of a batch frame: one msgpack never uses.
BATCH_MARK = 0xC1
_MARK = bytes((BATCH_MARK,))

_EXT_BYTES = 1
_EXT_BYTEARRAY = 2
_EXT_MEMORYVIEW = 3
_BUF_EXTS: dict[Any, int] = {
    bytes: _EXT_BYTES,
    bytearray: _EXT_BYTEARRAY,
    memoryview: _EXT_MEMORYVIEW,
}
_SCALARS = (type(None), bool, int, float, str)
_INLINE = frozenset(_SCALARS)  # types that always stay in the envelope as they are


class Codec:
    """Encode messages to frames and decode frames to messages.

    One codec per thread and per socket kind; not thread-safe (it keeps the
    frames of the message being handled for ``ext_hook``).

    Args:
        inbox: the union of message types this codec decodes.
        allow_pickle: whether pickled values may be decoded (only from
            authenticated peers).
    """

    def __init__(self, inbox: Any, *, allow_pickle: bool = True, keep_ext: bool = False) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        # keep_ext: references to buffer frames stay ``msgspec.msgpack.Ext``, so a
        # relay passes a message on with its frames, unchanged (zmesh._host.proc.relay).
        hook = _keep_ext if keep_ext else self._ext_hook
        self._decoder = msgspec.msgpack.Decoder(inbox, ext_hook=hook)
        # A batch carries no buffer frames, so an Ext in it fails to decode,
        # as a malformed message should.
        self._batch_decoder = msgspec.msgpack.Decoder(list[inbox], ext_hook=_no_ext)
        self._frames: list[Any] = []
        self.allow_pickle = allow_pickle
        # An envelope of a message that came with no buffer frames (and is
        # no batch), decoded with no wrapper call: the sync path's reply.
        self.decode_envelope = self._decoder.decode
        # A message with no buffers encoded with no wrapper call (the sync
        # path's call); the caller checks the size against MAX_MSG_SIZE.
        self.encode_envelope = self._encoder.encode

    # -- encoding

    def encode(self, msg: Any, buffers: list[Any] | None = None) -> list[Any]:
        """Return the frames of ``msg``: the envelope then ``buffers``.

        Raises:
            EncodeError: a frame is over ``zmesh._wire.codec.MAX_MSG_SIZE``. The
                receiver would drop the connection over it (and every other
                message on it), so it is refused here, before anything goes.
        """
        env = self._encoder.encode(msg)
        if len(env) > MAX_MSG_SIZE:
            raise _too_big(len(env), MAX_MSG_SIZE)
        if buffers:
            _check_parts(buffers)
            return [env, *buffers]
        return [env]

    @staticmethod
    def pack(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Payload, list[Any]]:
        """Turn user ``args``/``kwargs`` into a payload and out-of-band buffers.

        Raises:
            Exception: whatever pickle raises for a value it cannot carry; the
                caller wraps it in ``EncodeError``.
        """
        if not kwargs:
            # The common call: a few scalars or small bytes, which msgpack
            # carries exactly in the envelope, so the args tuple is the payload.
            for v in args:
                t = type(v)
                if t not in _INLINE and not (t is bytes and len(v) < BIG_BUFFER):
                    break
            else:
                return Payload(args=args), []
        buffers: list[Any] = []
        plain = True
        for v in args:
            if type(v) not in _SCALARS and type(v) not in _BUF_EXTS:
                plain = False
                break
        if plain:
            for v in kwargs.values():
                if type(v) not in _SCALARS and type(v) not in _BUF_EXTS:
                    plain = False
                    break
        if plain:
            a = tuple(_lift(v, buffers) for v in args) if args else ()
            kw = {k: _lift(v, buffers) for k, v in kwargs.items()} if kwargs else {}
            return Payload(args=a, kwargs=kw), buffers

        # By value for classes and functions of __main__ (see zmesh._wire.pickling).
        blob, buffers = pickling.dumps((args, kwargs), _small)
        return Payload(blob=blob, nbuf=len(buffers)), buffers

    @staticmethod
    def pack_value(value: Any) -> tuple[Payload, list[Any]]:
        """Like ``pack`` for a single return value."""
        if value is None:
            return NONE, []
        t = type(value)
        if t in _INLINE or (t is bytes and len(value) < BIG_BUFFER):
            return Payload(args=(value,)), []
        return Codec.pack((value,), {})

    # -- decoding

    def decode(self, frames: list[Any]) -> Any:
        """Decode the envelope in ``frames[0]``; buffers are in ``frames[1:]``.

        Raises:
            msgspec.DecodeError, msgspec.ValidationError, RecursionError: the
                receiver counts and drops the message.
        """
        if len(frames) == 1:
            # No buffer frames, so nothing for ext_hook to find (an Ext here
            # fails to decode, as a malformed message should).
            return self._decoder.decode(_buf(frames[0]))
        self._frames = frames
        try:
            return self._decoder.decode(_buf(frames[0]))
        finally:
            self._frames = []

    def decode_frames(self, frames: list[Any]) -> list[Any]:
        """The messages of a received message: one, or each of a batch, in order.

        A batch carries no buffer frames; a single message's are ``frames[1:]``.

        Raises:
            msgspec.DecodeError, msgspec.ValidationError, RecursionError: the
                receiver counts and drops the message (a batch: all of it).
        """
        env = frames[0]
        if env and env[0] == BATCH_MARK:
            return self._batch_decoder.decode(memoryview(env)[1:])
        return [self.decode(frames)]

    def decode_batch(self, frame: bytes) -> list[Any]:
        """Decode a batch frame (see ``encode_batch``): its messages, in order.

        Raises:
            msgspec.DecodeError, msgspec.ValidationError, RecursionError: the
                receiver counts and drops the whole batch.
        """
        return self._batch_decoder.decode(memoryview(frame)[1:])

    def unpack(self, payload: Payload, frames: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Return ``(args, kwargs)`` of a decoded payload."""
        if payload.blob is None:
            return payload.args, payload.kwargs
        if not self.allow_pickle:
            raise PermissionError("pickled values are not accepted from this peer")
        bufs = [_buf(f) for f in frames[1 : 1 + payload.nbuf]]
        args, kwargs = pickle.loads(payload.blob, buffers=bufs)
        return args, kwargs

    def unpack_value(self, payload: Payload, frames: list[Any]) -> Any:
        args, _ = self.unpack(payload, frames)
        return args[0]

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        index = int.from_bytes(data, "little")
        if not 0 < index < len(self._frames):
            raise ValueError(f"a value refers to frame {index}, of {len(self._frames)}")
        frame = self._frames[index]
        if code == _EXT_BYTES:
            return frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame)
        if code == _EXT_BYTEARRAY:
            return bytearray(_buf(frame))
        if code == _EXT_MEMORYVIEW:
            return _buf(frame)
        raise ValueError(f"unknown msgpack extension {code}")


def is_batch(envelope: Any) -> bool:
    """Whether a received envelope is a batch (``encode_batch``)."""
    return bool(envelope) and envelope[0] == BATCH_MARK


def encode_batch(envelopes: list[bytes]) -> bytes:
    """One frame carrying ``envelopes`` (two or more) in order; ``decode_frames`` reads it."""
    n = len(envelopes)
    # The msgpack array header: a fixarray below 16, else an array 16.
    head = bytes((BATCH_MARK, 0x90 | n)) if n < 16 else _MARK + b"\xdc" + n.to_bytes(2, "big")
    return head + b"".join(envelopes)


def request_of(envelope: Any, kinds: frozenset[str]) -> tuple[str, int] | None:
    """``(kind, id)`` of an envelope that failed to decode, if it is a request.

    Messages are msgpack arrays ``[kind, id, ...]``: a lenient look at the
    first two entries is enough to answer the sender with an error.
    """
    try:
        head = msgspec.msgpack.decode(_buf(envelope), type=list[Any])
    except Exception:  # not even that: nobody to answer
        return None
    if len(head) < 2 or type(head[0]) is not str or type(head[1]) is not int:
        return None
    return (head[0], head[1]) if head[0] in kinds else None


def explain(kind: str, exc: Exception) -> str:
    """A decode error of a ``kind`` message, in the words of its fields.

    msgspec names a field of an array-like message by its index (``$[2]``);
    this names it (``name``) and states the rule a name breaks.
    """
    text = str(exc)
    cls = KINDS.get(kind)
    m = re.search(r"\$\[(\d+)\]", text)
    if cls is not None and m is not None:
        i = int(m.group(1)) - 1  # [0] is the tag
        if 0 <= i < len(cls.__struct_fields__):
            field = cls.__struct_fields__[i]
            text = text[: m.start()] + field + text[m.end() :]
    text = text.replace(f"matching regex {NAME_PATTERN!r}", f"that is a name ({NAME_RULE})")
    return f"bad {kind}: {text}"


def nbytes(buf: Any) -> int:
    """The size in bytes of a frame (``bytes``, ``zmq.Frame`` or any buffer)."""
    if type(buf) is bytes:
        return len(buf)
    return memoryview(buf).nbytes


def check_size(payload: Payload, buffers: list[Any]) -> None:
    """Refuse user values with a part over ``zmesh._wire.codec.MAX_MSG_SIZE``.

    Raises:
        EncodeError: naming the part's size and the limit.
    """
    if payload.blob is not None and len(payload.blob) > MAX_MSG_SIZE:
        raise _too_big(len(payload.blob), MAX_MSG_SIZE)
    _check_parts(buffers)


def _check_parts(buffers: list[Any]) -> None:
    limit = MAX_MSG_SIZE
    for b in buffers:
        n = nbytes(b)
        if n > limit:
            raise _too_big(n, limit)


def _too_big(n: int, limit: int) -> EncodeError:
    return EncodeError(
        f"a message part of {n:,} bytes is over the limit of {limit:,} bytes per part "
        "(set with ZMESH_MAX_MSG_SIZE): split it into smaller values"
    )


def _keep_ext(code: int, data: memoryview) -> Any:
    return msgspec.msgpack.Ext(code, bytes(data))


def _no_ext(code: int, data: memoryview) -> Any:
    raise ValueError("a batched message cannot reference buffer frames")


def _lift(v: Any, buffers: list[Any]) -> Any:
    """Move a large top-level buffer out of the envelope into its own frame.

    Small ``bytes`` stay in the envelope. A ``bytearray`` or ``memoryview``
    always travels as a frame, whatever its size, so that it arrives as the
    same type (msgpack would turn it into ``bytes``).
    """
    code = _BUF_EXTS.get(type(v))
    if code is None or (code == _EXT_BYTES and len(v) < BIG_BUFFER):
        return v
    if code == _EXT_MEMORYVIEW and not v.c_contiguous:
        # A strided view (reversed, every other byte) has no one block of
        # memory to send: it travels as a copy of its bytes, in order.
        v = v.tobytes()
    # Frame indices count from 1: frame 0 is the envelope.
    buffers.append(v)
    return msgspec.msgpack.Ext(code, len(buffers).to_bytes(4, "little"))


def _buf(frame: Any) -> Any:
    """A zero-copy view of a received frame."""
    return frame.buffer if isinstance(frame, zmq.Frame) else frame


NONE = Payload(args=(None,))  # the payload of a ``None`` result


def _small(buf: pickle.PickleBuffer) -> bool:
    """Small buffers stay in the pickle; large ones travel as frames."""
    return buf.raw().nbytes < BIG_BUFFER
