"""A transfer that outlasts the old 0.5 s ZMTP heartbeat timeout still arrives.

One host behind a 100 Mbit/s link (``tc tbf`` on both ends of its veth):
tens of MiB take seconds each way. Call sockets carry no ZMTP heartbeats,
so nothing cuts the connection mid-transfer; liveness is zmesh's own.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh

from _helpers import connected
from netns_cluster import NetnsCluster

MIB = 1 << 20


class Sink(zmesh.Actor):
    @zmesh.endpoint
    async def crc(self, data: memoryview) -> int:
        return zlib.crc32(data)

    @zmesh.endpoint
    async def echo(self, data: Any) -> Any:
        return data

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.fixture
def slow_host(keys_dir: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[NetnsCluster]:
    # The agent's heartbeats cross the same saturated link, behind up to 400 ms
    # of queue and TCP's loss recovery: gaps past the default 1.2 s happen
    # (docs/supervision.md says to raise ZMESH_AGENT_TIMEOUT on such links).
    monkeypatch.setattr("zmesh._client.control.controller.AGENT_TIMEOUT", 10.0)
    with NetnsCluster(1, keys=keys_dir) as cluster:
        cluster.limit_rate(0, "100mbit")
        with connected(cluster.controls, keys=keys_dir):
            yield cluster


@pytest.mark.slow
def test_a_transfer_of_several_seconds_arrives_over_a_slow_link(slow_host: NetnsCluster) -> None:
    mesh = Sink.options().as_actor().get(timeout=60)
    pid = mesh.pid.call_one().get(timeout=10)
    data = memoryview(bytearray(os.urandom(MIB) * 40))  # 40 MiB: ~3.4 s at 100 Mbit/s
    want = zlib.crc32(data)
    t0 = time.monotonic()
    assert mesh.crc.call_one(data).get(timeout=60) == want
    took = time.monotonic() - t0
    assert took > 2.0, f"the link was not slow ({took:.1f}s): the test proves nothing"
    back = mesh.echo.call_one(data).get(timeout=60)  # and the other way
    assert zlib.crc32(back) == want
    # Busy transferring is not dead: the same proc, still Running.
    assert mesh.state().status == zmesh.Status.RUNNING
    assert mesh.pid.call_one().get(timeout=10) == pid
    print(f"40 MiB over the slow link in {took:.1f}s")
