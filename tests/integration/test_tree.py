"""Tree fan-out on 16 loopback agents (16 "hosts" x 2 procs): one message per host.

The counts come from where the messages are: the client's tree statistics
(what it sent) and each proc's ``ProcStatistics`` as its agent publishes
them for ``zmesh top`` (what each relay forwarded, what each actor ran).
"""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

import zmesh
from zmesh import Accumulator
from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls import tree as _tree
from zmesh._client.control.agents import AgentLink
from zmesh._shared.stats import ProcStatistics
from zmesh._wire import messages as w
from zmesh.testing import AgentProcess, local_cluster

from _helpers import (
    keep_module_meshes,  # noqa: F401  (a fixture: the mesh outlives tests)
    wait_for,
)

HOSTS, PROCS = 16, 2
TOPS = 4  # two levels: sqrt(16) top relays of 4 hosts each

pytestmark = pytest.mark.slow


class Wide(zmesh.Actor):
    def __init__(self) -> None:
        self.notes: list[int] = []

    @zmesh.endpoint
    def note(self, n: int) -> None:
        self.notes.append(n)

    @zmesh.endpoint
    def seen(self) -> list[int]:
        return list(self.notes)

    @zmesh.endpoint
    def echo(self, data: bytearray) -> bytearray:
        return data

    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @zmesh.endpoint
    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return zmesh.current_rank().rank

    @zmesh.endpoint
    async def snooze(self, seconds: float) -> int:  # the actors of a proc sleep together
        await asyncio.sleep(seconds)
        return zmesh.current_rank().rank

    @zmesh.endpoint
    def fail_at(self, *points: int) -> int:
        rank = zmesh.current_rank().rank
        if rank in points:
            raise ValueError(f"point {rank} fails")
        return rank


@pytest.fixture(scope="module")
def agents() -> Iterator[list[AgentProcess]]:
    with local_cluster(HOSTS) as agents:
        yield agents


@pytest.fixture(scope="module")
def mesh(agents: list[AgentProcess]) -> Iterator[zmesh.ActorMesh[Wide]]:
    # One mesh for the module: the tests that kill procs kill different hosts'.
    m = Wide.options(hosts=HOSTS, procs=PROCS).as_actor().get(timeout=90)
    yield m
    zmesh.shutdown()


def tree_stats() -> _tree.TreeStatistics:
    rt, _ = _runtime.current()
    assert rt.tree is not None, "no fan-out took the tree path"
    return rt.tree.statistics()


def proc_stats(agents: list[AgentProcess], mesh: str) -> dict[int, ProcStatistics]:
    """Every proc of ``mesh``, as the agents report them (``zmesh top``'s source)."""
    out: dict[int, ProcStatistics] = {}
    for a in agents:
        link = AgentLink(a.control)
        try:
            reply = link.request(lambda i: w.GetStats(i), timeout=10)
        finally:
            link.close()
        out.update({p.rank: p for p in reply.stats.procs if p.mesh == mesh})
    return out


def calls_of(p: ProcStatistics, endpoint: str) -> int:
    return sum(e.calls for a in p.actors for e in a.endpoints if e.name == endpoint)


def test_a_wide_mesh_takes_the_tree_by_size(mesh: zmesh.ActorMesh[Wide]) -> None:
    assert _tree.MODE == "auto"
    handle: Any = mesh  # the handle class, as the checker sees the actor class
    assert _tree.wide(handle)  # 16 hosts x 2 procs = 32 >= ZMESH_TREE_MIN
    assert _tree.wide(handle.slice(hosts=0))  # a slice goes as its whole mesh does
    small: Any = types.SimpleNamespace(full_dims={"hosts": 2, "procs": 2}, _refs=[])
    assert not _tree.wide(small)  # a small mesh goes directly
    one_host: Any = types.SimpleNamespace(full_dims={"hosts": 1, "procs": 64}, _refs=[])
    assert not _tree.wide(one_host)


def test_broadcast_and_call_send_one_message_per_host(
    agents: list[AgentProcess], mesh: zmesh.ActorMesh[Wide]
) -> None:
    before = tree_stats() if _runtime.current()[0].tree is not None else None
    rounds = 3
    for n in range(rounds):
        mesh.note.broadcast(n)
    # Order holds through the relays: every actor saw the three, in order.
    seen = mesh.seen.call().get(timeout=30).values()
    assert seen == [list(range(rounds))] * (HOSTS * PROCS)
    # A call_one right after a broadcast does not overtake it.
    mesh.note.broadcast(99)
    last = mesh.slice(hosts=HOSTS - 1, procs=PROCS - 1).seen.call_one().get(timeout=30)
    assert last[-1] == 99

    after = tree_stats()
    fanouts = rounds + 2  # the broadcasts, the call and the last broadcast
    sent = after.relay_messages - (before.relay_messages if before else 0)
    assert sent == fanouts * TOPS  # flat: fanouts * HOSTS * PROCS
    assert after.direct == (before.direct if before else 0)

    # Each host's relay forwarded each fan-out to its PROCS procs, and every
    # actor ran each message exactly once.
    def settled() -> dict[int, ProcStatistics] | None:
        stats = proc_stats(agents, mesh.proc_mesh)
        if len(stats) < HOSTS * PROCS:
            return None
        if any(calls_of(p, "note") < rounds + 1 for p in stats.values()):
            return None
        if sum(p.forwarded for p in stats.values()) < fanouts * HOSTS * PROCS:
            return None
        return stats

    stats = wait_for(settled, 15, "procs to report their relay counters")
    relays = [p for p in stats.values() if p.relayed]
    assert len(relays) == HOSTS  # one relay per host
    assert {p.rank // PROCS for p in relays} == set(range(HOSTS))
    assert all(p.relayed == fanouts for p in relays)
    # A top relay sends to its PROCS procs and to the relays of its 3 other
    # hosts; those send to their PROCS procs.
    forwarded = sorted(p.forwarded for p in relays)
    per_host = HOSTS // TOPS
    want = [fanouts * PROCS] * (HOSTS - TOPS) + [fanouts * (PROCS + per_host - 1)] * TOPS
    assert forwarded == want
    assert all(calls_of(p, "note") == rounds + 1 for p in stats.values())
    assert all(calls_of(p, "seen") == 1 for p in stats.values() if p.rank != len(stats) - 1)


def test_a_senders_calls_to_a_relays_own_proc_keep_their_order(
    mesh: zmesh.ActorMesh[Wide],
) -> None:
    """A relay runs its own proc's part itself: through the tree or directly,
    one sender's messages to that proc arrive in the order they were sent."""
    rt, _ = _runtime.current()
    assert rt.tree is not None
    mesh.nap.call(0).get(timeout=30)  # (the relays are known)
    relays = [rt.tree.relays[(mesh.proc_mesh, mesh._refs[h * PROCS].agent)] for h in (0, 1)]
    assert [r.rank // PROCS for r in relays] == [0, 1]  # host 0's is a top relay; host 1's not
    sent: list[int] = []
    pending = []
    for n in range(6):
        mesh.note.broadcast(1000 + n)  # through the tree, to every proc
        sent.append(1000 + n)
        for r in relays:  # then directly to each relay's own proc, not waiting
            one = mesh.slice(hosts=r.rank // PROCS, procs=r.rank % PROCS)
            pending.append(one.note.call_one(2000 + n))
        sent.append(2000 + n)
    for f in pending:
        f.get(timeout=30)
    for r in relays:
        one = mesh.slice(hosts=r.rank // PROCS, procs=r.rank % PROCS)
        seen = one.seen.call_one().get(timeout=30)
        assert seen[-len(sent) :] == sent, f"relay {r.rank}: {seen}"


def test_a_relays_own_actor_that_raises_fails_exactly_its_point(
    mesh: zmesh.ActorMesh[Wide],
) -> None:
    rt, _ = _runtime.current()
    assert rt.tree is not None
    top, host = (rt.tree.relays[(mesh.proc_mesh, mesh._refs[h * PROCS].agent)].rank for h in (0, 1))
    done, got, dupes = each_outcome(mesh, "fail_at", top, host)
    assert done.wait(30), f"only {len(got)} of {HOSTS * PROCS} points answered"
    assert not dupes
    assert {i for i, (ok, _) in got.items() if not ok} == {top, host}
    for i in (top, host):
        err = got[i][1]
        assert isinstance(err, zmesh.ActorError) and isinstance(err.cause, ValueError), err
        assert f"point {i} fails" in str(err)
    assert all(got[i] == (True, i) for i in range(HOSTS * PROCS) if i not in (top, host))


def test_large_values_come_back_through_relays_as_they_were_sent(
    mesh: zmesh.ActorMesh[Wide],
) -> None:
    big = bytearray(b"z" * (256 << 10))  # out-of-band frames, through two relays
    got = mesh.slice(hosts=slice(0, 8)).echo.call(big).get(timeout=30).values()
    assert all(type(v) is bytearray and v == big for v in got)


# ---------------------------------------------- several actors per proc
#
# 4 hosts x 2 procs x 3 actors on the first four agents: each proc's part is
# one GroupCall, one Relay per top relay carries them (4 hosts: 2 tops of 2),
# and each proc's Gathered answer comes back through its relays.
M_HOSTS, M_PROCS, M_PER = 4, 2, 3
M_POINTS = M_HOSTS * M_PROCS * M_PER


@pytest.fixture(scope="module")
def multi(agents: list[AgentProcess]) -> Iterator[zmesh.ActorMesh[Wide]]:
    saved = _tree.MIN_PROCS
    _tree.MIN_PROCS = M_HOSTS * M_PROCS  # 8 procs: wide enough (actors do not count)
    try:
        opts = Wide.options(hosts=M_HOSTS, procs=M_PROCS, actors_per_proc=M_PER)
        m = opts.as_actor().get(timeout=90)
        yield m
        m.stop().get(timeout=30)
    finally:
        _tree.MIN_PROCS = saved


def points_of(host: int, proc: int) -> set[int]:
    first = (host * M_PROCS + proc) * M_PER
    return set(range(first, first + M_PER))


def each_outcome(
    m: Any, endpoint: str, *args: Any
) -> tuple[threading.Event, dict[int, Any], list[int]]:
    """Start a tree fan-out of ``endpoint`` and record every point's own outcome
    ``(ok, value)``, and the points that had a second one."""
    rt, _ = _runtime.current()
    ep = getattr(m, endpoint)
    payload, buffers = ep._pack(args, {})
    refs = m._refs
    got: dict[int, Any] = {}
    dupes: list[int] = []
    done = threading.Event()

    def deliver(i: int, ok: bool, value: Any) -> None:  # on the runtime's loop
        if i in got:
            dupes.append(i)
        got[i] = (ok, value)
        if len(got) == len(refs):
            done.set()

    rt.loop.call_soon_threadsafe(
        _tree.send, rt, refs, ep._call_msg(payload), buffers, deliver, None, True
    )
    return done, got, dupes


def test_a_multi_actor_mesh_fans_out_one_message_per_host(
    agents: list[AgentProcess], multi: zmesh.ActorMesh[Wide]
) -> None:
    handle: Any = multi
    assert _tree.wide(handle)  # by its procs: 4 hosts x 2 procs
    assert "actors" in handle.full_dims
    before = tree_stats() if _runtime.current()[0].tree is not None else None
    rounds = 3
    for n in range(rounds):
        multi.note.broadcast(n)
    # Every actor (not just every proc) saw the three, in order, and answered as itself.
    assert multi.seen.call().get(timeout=30).values() == [list(range(rounds))] * M_POINTS
    assert multi.snooze.call(0).get(timeout=30).values() == list(range(M_POINTS))
    multi.note.broadcast(99)  # a call_one to one actor right after does not overtake it
    last = multi.slice(hosts=3, procs=1, actors=2).seen.call_one().get(timeout=30)
    assert last[-1] == 99

    after = tree_stats()
    fanouts = rounds + 3
    tops = 2  # 4 hosts: two top relays of two hosts each
    sent = after.relay_messages - (before.relay_messages if before else 0)
    assert sent == fanouts * tops  # flat: fanouts * 8 procs (one GroupCall each)
    relayed = after.relayed - (before.relayed if before else 0)
    assert relayed == fanouts * M_HOSTS * M_PROCS  # the relays reach procs, not actors
    assert after.direct == (before.direct if before else 0)

    def settled() -> dict[int, ProcStatistics] | None:
        stats = proc_stats(agents, multi.proc_mesh)
        if len(stats) < M_HOSTS * M_PROCS:
            return None
        if any(calls_of(p, "note") < M_PER * (rounds + 1) for p in stats.values()):
            return None
        return stats

    stats = wait_for(settled, 15, "procs to report their counters")
    relays = [p for p in stats.values() if p.relayed]
    assert sorted(p.rank // M_PROCS for p in relays) == list(range(M_HOSTS))  # one per host
    assert all(p.relayed == fanouts for p in relays)
    # A top relay sends to its 2 procs and to the other host's relay; that one to its 2.
    assert sorted(p.forwarded for p in relays) == [fanouts * 2] * 2 + [fanouts * 3] * 2
    assert all(calls_of(p, "note") == M_PER * (rounds + 1) for p in stats.values())


def test_a_multi_actor_relays_own_actor_that_raises_fails_exactly_its_point(
    multi: zmesh.ActorMesh[Wide],
) -> None:
    """The relay's own proc's GroupCall runs in the relay: one of its actors
    fails alone, the others' answers are gathered with the rest."""
    rt, _ = _runtime.current()
    assert rt.tree is not None
    relay = rt.tree.relays[(multi.proc_mesh, multi._refs[0].agent)]
    assert relay.rank == 0  # host 0's relay is proc 0: points 0-2
    done, got, dupes = each_outcome(multi, "fail_at", 1)
    assert done.wait(30), f"only {len(got)} of {M_POINTS} points answered"
    assert not dupes
    assert {i for i, (ok, _) in got.items() if not ok} == {1}
    assert isinstance(got[1][1], zmesh.ActorError) and isinstance(got[1][1].cause, ValueError)
    assert all(got[i] == (True, i) for i in range(M_POINTS) if i != 1)


def received() -> int:
    """ZeroMQ messages this runtime's proc connections have received so far."""
    rt, _ = _runtime.current()
    return sum(c.sock.received for c in rt.conns.values() if c.sock is not None)


def appended(acc: list[int], r: int) -> list[int]:
    return [*acc, r]


def capped_add(a: int, b: int) -> int:
    if a + b > 50:
        raise ValueError(f"over 50: {a} + {b}")
    return a + b


def test_accumulate_folds_at_the_relays_one_value_per_top_relay(
    multi: zmesh.ActorMesh[Wide],
) -> None:
    want = sum(range(M_POINTS))
    before, got0 = tree_stats(), received()
    # Folding at the client: every actor's value comes back (gathered per proc and host).
    empty: list[int] = []
    listed = Accumulator(multi.snooze, empty, appended).accumulate(0)
    assert sorted(listed.get(timeout=30)) == list(range(M_POINTS))
    mid, got1 = tree_stats(), received()
    assert mid.answers - before.answers == M_HOSTS * M_PROCS and mid.folded == before.folded
    # Folding at the relays: one value per top relay reaches the client.
    total = Accumulator(multi.snooze, 1000, operator.add, associative=True).accumulate(0)
    assert total.get(timeout=30) == 1000 + want  # the identity counts once
    after, got2 = tree_stats(), received()
    assert after.folded - mid.folded == 2  # 4 hosts: two top relays
    assert after.answers == mid.answers
    assert got2 - got1 <= 2 * 2  # per top: its folded value (and, at most, its acknowledgements)
    assert got1 - got0 >= 2  # (gathered, the relays' answers come in as few messages)
    # combine's own error, raised at a relay, is raised as itself.
    with pytest.raises(ValueError, match="over 50"):
        Accumulator(multi.snooze, 0, capped_add, associative=True).accumulate(0).get(timeout=30)
    # The mesh goes on.
    assert multi.snooze.call(0).get(timeout=30).values() == list(range(M_POINTS))


def test_a_proc_killed_under_a_relay_fails_exactly_its_actors(
    multi: zmesh.ActorMesh[Wide],
) -> None:
    host, proc = 1, 1  # not its host's relay (that is the first proc there)
    rt, _ = _runtime.current()
    assert rt.tree is not None
    assert rt.tree.relays[(multi.proc_mesh, multi._refs[host * M_PROCS * M_PER].agent)].rank == (
        host * M_PROCS
    )
    pid = multi.slice(hosts=host, procs=proc, actors=0).pid.call_one().get(timeout=30)
    t0 = time.monotonic()
    done, got, dupes = each_outcome(multi, "snooze", 1.0)  # in flight on every actor
    time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    assert done.wait(15), f"only {len(got)} of {M_POINTS} points answered"
    assert time.monotonic() - t0 < 5.0
    assert not dupes
    failed = {i for i, (ok, _) in got.items() if not ok}
    assert failed == points_of(host, proc)
    for i in failed:
        err = got[i][1]
        assert isinstance(err, zmesh.SupervisionError) and err.rank == i, err
    assert all(got[i] == (True, i) for i in range(M_POINTS) if i not in failed)
    # The public call fails with one of them; the rest of the mesh goes on.
    with pytest.raises(zmesh.SupervisionError) as info:
        multi.snooze.call(0).get(timeout=20)
    assert info.value.rank in points_of(host, proc)
    alive = multi.slice(hosts=slice(2, 4)).snooze.call(0).get(timeout=20).values()
    assert alive == list(range(2 * M_PROCS * M_PER, M_POINTS))


def test_a_top_relay_killed_mid_call_fails_its_hosts_points_never_hangs(
    multi: zmesh.ActorMesh[Wide],
) -> None:
    host = 2  # the top relay of hosts 2 and 3
    rt, _ = _runtime.current()
    assert rt.tree is not None
    agent_of = multi._refs[host * M_PROCS * M_PER].agent
    assert rt.tree.top_of[(multi.proc_mesh, multi._refs[3 * M_PROCS * M_PER].agent)] == agent_of
    relay = rt.tree.relays[(multi.proc_mesh, agent_of)]
    proc = relay.rank % M_PROCS
    pid = multi.slice(hosts=host, procs=proc, actors=0).pid.call_one().get(timeout=30)
    below = multi.slice(hosts=slice(2, 4))
    t0 = time.monotonic()
    done, got, dupes = each_outcome(below, "snooze", 1.0)
    time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    n = len(below._refs)
    assert done.wait(15), f"only {len(got)} of {n} points answered"
    assert time.monotonic() - t0 < 5.0
    assert not dupes
    # Every point behind the dead relay fails (its own actors died; the others'
    # calls may or may not have run), each with its own rank.
    base = 2 * M_PROCS * M_PER
    assert all(not got[i][0] for i in range(n))
    assert {got[i][1].rank for i in range(n)} == set(range(base, M_POINTS))
    assert all(isinstance(got[i][1], zmesh.SupervisionError) for i in range(n))
    # Through a new relay on the same host: its other proc, and the host below.
    other = 1 - proc
    got_other = multi.slice(hosts=host, procs=other).snooze.call(0).get(timeout=20).values()
    assert got_other == sorted(points_of(host, other))
    assert multi.slice(hosts=3).snooze.call(0).get(timeout=20).values() == list(
        range(3 * M_PROCS * M_PER, M_POINTS)
    )


def test_a_dead_proc_behind_a_relay_fails_its_rank_fast(mesh: zmesh.ActorMesh[Wide]) -> None:
    victim = 5 * PROCS + 1  # not its host's relay (the first rank there)
    os.kill(mesh.slice(hosts=5, procs=1).pid.call_one().get(timeout=30), signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(zmesh.SupervisionError) as info:
        mesh.nap.call(0.5).get(timeout=20)
    assert info.value.rank == victim
    assert time.monotonic() - t0 < 3.0
    # The rest of the mesh goes on, through the same relays.
    rest = mesh.slice(hosts=slice(0, 5)).nap.call(0).get(timeout=20).values()
    assert rest == list(range(5 * PROCS))


def test_a_relay_killed_mid_fanout_fails_its_host_never_hangs(
    mesh: zmesh.ActorMesh[Wide],
) -> None:
    rt, _ = _runtime.current()
    assert rt.tree is not None
    host = 8  # a top relay's host: hosts 8-11 go through it
    assert rt.tree.top_of[(mesh.proc_mesh, mesh._refs[host * PROCS].agent)] == (
        mesh._refs[host * PROCS].agent
    )
    relay = rt.tree.relays[(mesh.proc_mesh, mesh._refs[host * PROCS].agent)]
    assert relay.rank // PROCS == host
    pid = mesh.slice(hosts=host, procs=relay.rank % PROCS).pid.call_one().get(timeout=30)
    call = mesh.slice(hosts=slice(6, 16)).nap.call(1.0)  # in flight on those procs
    for n in range(20):  # and broadcasts going out while the relay dies
        mesh.note.broadcast(n)
        if n == 10:
            os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(zmesh.SupervisionError) as info:  # ConnectionLostError is one too
        call.get(timeout=20)
    assert info.value.rank is not None and info.value.rank // PROCS == host
    assert time.monotonic() - t0 < 3.0
    # The host's other proc is reached through a new relay; the dead rank fails.
    other = host * PROCS + (1 - relay.rank % PROCS)
    got = mesh.slice(hosts=host, procs=other % PROCS).nap.call(0).get(timeout=20).values()
    assert got == [other]
    with pytest.raises(zmesh.SupervisionError):
        mesh.slice(hosts=host).nap.call(0).get(timeout=20)
    # Its other hosts too, through a new top relay on the same host.
    below = mesh.slice(hosts=slice(9, 16)).nap.call(0).get(timeout=20).values()
    assert below == list(range(9 * PROCS, 16 * PROCS))


def test_an_agent_killed_fails_its_hosts_calls_within_the_liveness_deadline(
    agents: list[AgentProcess], mesh: zmesh.ActorMesh[Wide]
) -> None:
    host = 12  # a top relay's host, with its agent: every proc there dies
    call = mesh.slice(hosts=slice(12, 16)).nap.call(1.0)
    agents[host].kill()
    t0 = time.monotonic()
    with pytest.raises(zmesh.SupervisionError) as info:
        call.get(timeout=20)
    assert info.value.rank is not None and info.value.rank // PROCS == host
    assert time.monotonic() - t0 < 4.0  # the agent's silence (1.2 s) plus slack
    below = mesh.slice(hosts=slice(13, 16)).nap.call(0).get(timeout=20).values()
    assert below == list(range(13 * PROCS, 16 * PROCS))


def test_a_relay_forwards_only_to_procs_of_its_mesh_on_its_host(
    agents: list[AgentProcess], mesh: zmesh.ActorMesh[Wide]
) -> None:
    """A relay is no way around the keys: it refuses any other target, sending nothing."""
    import zmq

    from zmesh._wire.codec import Codec

    relay, other_host = mesh._refs[0], mesh._refs[PROCS]
    codec = Codec(w.CLIENT_INBOX)
    body = codec.encode(w.Call(7, mesh.actor, "note", w.Payload((-4242,))))[0]
    refused = [
        w.RelayTarget(other_host.rank, other_host.generation, other_host.addr),  # another host's
        w.RelayTarget(relay.rank, relay.generation, agents[0].control),  # not its address
        w.RelayTarget(relay.rank, relay.generation + 1, relay.addr),  # not its generation
    ]
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(relay.addr)
    try:
        sock.send_multipart(codec.encode(w.Relay(7, relay.mesh, refused, body)))
        answers: dict[int, w.Failure] = {}
        deadline = time.monotonic() + 10
        while len(answers) < len(refused) and time.monotonic() < deadline:
            if sock.poll(500):
                for msg in codec.decode_frames(sock.recv_multipart()):
                    if isinstance(msg, w.RelayReply):  # each answer: the bytes sent
                        for k, raw in zip(msg.index, msg.answers, strict=False):
                            answers[k] = codec.decode([raw])
    finally:
        sock.close()
    assert sorted(answers) == [0, 1, 2]
    assert all(a.type == "RelayRefused" for a in answers.values()), answers
    # Nothing went anywhere: no actor ran note(-4242).
    seen = mesh.slice(hosts=slice(0, 2)).seen.call().get(timeout=20).values()
    assert all(-4242 not in s for s in seen)
