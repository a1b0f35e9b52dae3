"""Ports across hosts: a port made by the client is sent to from actors on other hosts.

Each host is a network namespace with its own IP. A receiver's ipc:// inbox
means nothing on another host, so a port carries a TCP inbox too (CURVE, with
a ZAP handler that admits only keys the agents admit); these tests check that
senders on other hosts use it, through two hops, in order, and that a key the
agents do not admit cannot send to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

import zmesh
from zmesh import Channel, Port
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.codec import Codec

from _helpers import (
    connected,
    keep_module_meshes,  # noqa: F401  (a fixture: the mesh outlives tests)
)
from netns_cluster import NetnsCluster


class Sender(zmesh.Actor):
    @zmesh.endpoint
    async def send(self, port: Port[Any], value: Any) -> str:
        """Send ``value``; say which address it went to."""
        port.send(value)
        return port.route()[0]

    @zmesh.endpoint
    async def relay(self, port: Port[Any], hop: Any, value: int) -> str:
        """Hand ``port`` to ``hop`` (an actor on another host), which sends."""
        return await hop.send.call_one(port, value + 1)

    @zmesh.endpoint
    async def receive_from(self, other: Any) -> tuple[str, int]:
        """Open a channel here; have ``other`` (on another host) send to it."""
        port, receiver = Channel.open()
        await other.send.call_one(port, 7)
        return port.tcp, await asyncio.wait_for(receiver.recv(), 10)

    @zmesh.endpoint
    async def flood(self, port: Port[Any], loops: int, n: int) -> None:
        """``loops`` concurrent senders, each sending ``(rank, loop, i)`` for i < n."""
        rank = zmesh.current_rank().rank

        async def sender(j: int) -> None:
            for i in range(n):
                port.send((rank, j, i))
                if i % 10 == 0:
                    await asyncio.sleep(0)

        await asyncio.gather(*(sender(j) for j in range(loops)))

    @zmesh.endpoint
    def burst(self, port: Port[int], n: int) -> None:
        for i in range(n):
            port.send(i)


@pytest.fixture(scope="module")
def cluster(keys_dir: str, client_keys: str) -> Iterator[NetnsCluster]:
    with NetnsCluster(2, keys=keys_dir) as c, connected(c.controls, keys=client_keys):
        yield c


@pytest.fixture(scope="module")
def senders(cluster: NetnsCluster) -> Any:
    return Sender.options(hosts=2).as_actor().get(timeout=60)


def bridge_ip(cluster: NetnsCluster) -> str:
    return cluster.hosts[0].ip.rsplit(".", 1)[0] + ".1"  # the client's side of every host


def test_a_client_port_is_sent_to_from_another_host_over_tcp(
    cluster: NetnsCluster, senders: Any
) -> None:
    port, receiver = Channel.open()
    assert port.tcp.startswith(f"tcp://{bridge_ip(cluster)}:") and port.key
    route = senders.slice(hosts=1).send.call_one(port, {"x": 1}).get(timeout=10)
    assert route == port.tcp  # not the ipc:// path, which only this host has
    assert receiver.recv().get(timeout=10) == {"x": 1}


def test_a_port_through_two_actors_on_two_hosts_delivers_to_the_client(senders: Any) -> None:
    port, receiver = Channel.open_ranked()
    first, second = senders.slice(hosts=0), senders.slice(hosts=1)
    assert first.relay.call_one(port, second, 41).get(timeout=10) == port.tcp
    assert receiver.recv().get(timeout=10) == (1, 42)  # sent by rank 1, on the second host


def test_an_actor_receives_on_its_own_port_from_another_host(
    cluster: NetnsCluster, senders: Any
) -> None:
    tcp, value = senders.slice(hosts=0).receive_from.call_one(senders.slice(hosts=1)).get(30)
    assert tcp.startswith(f"tcp://{cluster.hosts[0].ip}:") and value == 7  # the proc's interface


def test_values_from_one_sender_on_another_host_arrive_in_order(senders: Any) -> None:
    port, receiver = Channel.open()
    senders.slice(hosts=1).burst.call_one(port, 3000).get(timeout=30)
    got = [receiver.recv().get(timeout=10) for _ in range(3000)]
    assert got == list(range(3000))


@pytest.mark.stress
def test_100_senders_on_two_hosts_lose_nothing_over_curve(cluster: NetnsCluster) -> None:
    mesh = Sender.options(hosts=2, procs=2).as_actor().get(timeout=60)
    port, receiver = Channel.open()
    loops, n = 25, 100  # 4 procs x 25 loops: 100 senders, 10,000 values over TCP + CURVE
    done = mesh.flood.call(port, loops, n)
    got = [receiver.recv().get(timeout=20) for _ in range(4 * loops * n)]
    done.get(timeout=30)
    last: dict[tuple[int, int], int] = {}
    for rank, j, i in got:
        assert last.get((rank, j), -1) == i - 1, f"sender {(rank, j)}: {i} out of order"
        last[(rank, j)] = i
    assert len(last) == 4 * loops and set(last.values()) == {n - 1}
    mesh.stop().get(timeout=30)


def test_a_key_the_agents_do_not_admit_cannot_send_to_the_port_server(
    senders: Any, keys_dir: str
) -> None:
    port, receiver = Channel.open()
    public, secret = zmq.curve_keypair()
    stranger = _security.Keys("", public, secret, port.key)
    assert "refused our CURVE key" in _security.probe(port.tcp, timeout=5, keys=stranger)
    agents = _security.Keys.load(keys_dir)
    admitted = _security.Keys(agents.dir, agents.public, agents.secret, port.key)
    assert _security.probe(port.tcp, timeout=5, keys=admitted) == ""

    # A well-formed value with the stranger's key never arrives; an actor's does.
    sock: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.CURVE_SERVERKEY, port.key)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    sock.connect(port.tcp)
    try:
        payload, buffers = Codec.pack_value("forged")
        forged = w.PortSend(port.number, 0, payload)
        sock.send_multipart(Codec(w.PORT_INBOX).encode(forged, buffers))
        senders.slice(hosts=1).send.call_one(port, "genuine").get(timeout=10)
        assert receiver.recv().get(timeout=10) == "genuine"
        with pytest.raises(zmesh.CallTimeoutError):
            receiver.recv().get(timeout=1.0)
    finally:
        sock.close(linger=0)
