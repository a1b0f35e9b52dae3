"""Random and mutated ZeroMQ messages for the fuzz test, from one seeded RNG.

Every message type of ``zmesh._wire.messages`` is built from its msgspec type info
(so new fields and constraints are covered without editing this file), then
sent as it is, with wrong-typed fields, truncated, mutated byte by byte,
inside batch frames (``zmesh._wire.zsock.BATCH_MARK``), with many parts, with
lying length headers, huge integers and deep nesting; next to plain garbage
and empty frames.

What an authorised peer may do by design is kept out, by decoding each
message as the receiver would (``harmless``): no pickle that can reach a
callable, no ``CreateOrUpdate`` that would start procs, nothing that stops
or impersonates the test's own mesh and actor.
"""

from __future__ import annotations

import contextlib
import pickle
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import msgspec.inspect as mi

from zmesh._wire import messages as w
from zmesh._wire.codec import Codec
from zmesh._wire.zsock import BATCH_MARK

MESSAGE_TYPES: list[type] = sorted(
    (c for c in vars(w).values() if isinstance(c, type) and issubclass(c, w.Message)
     and c is not w.Message),
    key=lambda c: c.__name__,
)  # fmt: skip
_INFO = dict(zip(MESSAGE_TYPES, mi.multi_type_info(MESSAGE_TYPES), strict=True))

INTS = [0, 1, 2, -1, 7, 255, 65536, 2**31, 2**32 + 1, 2**63 - 1, -(2**63), 2**64 - 1]
FLOATS = [0.0, -1.0, 1.5, 1e308, -1e308, float("inf"), float("-inf"), float("nan"), 5e-324]
# Plain-data pickles (no opcode that can reach a callable), whole and cut short.
_PLAIN = pickle.dumps(((1, 2.5, b"xx", [3], {"k": None}), {}), protocol=5)
BYTES = [b"", b"\xff\x00not a pickle", b"\x00" * 70, _PLAIN, _PLAIN[:-3], _PLAIN[:9],
         bytes(range(40, 80))]  # fmt: skip
STRS = ["", "fz", "x" * 300, "../../etc/passwd", "nul\x00in", "\u00e9\u4e2d\U0001f600",
        "Running", "Failed", "tcp://127.0.0.1:1"]  # fmt: skip
# Anything but the type a field wants.
WRONG: list[Any] = [None, True, -1, 2**64 - 1, -(2**63), 1.5, "s", b"b", [], {}, [1, [2, [3]]],
                    {"k": [None]}, msgspec.msgpack.Ext(9, b"x")]  # fmt: skip
# Bytes that matter to msgpack: headers of every kind, the batch mark, nil, ...
INTERESTING = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xC3, 0xC4,
               0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCF, 0xD3, 0xD4, 0xD8, 0xD9, 0xDB, 0xDC, 0xDD,
               0xDE, 0xDF, 0xE0, 0xFF]  # fmt: skip
# Pickle opcodes that look a name up or call into the extension registry: a
# blob with none of these bytes anywhere can build plain data only.
_PICKLE_LOOKUPS = frozenset(b"ci\x93\x82\x83\x84")


class Frames:
    """Makes messages for one receiver.

    Args:
        rng: the seeded source of everything random.
        inbox: the union of message types the receiver decodes: most
            messages are of these, the rest of any type.
        known: values the receiver knows, by field name (an actor, its
            endpoints), so that half the messages with such a field get past
            the lookups to the code behind them.
    """

    def __init__(self, rng: random.Random, inbox: Any, known: dict[str, list[Any]]) -> None:
        self.rng = rng
        self.inbox_types = [c for c in MESSAGE_TYPES if c in _members(inbox)]
        self.known = known
        self.strs = STRS + [v for vs in known.values() for v in vs if isinstance(v, str)]
        self.kinds: list[tuple[str, int, Callable[[], list[bytes]]]] = [
            ("garbage", 10, self.garbage),
            ("empty", 3, self.empty),
            ("valid", 10, self.valid),
            ("wrong_types", 12, self.wrong_types),
            ("truncated", 8, self.truncated),
            ("mutated", 20, self.mutated),
            ("huge", 6, self.huge),
            ("deep", 3, self.deep),
            ("batch", 12, self.batch),
            ("many_parts", 5, self.many_parts),
            ("ext", 6, self.ext),
            ("call", 8, self.call),
        ]
        self._weights = [k[1] for k in self.kinds]

    def next(self) -> tuple[str, list[bytes]]:
        """One message: ``(kind, frames)``."""
        name, _, make = self.rng.choices(self.kinds, self._weights)[0]
        return name, make()

    # -- values

    def value(self, t: Any, depth: int = 0) -> Any:
        """A value of msgspec type info ``t`` (often an odd one)."""
        rng = self.rng
        if isinstance(t, mi.Metadata):
            return self.value(t.type, depth)
        if isinstance(t, mi.IntType):
            return rng.choice(INTS) if rng.random() < 0.7 else rng.randint(-5, 5)
        if isinstance(t, mi.FloatType):
            return rng.choice(FLOATS)
        if isinstance(t, mi.StrType):
            return rng.choice(self.strs)
        if isinstance(t, mi.BytesType | mi.ByteArrayType | mi.MemoryViewType):
            return rng.choice(BYTES)
        if isinstance(t, mi.BoolType):
            return rng.random() < 0.5
        if isinstance(t, mi.NoneType):
            return None
        if isinstance(t, mi.LiteralType):
            return rng.choice(t.values)
        if isinstance(t, mi.UnionType):
            return self.value(rng.choice(t.types), depth)
        if isinstance(t, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
            return [self.value(t.item_type, depth + 1) for _ in range(self._count(depth))]
        if isinstance(t, mi.TupleType):
            return [self.value(x, depth + 1) for x in t.item_types]
        if isinstance(t, mi.DictType):
            return {self._key(t.key_type): self.value(t.value_type, depth + 1)
                    for _ in range(self._count(depth))}  # fmt: skip
        if isinstance(t, mi.StructType):
            return t.cls(**{f.name: self._field(f, depth) for f in t.fields})
        if isinstance(t, mi.AnyType):
            return self.anything(depth)
        return rng.choice(WRONG)

    def _field(self, f: Any, depth: int) -> Any:
        known = self.known.get(f.name)
        if known and self.rng.random() < 0.5:
            return self.rng.choice(known)
        return self.value(f.type, depth + 1)

    def _count(self, depth: int) -> int:
        return 0 if depth > 4 else self.rng.choice([0, 1, 1, 2, 3, 17])

    def _key(self, t: Any) -> Any:
        v = self.value(t, 9)
        return v if isinstance(v, str | int | float | bool | bytes) or v is None else "k"

    def anything(self, depth: int = 0) -> Any:
        rng = self.rng
        r = rng.random()
        if depth > 3 or r < 0.6:
            return rng.choice([*INTS[:4], *FLOATS[:3], *self.strs, *BYTES[:2], None, True])
        if r < 0.75:
            return [self.anything(depth + 1) for _ in range(self._count(depth))]
        if r < 0.9:
            return {
                rng.choice(self.strs): self.anything(depth + 1) for _ in range(self._count(depth))
            }
        return msgspec.msgpack.Ext(rng.choice([1, 2, 3, 4, 99]), self._index())

    def _index(self) -> bytes:
        i = self.rng.choice([0, 1, 2, 3, 1000, 2**31, 2**32 - 1])
        return i.to_bytes(4, "little") if self.rng.random() < 0.9 else bytes(self.rng.randrange(9))

    def message(self) -> Any:
        types = self.inbox_types if self.rng.random() < 0.6 else MESSAGE_TYPES
        cls = self.rng.choice(types)
        return self.value(_INFO[cls])

    def envelope(self) -> bytes:
        return msgspec.msgpack.encode(self.message())

    # -- the kinds

    def garbage(self) -> list[bytes]:
        n = self.rng.choice([1, 2, 8, 64, 512, 4096, 70_000])
        return [self.rng.randbytes(self.rng.randrange(n + 1))]

    def empty(self) -> list[bytes]:
        return [b""] * self.rng.choice([1, 1, 2, 5])

    def valid(self) -> list[bytes]:
        return [self.envelope()]

    def wrong_types(self) -> list[bytes]:
        msg = self.message()
        fields = {f: getattr(msg, f) for f in msg.__struct_fields__}
        for f in self.rng.sample(sorted(fields), min(len(fields), self.rng.randint(1, 2))):
            fields[f] = self.rng.choice(WRONG)
        return [msgspec.msgpack.encode(type(msg)(**fields))]

    def truncated(self) -> list[bytes]:
        env = self.envelope()
        return [env[: self.rng.randrange(len(env))]]

    def mutated(self) -> list[bytes]:
        return [self.mutate(self.envelope())]

    def mutate(self, data: bytes) -> bytes:
        rng = self.rng
        buf = bytearray(data)
        for _ in range(rng.choice([1, 1, 2, 3, 8])):
            op = rng.randrange(6)
            i = rng.randrange(len(buf) + 1)
            if op == 0 and buf:
                buf[min(i, len(buf) - 1)] ^= 1 << rng.randrange(8)
            elif op == 1 and buf:
                buf[min(i, len(buf) - 1)] = rng.choice(INTERESTING)
            elif op == 2:
                buf[i:i] = rng.randbytes(rng.randint(1, 9))
            elif op == 3:
                del buf[i : i + rng.randint(1, 9)]
            elif op == 4:
                buf[i:i] = buf[i : i + rng.randint(1, 16)] * rng.randint(1, 4)
            else:
                buf[i:i] = (
                    bytes([rng.choice(INTERESTING)])
                    + rng.choice(INTS).to_bytes(9, "big", signed=True)[: rng.choice([1, 2, 4, 8])]
                )
        return bytes(buf)

    def huge(self) -> list[bytes]:
        """Length headers that claim gigabytes, and integers at the edges."""
        rng = self.rng
        tag = rng.choice(MESSAGE_TYPES).__name__.encode()
        header = bytes([0xA0 | len(tag)]) + tag
        lie = rng.choice([
            b"\xdd\xff\xff\xff\xff",  # array of 4G elements
            b"\xdf\xff\xff\xff\xff",  # map of 4G entries
            b"\xdb\xff\xff\xff\xff",  # str of 4 GB
            b"\xc6\xff\xff\xff\xff",  # bin of 4 GB
            b"\xc9\x7f\xff\xff\xff\x01",  # ext of 2 GB
            b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",  # uint64 max
            b"\xd3\x80\x00\x00\x00\x00\x00\x00\x00",  # int64 min
        ])  # fmt: skip
        n = rng.choice([2, 3, 5, 8])
        return [bytes([0x90 | n]) + header + lie * rng.randint(1, n)]

    def deep(self) -> list[bytes]:
        """Nesting far past any recursion limit, in a field that takes anything."""
        rng = self.rng
        depth = rng.choice([200, 990, 1100, 20_000, 100_000])
        opener = rng.choice([b"\x91", b"\x81\xa1k", b"\xdc\x00\x01"])
        nested = opener * depth + b"\xc0"
        if rng.random() < 0.3:
            return [nested]  # the whole envelope
        # Call(id, actor, method, Payload(args=<nested>)): args take anything.
        actor = msgspec.msgpack.encode(rng.choice(self.strs))
        method = msgspec.msgpack.encode(rng.choice(self.strs))
        return [b"\x95\xa4Call\x01" + actor + method + b"\x91" + nested]

    def batch(self) -> list[bytes]:
        """A batch frame: the mark, an array header (true or not), envelopes."""
        rng = self.rng
        envs = []
        for _ in range(rng.choice([0, 1, 2, 5, 16, 64])):
            env = self.envelope()
            envs.append(self.mutate(env) if rng.random() < 0.4 else env)
        n = len(envs) if rng.random() < 0.7 else rng.choice([0, 1, 15, 16, 65535])
        head = bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
        frame = bytes([BATCH_MARK]) + head + b"".join(envs)
        if rng.random() < 0.3:
            frame = bytes([BATCH_MARK]) + self.mutate(frame[1:])
        return [frame]

    def many_parts(self) -> list[bytes]:
        rng = self.rng
        n = rng.choice([2, 3, 10, 100, 1000])
        env = self.envelope() if rng.random() < 0.5 else self.ext()[0]
        return [env, *(rng.randbytes(rng.choice([0, 1, 64, 1024])) for _ in range(n - 1))]

    def call(self) -> list[bytes]:
        """A call with odd arguments, most often to an endpoint the receiver has."""
        rng = self.rng
        pick = lambda field: rng.choice(self.known.get(field) or self.strs)  # noqa: E731
        payload = w.Payload(
            args=tuple(self.anything(1) for _ in range(self._count(0))),
            kwargs={rng.choice(self.strs): self.anything(1) for _ in range(self._count(1))},
            blob=rng.choice([None, None, *BYTES]),
            nbuf=rng.choice([0, 0, 1, 5]),
        )
        call = w.Call(
            rng.choice(INTS), pick("actor"), pick("method"), payload,
            deadline=rng.choice([0.0, 0.0, *FLOATS]), oneway=rng.random() < 0.2,
            request=rng.choice(self.strs),
        )  # fmt: skip
        env = msgspec.msgpack.encode(call)
        if rng.random() < 0.3:
            env = self.mutate(env)
        return [env, *(rng.randbytes(rng.choice([0, 8, 70_000])) for _ in range(payload.nbuf))]

    def ext(self) -> list[bytes]:
        """A call whose arguments reference buffer frames, right or wrong."""
        rng = self.rng
        exts = [msgspec.msgpack.Ext(rng.choice([1, 2, 3, 3, 7]), self._index())
                for _ in range(rng.randint(1, 4))]  # fmt: skip
        call = w.Call(rng.choice(INTS), rng.choice(self.strs), rng.choice(self.strs),
                      w.Payload(args=tuple(exts)))  # fmt: skip
        parts = [rng.randbytes(rng.choice([0, 8, 70_000])) for _ in range(rng.choice([0, 1, 3]))]
        return [msgspec.msgpack.encode(call), *parts]


def _members(union: Any) -> set[type]:
    return set(getattr(union, "__args__", (union,)))


# ------------------------------------------------------------ what may be sent

_CODECS: dict[Any, Codec] = {}


@contextlib.contextmanager
def _deeper_recursion() -> Iterator[None]:
    # Decoding here with a higher limit than the receiver's means whatever
    # the receiver decodes, this filter decoded too.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _plain_pickle(blob: bytes | None) -> bool:
    return blob is None or not (_PICKLE_LOOKUPS & set(blob))


def harmless(frames: list[bytes], inbox: Any, forbidden: set[str]) -> bool:
    """Whether the receiver would do nothing an authorised peer may do by design.

    Args:
        frames: the message (without the routing id).
        inbox: the union the receiver decodes (``PROC_INBOX``, ``AGENT_INBOX``).
        forbidden: names of the test's own mesh, owner and actor.
    """
    codec = _CODECS.get(inbox)
    if codec is None:
        codec = _CODECS[inbox] = Codec(inbox)
    try:
        with _deeper_recursion():
            if frames[0][:1] == bytes([BATCH_MARK]):
                msgs = codec.decode_batch(frames[0])
            else:
                msgs = [codec.decode(frames)]
    except Exception:
        return True  # the receiver drops it too
    for msg in msgs:
        if isinstance(msg, w.CreateOrUpdate) and msg.spec.ranks:
            return False  # starts procs: running code is what an agent is for
        for attr in ("name", "mesh", "owner", "actor"):
            if getattr(msg, attr, None) in forbidden and not isinstance(msg, w.Call):
                return False  # would stop, replace or impersonate the test's own
        if isinstance(msg, w.SpawnActor) and not _plain_pickle(msg.cls):
            return False
        payload = getattr(msg, "payload", None)
        if isinstance(payload, w.Payload) and not _plain_pickle(payload.blob):
            return False
    return True
