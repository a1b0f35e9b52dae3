"""Large and buffer values travel intact both ways (arguments and return values)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh

from _keptagents import stop_meshes

MiB = 1 << 20


def digest(x: Any) -> tuple[str, int, str]:
    return type(x).__name__, memoryview(x).nbytes, hashlib.sha256(x).hexdigest()


class Store(zmesh.Actor):
    @zmesh.endpoint
    async def echo(self, x: Any) -> Any:
        return x

    @zmesh.endpoint
    def describe(self, x: Any) -> tuple[str, int, str]:
        return digest(x)

    @zmesh.endpoint
    def make(self, kind: str, n: int) -> Any:
        data = _pattern(n)
        if kind == "bytearray":
            return bytearray(data)
        if kind == "memoryview":
            return memoryview(data)
        return data

    @zmesh.endpoint
    async def view(self, x: memoryview, how: str) -> memoryview:
        """A view of the received buffer: whole, reversed, a slice, or cast."""
        if how == "reversed":
            return x[::-1]
        if how == "slice":
            return x[1:-1]
        if how == "cast":
            return x.cast("I")
        return x

    @zmesh.endpoint
    async def many(self, blobs: dict[str, bytes]) -> dict[str, str]:
        return {k: hashlib.sha256(v).hexdigest() for k, v in blobs.items()}


def _pattern(n: int) -> bytes:
    # Not all zeros: a misplaced or truncated frame would show.
    return (bytes(range(256)) * (n // 256 + 1))[:n]


@pytest.fixture(autouse=True)
def _stop_everything() -> Iterator[None]:
    yield  # the module mesh outlives single tests; the fixture below stops it


@pytest.fixture(scope="module")
def store() -> Iterator[zmesh.ActorMesh[Store]]:
    m = Store.options(procs=2).as_actor().get(timeout=60)
    yield m
    stop_meshes()


SIZES = [pytest.param(100, id="small"), pytest.param(MiB, id="1MiB")]


@pytest.mark.parametrize("n", SIZES)
def test_bytes_round_trip(store: zmesh.ActorMesh[Store], n: int) -> None:
    one = store.slice(procs=0)
    data = os.urandom(n)
    back = one.echo.call_one(data).get(timeout=20)
    assert type(back) is bytes
    assert back == data
    assert one.describe.call_one(data).get(timeout=20) == digest(data)
    made = one.make.call_one("bytes", n).get(timeout=20)
    assert type(made) is bytes and made == _pattern(n)


@pytest.mark.parametrize("n", SIZES)
def test_bytearray_round_trip(store: zmesh.ActorMesh[Store], n: int) -> None:
    one = store.slice(procs=1)
    data = bytearray(os.urandom(n))
    # A bytearray stays a bytearray (as pickle would keep it), at any size.
    assert one.describe.call_one(data).get(timeout=20) == digest(data)
    back = one.echo.call_one(data).get(timeout=20)
    assert type(back) is bytearray
    assert back == data
    made = one.make.call_one("bytearray", n).get(timeout=20)
    assert type(made) is bytearray and made == _pattern(n)


@pytest.mark.parametrize("n", SIZES)
def test_memoryview_round_trip(store: zmesh.ActorMesh[Store], n: int) -> None:
    one = store.slice(procs=0)
    raw = os.urandom(n)
    data = memoryview(raw)
    name, nbytes, sha = one.describe.call_one(data).get(timeout=20)
    assert (nbytes, sha) == (n, hashlib.sha256(raw).hexdigest())
    assert name in ("memoryview", "bytes")
    back = one.echo.call_one(data).get(timeout=20)
    assert bytes(back) == raw
    made = one.make.call_one("memoryview", n).get(timeout=20)
    assert bytes(made) == _pattern(n)


@pytest.mark.parametrize("how", ["whole", "reversed", "slice", "cast"])
def test_a_view_of_a_received_buffer_goes_back_as_its_own_bytes(
    store: zmesh.ActorMesh[Store], how: str
) -> None:
    """A whole received frame is sent back by reference; any other view by value."""
    raw = os.urandom(MiB)
    back = store.slice(procs=0).view.call_one(memoryview(raw), how).get(timeout=20)
    want = {"whole": raw, "reversed": raw[::-1], "slice": raw[1:-1], "cast": raw}[how]
    assert type(back) is memoryview and bytes(back) == want


@pytest.mark.anyio
async def test_large_values_async_and_fanned_out(store: zmesh.ActorMesh[Store]) -> None:
    data = os.urandom(MiB)
    values = (await store.echo.call(data)).values()
    assert values == [data, data]
    assert (await store.describe.call(x=data)).values() == [digest(data)] * 2
    got = [v async for v in store.describe.stream(bytearray(data))]
    assert got == [digest(bytearray(data))] * 2


def test_large_buffers_inside_containers(store: zmesh.ActorMesh[Store]) -> None:
    blobs = {"a": os.urandom(MiB), "b": b"", "c": os.urandom(3 * MiB + 7)}
    want = {k: hashlib.sha256(v).hexdigest() for k, v in blobs.items()}
    assert store.slice(procs=1).many.call_one(blobs).get(timeout=30) == want
    nested = (1, [bytearray(os.urandom(MiB))], {"k": os.urandom(MiB)})
    assert store.slice(procs=1).echo.call_one(nested).get(timeout=30) == nested


def test_many_large_calls_in_flight(store: zmesh.ActorMesh[Store]) -> None:
    blobs = [os.urandom(MiB) for _ in range(8)]
    futs = [store.slice(procs=i % 2).echo.call_one(b) for i, b in enumerate(blobs)]
    assert [f.get(timeout=30) for f in futs] == blobs
