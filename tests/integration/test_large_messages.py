"""A message of any size either arrives or fails its call with an error naming the limit.

Call sockets run without ZMTP heartbeats, so a transfer longer than the old
0.5 s heartbeat timeout is not cut off; a part over ``MAX_MSG_SIZE`` (which
the receiver would drop the connection over) is refused by its sender.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import zlib
from typing import Any

import pytest

import zmesh
from zmesh._wire import zsock as _zsock

MIB = 1 << 20
# Over the limit by one byte. bytes(n) is calloc'ed: its pages are never
# touched, so it costs no memory (and a refused send never reads it).
HUGE = _zsock.MAX_MSG_SIZE + 1


class Store(zmesh.Actor):
    @zmesh.endpoint
    async def echo(self, x: Any) -> Any:
        return x

    @zmesh.endpoint
    async def crc(self, x: memoryview) -> int:
        return zlib.crc32(x)

    @zmesh.endpoint
    async def make(self, n: int) -> bytes:
        return bytes(n)

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.mark.stress
@pytest.mark.timeout(300)
@pytest.mark.anyio
async def test_a_256_mib_argument_makes_the_round_trip() -> None:
    mesh = await Store.options().as_actor()
    pid = await mesh.pid.call_one()
    data = os.urandom(MIB) * 256
    want = zlib.crc32(data)
    view = memoryview(data)
    for _ in range(2):  # each way, twice: several seconds of transfer on a busy machine
        assert await asyncio.wait_for(_aw(mesh.crc.call_one(view)), 60) == want
        back = await asyncio.wait_for(_aw(mesh.echo.call_one(view)), 60)
        assert back.nbytes == view.nbytes and zlib.crc32(back) == want
        del back
    # Busy receiving is not hung: the same proc, still Running, never restarted.
    st = mesh.state()
    assert st.status == zmesh.Status.RUNNING
    assert st.ranks[0].generation == mesh._refs[0].generation
    assert await mesh.pid.call_one() == pid


async def _aw(fut: zmesh.Future[Any]) -> Any:
    return await fut


@pytest.mark.anyio
async def test_an_argument_over_the_limit_is_refused_before_sending() -> None:
    mesh = await Store.options().as_actor()
    big = bytes(HUGE)
    for call in (
        lambda: mesh.echo.call_one(big),
        lambda: mesh.echo.call(big),
        lambda: mesh.echo.broadcast(big),
        lambda: mesh.echo.call_one(memoryview(big)),
        lambda: mesh.echo.call_one([1, pickle.PickleBuffer(big)]),  # pickled, out of band
    ):
        with pytest.raises(zmesh.EncodeError, match=f"limit of {_zsock.MAX_MSG_SIZE:,} bytes"):
            call()
    # Nothing went out: the connection is intact and the next call answers.
    assert await mesh.echo.call_one(b"ok") == b"ok"


def test_an_argument_over_the_limit_is_refused_from_plain_code() -> None:
    mesh = Store.options().as_actor().get(timeout=60)
    with pytest.raises(zmesh.EncodeError, match="ZMESH_MAX_MSG_SIZE"):
        mesh.echo.call_one(bytes(HUGE))
    assert mesh.echo.call_one(1).get(timeout=10) == 1


@pytest.mark.anyio
async def test_a_return_value_over_the_limit_fails_the_call() -> None:
    mesh = await Store.options().as_actor()
    with pytest.raises(zmesh.EncodeError, match=f"limit of {_zsock.MAX_MSG_SIZE:,} bytes") as info:
        await asyncio.wait_for(_aw(mesh.make.call_one(HUGE)), 30)
    assert info.value.mesh == mesh.proc_mesh and info.value.rank == 0
    assert "'make'" in str(info.value)
    assert await mesh.echo.call_one(3) == 3  # the actor and the connection are fine


def test_a_smaller_limit_is_set_with_an_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Procs take the spawner's ZMESH_* variables: this one refuses a 2 MiB
    # return value, naming its own limit.
    monkeypatch.setenv("ZMESH_MAX_MSG_SIZE", str(MIB))
    mesh = Store.options().as_actor().get(timeout=60)
    assert mesh.echo.call_one(b"x" * (MIB // 2)).get(timeout=10) == b"x" * (MIB // 2)
    with pytest.raises(zmesh.EncodeError, match="limit of 1,048,576 bytes"):
        mesh.make.call_one(2 * MIB).get(timeout=10)
    assert len(mesh.make.call_one(MIB).get(timeout=10)) == MIB
