"""The codec: exact values, large buffers as frames, and bad input that never crashes."""

from __future__ import annotations

import pickle
from typing import Any, SupportsIndex

import msgspec
import pytest

from zmesh._errors import EncodeError
from zmesh._wire import codec as _codec
from zmesh._wire import messages as w
from zmesh._wire.codec import BIG_BUFFER, Codec, check_size, explain, request_of


def roundtrip(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    codec = Codec(w.PROC_INBOX)
    payload, buffers = Codec.pack(args, kwargs)
    frames = codec.encode(w.Call(1, "a", "m", payload), buffers)
    msg = codec.decode(frames)
    assert isinstance(msg, w.Call)
    return codec.unpack(msg.payload, frames)


def test_scalars_travel_plain_without_pickle() -> None:
    payload, buffers = Codec.pack((1, 2.5, "s", None, True, b"x"), {"k": 3})
    assert payload.blob is None and buffers == []
    assert roundtrip((1, 2.5, "s", None, True, b"x"), {"k": 3}) == (
        (1, 2.5, "s", None, True, b"x"),
        {"k": 3},
    )


def test_containers_keep_their_python_types() -> None:
    args = ((1, 2), {3, 4}, {"a": [1, (2,)]}, frozenset({5}))
    got_args, _ = roundtrip(args, {})
    assert got_args == args
    assert type(got_args[0]) is tuple


def test_large_buffers_travel_as_their_own_frames() -> None:
    big = b"x" * (BIG_BUFFER + 1)
    payload, buffers = Codec.pack((big, bytearray(big), memoryview(big)), {})
    assert payload.blob is None
    assert len(buffers) == 3 and buffers[0] is big  # no copy into the envelope
    (a, b, c), _ = roundtrip((big, bytearray(big), memoryview(big)), {})
    assert a == big and type(a) is bytes
    assert b == big and type(b) is bytearray
    assert bytes(c) == big


class Array:
    """Pickles its data out of band with protocol 5, as numpy arrays do."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        return (Array._rebuild, (pickle.PickleBuffer(self.data),))

    @staticmethod
    def _rebuild(buf: object) -> Array:
        return Array(bytes(memoryview(buf)))  # type: ignore[arg-type]


def test_large_out_of_band_pickle_buffer_travels_as_a_frame() -> None:
    big = b"y" * (2 * BIG_BUFFER)
    payload, buffers = Codec.pack(([Array(big)],), {})
    assert payload.blob is not None and payload.nbuf == 1 and len(buffers) == 1
    assert len(payload.blob) < 1000  # the data is not inside the pickle
    (got,), _ = roundtrip(([Array(big)],), {})
    assert got[0].data == big


def test_unpicklable_argument_raises_at_pack() -> None:
    import threading

    with pytest.raises(TypeError):
        Codec.pack((threading.Lock(),), {})


def test_pickle_refused_from_unauthenticated_peer() -> None:
    codec = Codec(w.PROC_INBOX, allow_pickle=False)
    payload, buffers = Codec.pack(([1],), {})
    frames = codec.encode(w.Call(1, "a", "m", payload), buffers)
    msg = codec.decode(frames)
    with pytest.raises(PermissionError):
        codec.unpack(msg.payload, frames)


@pytest.mark.parametrize(
    "garbage",
    [b"", b"\xc1", b"\x93\x01", b"not msgpack at all", msgspec.msgpack.encode(["Nope", 1])],
)
def test_garbage_raises_a_catchable_error(garbage: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        Codec(w.PROC_INBOX).decode([garbage])


def test_deep_nesting_raises_a_catchable_error() -> None:
    deep = b"\x91" * 200_000 + b"\xc0"
    with pytest.raises(Exception) as info:  # RecursionError or DecodeError, never a crash
        Codec(w.PROC_INBOX).decode([deep])
    assert isinstance(info.value, (RecursionError, msgspec.DecodeError, msgspec.ValidationError))


def test_one_message_kind_per_tag() -> None:
    codec = Codec(w.AGENT_INBOX)
    msg = w.OwnerHeartbeat("me")
    assert codec.decode(codec.encode(msg)) == msg
    assert pickle.loads(pickle.dumps(msg)) == msg


# ------------------------------------------------------ field validation

SPEC = {"owner": "o", "ranks": [0], "dims": {"procs": 1}}


def _agent_decode(msg: list[object]) -> object:
    return Codec(w.AGENT_INBOX).decode([msgspec.msgpack.encode(msg)])


def test_a_good_spec_decodes_to_typed_structs() -> None:
    main = {"sys_path": ["/a", ""], "dir": "/tmp"}
    msg = _agent_decode(["CreateOrUpdate", 1, "m-1.x_y", {**SPEC, "main": main, "env": {"A": ""}}])
    assert isinstance(msg, w.CreateOrUpdate)
    assert msg.spec.main == w.MainSpec(sys_path=["/a", ""], dir="/tmp")


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        ({"main": {"x": b""}}, "spec.main"),
        ({"main": {"dir": 5}}, "spec.main.dir"),
        ({"ranks": [-1]}, "spec.ranks"),
        ({"dims": {"../x": 1}}, "spec.dims"),
        ({"env": {"": "x"}}, "spec.env"),
        ({"owner": ""}, "spec.owner"),
    ],
)
def test_a_bad_spec_field_is_named_in_the_error(spec: dict[str, object], where: str) -> None:
    msg = ["CreateOrUpdate", 3, "m", {**SPEC, **spec}]
    with pytest.raises(msgspec.ValidationError) as info:
        _agent_decode(msg)
    assert where in explain("CreateOrUpdate", info.value)
    assert request_of(msgspec.msgpack.encode(msg), w.AGENT_REQUESTS) == ("CreateOrUpdate", 3)


def test_a_bad_name_is_explained() -> None:
    with pytest.raises(msgspec.ValidationError) as info:
        _agent_decode(["Stop", 1, "../../etc"])
    text = explain("Stop", info.value)
    assert "at `name`" in text and "letters, digits" in text


def test_request_of_only_for_requests() -> None:
    assert request_of(msgspec.msgpack.encode(["OwnerGone", 1]), w.AGENT_REQUESTS) is None
    assert request_of(b"\xff", w.AGENT_REQUESTS) is None
    assert request_of(msgspec.msgpack.encode(["Stop", "x"]), w.AGENT_REQUESTS) is None
    assert request_of(msgspec.msgpack.encode(["Call", 9]), w.PROC_REQUESTS) == ("Call", 9)


def test_a_negative_buffer_count_is_refused() -> None:
    bad = ["Call", 1, "a", "m", [[], {}, None, -1]]
    with pytest.raises(msgspec.ValidationError):
        Codec(w.PROC_INBOX).decode([msgspec.msgpack.encode(bad)])


@pytest.mark.parametrize("name", ["a", "A-b_c.d", "x" * 128, ".hidden", "a.b"])
def test_check_name_accepts_safe_names(name: str) -> None:
    assert w.check_name(name, "mesh name") == name


@pytest.mark.parametrize("name", ["", "..", "a..b", "a/b", "x" * 129, "é", "a b", 5, None])
def test_check_name_refuses_others(name: object) -> None:
    with pytest.raises(ValueError, match="mesh name"):
        w.check_name(name, "mesh name")
    assert w.check_name("x" * 119, "mesh name", reserve=9)
    with pytest.raises(ValueError, match="1-119"):
        w.check_name("x" * 120, "mesh name", reserve=9)


def test_a_part_over_the_size_limit_is_refused_with_the_limit_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_codec, "MAX_MSG_SIZE", 1000)
    codec = Codec(w.PROC_INBOX)
    payload, buffers = Codec.pack((memoryview(bytes(1001)),), {})
    with pytest.raises(EncodeError, match="1,001 bytes is over the limit of 1,000 bytes"):
        codec.encode(w.Call(1, "a", "m", payload), buffers)
    with pytest.raises(EncodeError, match="ZMESH_MAX_MSG_SIZE"):
        check_size(payload, buffers)
    with pytest.raises(EncodeError, match="over the limit"):  # a big envelope, too
        codec.encode(w.Call(1, "a", "m", w.Payload(args=("x" * 2000,))))
    payload, buffers = Codec.pack((memoryview(bytes(1000)),), {})
    assert len(codec.encode(w.Call(1, "a", "m", payload), buffers)) == 2  # at the limit: fine
