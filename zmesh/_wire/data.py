"""The data plane: requests and answers between callers and procs.

Calls and their replies, several actors per proc (one message per proc),
streams and their credit, port values, and the tree fan-out's relays.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from zmesh._wire.base import Message, Payload
from zmesh._wire.names import (
    MAX_RANKS_PER_HOST,
    Count,
    Dims,
    Name,
    RankNo,
    Text,
)

# ------------------------------------------------------ client <-> proc


class Call(Message, frozen=True):
    """Run ``actor.method(*args, **kwargs)``; reply unless ``oneway``."""

    id: int
    actor: str
    method: str
    payload: Payload
    # The caller's remaining budget in seconds (0: none), never a clock reading;
    # the proc keeps it as a deadline on its own clock (zmesh._wire.deadlines).
    deadline: float = 0.0
    oneway: bool = False
    request: str = ""  # a service request id, the same across retries
    # The sender's time.monotonic() when it sent this (0: not said), and which
    # clock that is (one per process): the proc tells time on the wire from
    # clock offsets with them (zmesh._wire.deadlines).
    sent: float = 0.0
    clock: int = 0


class SpawnActor(Message, frozen=True):
    """Construct an actor in this proc."""

    id: int
    actor: Name
    cls: bytes  # pickled class, by reference
    payload: Payload
    mesh: Name
    dims: Dims
    rank: RankNo
    # Several actors in this proc (``zmesh._host.proc.actors``): ``count`` of them,
    # ``actor#0`` .. ``actor#<count-1>``, answered with one ``Gathered``.
    # 0: one actor named ``actor`` (answered with a ``Reply``).
    count: Annotated[int, msgspec.Meta(ge=0, le=1 << 16)] = 0
    # The mesh's key (``zmesh._shared.ownership.mesh_key``): only its owner,
    # or an actor of the mesh itself, may spawn into a proc.
    proof: Text = ""


class StopActor(Message, frozen=True):
    """Stop actor ``actor`` of this proc: its mesh's owner only (``proof``)."""

    id: int
    actor: str
    proof: Text = ""  # the mesh's key, as in ``SpawnActor``


class Reply(Message, frozen=True):
    id: int
    payload: Payload


class Failure(Message, frozen=True):
    """A request failed at the proc.

    ``kind`` is one of ``actor`` (the endpoint raised), ``endpoint`` (unknown
    endpoint or bad arguments), ``encode`` (value cannot be sent), ``spawn``
    (``__init__`` raised), ``deadline`` (the request arrived too late),
    ``stopped`` (the actor is gone), ``denied`` (the sender does not own
    the proc's mesh: a ``SpawnActor`` or ``StopActor`` without its key),
    ``cancelled`` (its caller cancelled it: ``CancelCall``).
    """

    id: int
    kind: str
    type: str
    message: str
    traceback: str = ""
    exc: bytes | None = None  # the pickled exception, when it pickles
    endpoint: str = ""


# ---------------------------------- several actors per proc (client <-> proc)
#
# A fan-out to a mesh with several actors per proc sends one ``GroupCall``
# per proc for all its targeted actors; the proc answers with one
# ``Gathered`` (or ``GatheredFrames``, when a value has buffer frames)
# holding each actor's ``Reply`` or ``Failure`` in the order of ``actors``.
# See ``zmesh._client.calls.grouping`` and ``zmesh._host.proc.actors``.


class GroupCall(Message, frozen=True):
    """``Call`` ``method`` on the actors ``actors`` (local indexes) of group ``actor``."""

    id: int
    actor: str
    method: str
    payload: Payload
    deadline: float = 0.0  # a budget, as ``Call.deadline``
    oneway: bool = False
    request: str = ""
    actors: Annotated[list[Count], msgspec.Meta(max_length=1 << 16)] = []
    sent: float = 0.0  # as ``Call.sent``
    clock: int = 0


class Gathered(Message, frozen=True):
    """The answers of a ``GroupCall`` (or a ``SpawnActor`` of ``count``
    actors), one per actor; no part has buffer frames."""

    id: int
    parts: list[Reply | Failure]


class GatheredFrames(Message, frozen=True):
    """``Gathered`` with buffer frames: part ``k`` is decoded with its own
    ``nbufs[k]`` frames, which follow the envelope in part order."""

    id: int
    parts: list[msgspec.Raw]
    nbufs: list[Count]


# ------------------------------------------- streams (client <-> proc)
#
# A generator endpoint answers a ``StreamCall`` with ``StreamItem``s, then
# ``StreamEnd`` (or a ``Failure``, after the items before it). Its producer
# runs at most ``window`` items ahead: the consumer grants more with
# ``Credit`` as it reads, and ``Cancel`` closes the generator. See
# ``zmesh._client.ports.streams`` and ``zmesh._host.proc.generators``.


class StreamCall(Call, frozen=True):
    """A ``Call`` of a generator endpoint: stream its items back."""

    window: Count = 0  # items ahead of the consumer, at most; 0 = the endpoint's own


class StreamItem(Message, frozen=True):
    id: int
    payload: Payload


class StreamEnd(Message, frozen=True):
    """The generator returned: no more items."""

    id: int


class StreamAlive(Message, frozen=True):
    """A producer waiting for credit checks that its consumer is still there."""

    id: int


class Credit(Message, frozen=True):
    """The consumer read ``n`` more items: the producer may send ``n`` more."""

    id: int
    n: Annotated[int, msgspec.Meta(ge=1, le=1 << 30)]


class Cancel(Message, frozen=True):
    """The consumer is done: close the generator (its ``finally`` runs)."""

    id: int


class CancelCall(Message, frozen=True):
    """The caller cancelled call ``id`` to ``actor`` (sent on the call's own connection).

    A call still queued is dropped; a running ``async`` endpoint is
    cancelled; a running sync one is marked and its result dropped. The
    proc answers with a ``Failure`` of kind ``cancelled`` when it has ended,
    so that a caller knows its actor is free again (``zmesh._host.proc.cancelling``).
    """

    id: int
    actor: str


# ------------------------------------------------ ports (any -> receiver)


class PortSend(Message, frozen=True):
    """A value for port ``port`` of the receiving process (``zmesh._client.ports.channels``)."""

    port: int
    rank: int  # the sending actor's rank; -1 for a sender that is no actor
    payload: Payload


class PortAck(Message, frozen=True):
    """The receiving process to one sender: what it read, and which ports are full.

    Sent back on the connection the values came in on, every ``ACK_VALUES``
    values or ``ACK_BYTES`` bytes read from it and whenever the set of full
    ports this sender was told about changes (``zmesh._client.ports.portsockets``).
    """

    values: int  # values read from this connection since the last ack
    nbytes: int  # and their bytes
    full: list[int] = []  # this sender's ports whose receivers are full now


# ------------------------------------------- tree fan-out (client <-> relay proc)
#
# A fan-out to a wide mesh sends one ``Relay`` per host, to one proc of the
# mesh there (its relay), instead of one message per proc. The relay sends
# ``body`` (with the frames after the envelope) to each target unchanged:
# the very message the direct path would have sent it. See
# ``zmesh._client.calls.tree`` and ``zmesh._host.proc.relay``.


class RelayTarget(msgspec.Struct, frozen=True, array_like=True):
    """A proc behind a relay: a rank of the relay's own mesh on the relay's host."""

    rank: RankNo
    generation: Count
    addr: Text


class RelayHop(msgspec.Struct, frozen=True, array_like=True):
    """A relay on another host and its targets there: one more level of the tree."""

    relay: RelayTarget
    targets: Annotated[list[RelayTarget], msgspec.Meta(min_length=1, max_length=MAX_RANKS_PER_HOST)]


class Relay(Message, frozen=True):
    """Send ``body`` (and this message's buffer frames) to each of ``targets``.

    ``body`` is an encoded per-proc request with the same ``id`` that expects
    one answer (a ``Reply`` or ``Failure``) unless ``oneway``. ``down``: relays
    on other hosts this relay sends a ``Relay`` of their targets to (with no
    ``down`` of its own: two levels at most). Answers are indexed over
    ``targets`` then each hop's targets, in order. The relay acknowledges
    the forwarding with a ``RelayReply`` (``forwarded``) and gathers the answers.
    """

    id: int
    mesh: Name
    targets: Annotated[list[RelayTarget], msgspec.Meta(max_length=MAX_RANKS_PER_HOST)]
    body: bytes
    oneway: bool = False
    down: Annotated[list[RelayHop], msgspec.Meta(max_length=4096)] = []
    # A pickled ``combine(a, b)`` (associative, commutative): the relay folds
    # its targets' values into one and answers that alone (``RelayReply.reduced``).
    reduce: bytes = b""


class RelayReply(Message, frozen=True):
    """What a relay has for a ``Relay``: answers of some targets, gathered.

    ``answers[k]`` is target ``index[k]``'s answer, the encoded message its
    proc sent (a ``Reply``, ``Failure``, ``Gathered`` or ``GatheredFrames``),
    passed on as it came without being decoded; its buffer frames
    (``nbufs[k]`` of them, numbered as the proc numbered them) follow this
    envelope in order. ``lost``: targets whose
    connection dropped with the request on it. ``acked``: targets the
    request was sent to since the last ``RelayReply``; ``forwarded``: to
    every target. ``done``: nothing more comes for this id.
    """

    id: int
    index: list[int] = []
    answers: list[msgspec.Raw] = []
    nbufs: list[int] = []
    lost: list[int] = []
    forwarded: bool = False
    done: bool = False
    acked: list[int] = []  # targets forwarded to (a part of the tree may lag)
    # A reducing ``Relay``: the answer at index -1 is the folded value of these
    # targets (a ``Reply``; a ``Failure`` if ``combine`` raised).
    reduced: list[int] = []
