"""Wire messages and the payload codec.

Every message is a ``msgspec`` tagged, frozen ``Struct`` encoded as msgpack.
Each socket decodes with one decoder over the union of what it may receive
(``PROC_INBOX``, ``CLIENT_INBOX``, ...). Anything that fails to decode is
counted by the receiver and dropped, never fatal.

A message travels as ZeroMQ frames ``[envelope, *buffers]``. User values
(arguments and return values) are carried in two ways:

* *plain*: when every top-level value is a scalar msgpack carries exactly
  (``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``), they go in the
  envelope; large ``bytes``/``bytearray``/``memoryview`` values become extra
  frames referenced by an msgpack ``Ext`` instead of being copied into it.
* *pickled*: anything else (containers, user classes, exceptions, arrays) is
  pickled with protocol 5; out-of-band buffers (numpy arrays, bytearrays)
  travel as extra frames without a copy.

Pickle keeps Python values exact (a tuple stays a tuple), which is what a
user of Ray or Monarch expects; the plain path makes the common small call
cheap.
"""

from __future__ import annotations

import pickle
import re
from typing import Annotated, Any

import msgspec
import zmq

from zmesh import _zsock
from zmesh._errors import EncodeError
from zmesh._stats import HostStatistics, ProcStatistics, ServiceSummary

# Values at or above this size travel as their own ZeroMQ frame.
BIG_BUFFER = 64 * 1024

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


class _Msg(msgspec.Struct, tag=True, tag_field="msg", frozen=True, array_like=True):
    pass


# ------------------------------------------------------ field constraints
#
# Every field of every message an agent or a proc receives is checked when
# it is decoded, so a handler only ever sees values of the right type and
# range (a message that fails is answered with an error, or dropped). Names
# end up in file names (a proc's log is ``<mesh>.<rank>.g<gen>.log``), so
# they are restricted to a safe set of characters, without "..".

NAME_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9_.-]{1,128}$"
_NAME_RE = re.compile(NAME_PATTERN)
NAME_RULE = "1-128 letters, digits, '_', '.' or '-', without '..'"
Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, description=NAME_RULE)]
# GetState's name may be empty: every mesh.
NameOrAll = Annotated[str, msgspec.Meta(pattern=r"^$|" + NAME_PATTERN)]
# Text that becomes a path, an argument or an environment entry: no NUL.
Text = Annotated[str, msgspec.Meta(pattern=r"^[^\x00]*$", max_length=4096)]
Id = Annotated[str, msgspec.Meta(pattern=r"^[^\x00]*$", min_length=1, max_length=256)]
EnvName = Annotated[str, msgspec.Meta(pattern=r"^[^=\x00]+$", max_length=1024)]
EnvValue = Annotated[str, msgspec.Meta(pattern=r"^[^\x00]*$", max_length=1 << 20)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Size = Annotated[int, msgspec.Meta(ge=1, le=1 << 20)]
RankNo = Annotated[int, msgspec.Meta(ge=0, lt=1 << 20)]
Dims = Annotated[dict[Name, Size], msgspec.Meta(max_length=16)]
MAX_RANKS_PER_HOST = 4096


def check_name(name: object, what: str, reserve: int = 0) -> str:
    """Return ``name`` if it is a safe name, else raise before anything is sent.

    Args:
        reserve: characters zmesh appends to it (a mesh gets ``-<8 hex>``).

    Raises:
        ValueError: ``name`` is not a ``str`` of 1-128 letters, digits,
            ``_``, ``.`` or ``-`` (and has no ``..``).
    """
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > 128 - reserve:
        rule = NAME_RULE if not reserve else NAME_RULE.replace("128", str(128 - reserve))
        raise ValueError(f"{what} {name!r} is not a valid name: use {rule}")
    return name


# --------------------------------------------------------------- payloads


class Payload(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """User values: plain ``args``/``kwargs`` or one pickle ``blob``."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    blob: bytes | None = None
    nbuf: Count = 0  # out-of-band pickle buffers, in frames after the envelope


# ------------------------------------------------------ client <-> proc


class Call(_Msg, frozen=True):
    """Run ``actor.method(*args, **kwargs)``; reply unless ``oneway``."""

    id: int
    actor: str
    method: str
    payload: Payload
    deadline: float = 0.0  # wall clock; 0 = none. The proc skips late requests.
    oneway: bool = False
    request: str = ""  # a service request id, the same across retries


class SpawnActor(_Msg, frozen=True):
    """Construct an actor in this proc."""

    id: int
    actor: Name
    cls: bytes  # pickled class, by reference
    payload: Payload
    mesh: Name
    dims: Dims
    rank: RankNo


class StopActor(_Msg, frozen=True):
    id: int
    actor: str


class Reply(_Msg, frozen=True):
    id: int
    payload: Payload


class Failure(_Msg, frozen=True):
    """A request failed at the proc.

    ``kind`` is one of ``actor`` (the endpoint raised), ``endpoint`` (unknown
    endpoint or bad arguments), ``encode`` (value cannot be sent), ``spawn``
    (``__init__`` raised), ``deadline`` (the request arrived too late),
    ``stopped`` (the actor is gone).
    """

    id: int
    kind: str
    type: str
    message: str
    traceback: str = ""
    exc: bytes | None = None  # the pickled exception, when it pickles
    endpoint: str = ""


# ------------------------------------------------------ client <-> agent


class MainSpec(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """How a proc re-creates the client's ``__main__`` (see ``zmesh._spawnprep``)."""

    sys_path: Annotated[list[Text], msgspec.Meta(max_length=4096)] = []
    dir: Text = ""  # the client's cwd: the proc's cwd
    init_main_from_name: Text = ""  # ``python -m pkg.mod``: import it by name
    init_main_from_path: Text = ""  # ``python script.py``: run it as __mp_main__


class ProcSpec(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """What an agent needs to start the procs of one host slice of a mesh."""

    owner: Id
    # Global ranks of this slice, one proc each (distinct: checked by the agent).
    ranks: Annotated[list[RankNo], msgspec.Meta(min_length=1, max_length=MAX_RANKS_PER_HOST)]
    dims: Dims
    host_index: Count = 0
    main: MainSpec = MainSpec()
    env: Annotated[dict[EnvName, EnvValue], msgspec.Meta(max_length=4096)] = {}


class CreateOrUpdate(_Msg, frozen=True):
    id: int
    name: Name
    spec: ProcSpec
    secret: Text = ""  # the owner's proof (see _local.owner_secret); never published


class GetState(_Msg, frozen=True):
    id: int
    name: NameOrAll = ""  # "" = every mesh


class Stop(_Msg, frozen=True):
    id: int
    name: Name
    secret: Text = ""  # only the mesh's owner may stop it


class ListMeshes(_Msg, frozen=True):
    id: int


class Describe(_Msg, frozen=True):
    """Ask an agent who it is and where its event stream is."""

    id: int


class AgentInfo(_Msg, frozen=True):
    id: int
    label: str
    control: str
    stream: str
    epoch: str
    pid: int
    hostname: str


class OwnerHeartbeat(_Msg, frozen=True):
    """The owner is alive. ``machine``/``pid``/``start`` let an agent on the
    same machine watch the owner process itself (see ``_liveness.watch_owner``)."""

    owner: Id
    machine: Text = ""  # boot id and pid namespace; "" = not watchable
    pid: Count = 0
    start: Count = 0  # the process's start time, in clock ticks after boot
    secret: Text = ""  # the owner's proof (see HostAgent._is_owner)


class OwnerGone(_Msg, frozen=True):
    """The owner is exiting: stop everything it owns now."""

    owner: Id
    secret: Text = ""


class RankState(msgspec.Struct, frozen=True, omit_defaults=True):
    rank: int
    status: str
    generation: int
    reason: str = ""
    pid: int = 0
    addr: str = ""
    log_path: str = ""
    exit_code: int | None = None


class MeshState(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    owner: str
    status: str
    ranks: list[RankState]
    dims: dict[str, int] = {}


class Ack(_Msg, frozen=True):
    id: int
    ok: bool = True
    error: str = ""
    denied: bool = False  # refused because the sender may not do it (not the owner)


class StateReply(_Msg, frozen=True):
    id: int
    agent: str
    epoch: str
    seq: int
    meshes: list[MeshState]


class GetStack(_Msg, frozen=True):
    """Ask an agent for the Python stack of every thread of one of its procs
    (``zmesh stack``); the agent answers within about a second."""

    id: int
    mesh: str
    rank: int


class StackReply(_Msg, frozen=True):
    id: int
    ok: bool = True
    text: str = ""  # faulthandler's dump, cut at a bound
    error: str = ""
    pid: int = 0
    truncated: bool = False


class GetHealth(_Msg, frozen=True):
    """Ask an agent what ``GetState`` does not say about its meshes (``zmesh status``)."""

    id: int


class HealthReply(_Msg, frozen=True):
    id: int
    # Meshes stopped on request: by their owner, or for their owner (it
    # exited, or went silent). A failed rank of such a mesh is history.
    stopped: list[str] = []


# -------------------------------------------------------- proc -> agent


class ProcHello(_Msg, frozen=True):
    mesh: Name
    rank: RankNo
    generation: Count
    addr: Text
    pid: Count


class ProcHeartbeat(_Msg, frozen=True):
    mesh: str  # looked up, never used in a path: no pattern on this frequent message
    rank: RankNo
    generation: Count


# ------------------------------------------------------- agent PUB stream


class Event(_Msg, frozen=True):
    """A rank transition, published on the agent's stream."""

    seq: int
    epoch: str
    agent: str
    mesh: str
    owner: str
    state: RankState
    time: float


class Heartbeat(_Msg, frozen=True):
    seq: int  # the last event sequence number, so a subscriber sees gaps
    epoch: str
    agent: str
    time: float


# ------------------------------------------------------------ statistics


class ProcStats(_Msg, frozen=True):
    """A proc's statistics, sent to its agent about once a second."""

    stats: ProcStatistics


class ServiceReport(_Msg, frozen=True):
    """A service's replica table, sent by its orchestrator to its agents
    about once a second, so that ``zmesh top`` can show it."""

    summary: ServiceSummary


class GetStats(_Msg, frozen=True):
    """Ask an agent for its latest ``Stats`` at once (a fresh observer)."""

    id: int


class Stats(_Msg, frozen=True):
    """An agent's host and procs, published about once a second.

    It goes on a stats stream of its own (its address is in ``StatsReply``),
    next to the event stream, so supervision subscribers never receive it.
    ``meshes`` is the agent's view (as ``GetState`` gives it), so one message
    is enough to draw the agent's part of a dashboard.
    """

    agent: str
    epoch: str
    seq: int
    time: float
    interval: float
    host: HostStatistics
    control: str = ""
    meshes: list[MeshState] = []
    procs: list[ProcStatistics] = []
    services: list[ServiceSummary] = []


class StatsReply(_Msg, frozen=True):
    id: int
    stats: Stats
    stream: str = ""  # where the agent publishes ``Stats`` about once a second


# Messages that carry a request id in their first field and expect an
# answer: one that fails to decode is answered with an error naming why.
AGENT_REQUESTS = frozenset(
    {"CreateOrUpdate", "GetState", "Stop", "ListMeshes", "Describe", "GetStats"}
)
PROC_REQUESTS = frozenset({"Call", "SpawnActor", "StopActor"})

PROC_INBOX: Any = Call | SpawnActor | StopActor
CLIENT_INBOX: Any = Reply | Failure
AGENT_INBOX: Any = (
    CreateOrUpdate
    | GetState
    | Stop
    | ListMeshes
    | Describe
    | OwnerHeartbeat
    | OwnerGone
    | ProcHello
    | ProcHeartbeat
    | ProcStats
    | ServiceReport
    | GetStats
    | GetStack
    | GetHealth
)
AGENT_REPLIES: Any = Ack | StateReply | AgentInfo | StatsReply | StackReply | HealthReply
STREAM: Any = Event | Heartbeat
# What an observer (``zmesh top``) decodes from an agent's two streams.
OBSERVER_STREAM: Any = Event | Heartbeat | Stats


# --------------------------------------------------------------- codec


class Codec:
    """Encode messages to frames and decode frames to messages.

    One codec per thread and per socket kind; not thread-safe (it keeps the
    frames of the message being handled for ``ext_hook``).

    Args:
        inbox: the union of message types this codec decodes.
        allow_pickle: whether pickled values may be decoded (only from
            authenticated peers).
    """

    def __init__(self, inbox: Any, *, allow_pickle: bool = True) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(inbox, ext_hook=self._ext_hook)
        # A batch carries no buffer frames, so an Ext in it fails to decode,
        # as a malformed message should.
        self._batch_decoder = msgspec.msgpack.Decoder(list[inbox], ext_hook=_no_ext)
        self._frames: list[Any] = []
        self.allow_pickle = allow_pickle

    # -- encoding

    def encode(self, msg: Any, buffers: list[Any] | None = None) -> list[Any]:
        """Return the frames of ``msg``: the envelope then ``buffers``.

        Raises:
            EncodeError: a frame is over ``zmesh._zsock.MAX_MSG_SIZE``. The
                receiver would drop the connection over it (and every other
                message on it), so it is refused here, before anything goes.
        """
        env = self._encoder.encode(msg)
        if len(env) > _zsock.MAX_MSG_SIZE:
            raise _too_big(len(env), _zsock.MAX_MSG_SIZE)
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

        def keep(buf: pickle.PickleBuffer) -> bool:
            # Small buffers stay in the pickle; large ones travel as frames.
            if buf.raw().nbytes < BIG_BUFFER:
                return True
            buffers.append(buf)
            return False

        blob = pickle.dumps((args, kwargs), protocol=5, buffer_callback=keep)
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

    def decode_batch(self, frame: bytes) -> list[Any]:
        """Decode a batch frame (see ``zmesh._zsock``): its messages, in order.

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
    cls = _KINDS.get(kind)
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
    """Refuse user values with a part over ``zmesh._zsock.MAX_MSG_SIZE``.

    Raises:
        EncodeError: naming the part's size and the limit.
    """
    if payload.blob is not None and len(payload.blob) > _zsock.MAX_MSG_SIZE:
        raise _too_big(len(payload.blob), _zsock.MAX_MSG_SIZE)
    _check_parts(buffers)


def _check_parts(buffers: list[Any]) -> None:
    limit = _zsock.MAX_MSG_SIZE
    for b in buffers:
        n = nbytes(b)
        if n > limit:
            raise _too_big(n, limit)


def _too_big(n: int, limit: int) -> EncodeError:
    return EncodeError(
        f"a message part of {n:,} bytes is over the limit of {limit:,} bytes per part "
        "(zmesh._zsock.MAX_MSG_SIZE, set with ZMESH_MAX_MSG_SIZE): split it into smaller values"
    )


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

# Message classes by tag, for ``explain``.
_KINDS: dict[str, type[msgspec.Struct]] = {c.__name__: c for c in _Msg.__subclasses__()}
