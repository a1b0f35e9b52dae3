"""Fuzz: random and mutated messages to a real agent's and a real proc's ROUTER.

10,000 messages to each (see ``_fuzz_frames``), sent over real sockets the
way any client connects. After every chunk a normal request must still be
answered; at the end both processes must be alive and serving (a call
through zmesh, ``GetState``), the proc must be the same process in the same
generation, and neither may have grown by 10 MB (VmRSS, after a warm-up).

The seed is printed and fixed: ``ZMESH_FUZZ_SEED=<seed>`` replays a failure
(the messages depend on the seed only), ``ZMESH_FUZZ_FRAMES`` sets the count.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest
import zmq
from _fuzz_frames import Frames, harmless

import zmesh
from zmesh._client.control import local as _local
from zmesh._shared.state import Status
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec
from zmesh._wire.security import secure_client
from zmesh._wire.zsock import BATCH_MARK, configure
from zmesh.testing import local_cluster

from _helpers import pid_alive

pytestmark = pytest.mark.stress

SEED = int(os.environ.get("ZMESH_FUZZ_SEED", "1107"))
FRAMES = int(os.environ.get("ZMESH_FUZZ_FRAMES", "10000"))
WARMUP = 1000
CHUNK = 250  # messages between two checks that the receiver still answers
RSS_LIMIT = 10 * 1024 * 1024
ACTOR = "fuzz-target"


class Target(zmesh.Actor):
    @zmesh.endpoint
    async def ping(self) -> str:
        return "pong"

    @zmesh.endpoint
    async def echo(self, *args: Any, **kwargs: Any) -> Any:
        return args  # whatever arrived goes back: the reply path gets odd values too

    @zmesh.endpoint
    def work(self, n: int = 0) -> int:  # a sync endpoint: a worker thread
        return n


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class Peer:
    """A raw DEALER to one ROUTER, and the question that proves it still serves."""

    def __init__(self, ctx: zmq.Context[Any], addr: str, pid: int, name: str) -> None:
        self.sock = secure_client(configure(ctx.socket(zmq.DEALER)))
        self.sock.connect(addr)
        self.pid = pid
        self.name = name
        self.sent = 0
        self.codec = Codec(w.AGENT_REPLIES if name == "agent" else w.CLIENT_INBOX)
        self.probes = 0

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames, copy=True)
        self.sent += 1
        self.drain()

    def drain(self) -> list[Any]:
        """Read (and mostly discard) whatever answers came back."""
        got = []
        while self.sock.poll(0):
            got.append(self.sock.recv_multipart())
        return got

    def probe(self, context: str, timeout: float = 20.0, msg: Any = None) -> Any:
        """A well-formed request; its answer, or a failure that names the seed."""
        self.probes += 1
        pid = 8_000_000_000 + self.probes  # no fuzzed message uses such an id
        if msg is not None:
            msg = msg(pid)
        elif self.name == "agent":
            msg = w.GetState(pid)
        else:
            msg = w.Call(pid, ACTOR, "ping", w.Payload())
        self.sock.send_multipart(self.codec.encode(msg))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.sock.poll(100):
                continue
            frames = self.sock.recv_multipart()
            try:
                if frames[0][:1] == bytes([BATCH_MARK]):  # replies coalesced by the proc
                    replies = self.codec.decode_batch(frames[0])
                else:
                    replies = [self.codec.decode(frames)]
            except Exception:
                continue
            for reply in replies:
                if getattr(reply, "id", None) == pid:
                    return reply
        raise AssertionError(
            f"the {self.name} (pid {self.pid}) stopped answering {context} "
            f"(seed {SEED}; replay with ZMESH_FUZZ_SEED={SEED})"
        )

    def close(self) -> None:
        self.sock.close(linger=0)


def fuzz(peer: Peer, frames: Frames, inbox: Any, forbidden: set[str], n: int, phase: str) -> None:
    kinds: dict[str, int] = {}
    recent: list[str] = []
    for i in range(n):
        kind, msg = frames.next()
        while not harmless(msg, inbox, forbidden):
            kind, msg = frames.next()
        kinds[kind] = kinds.get(kind, 0) + 1
        recent = [*recent[-7:], kind]
        peer.send(msg)
        if (i + 1) % CHUNK == 0 or i + 1 == n:
            peer.probe(f"after {phase} message {i + 1} (the last kinds: {recent})")
    print(f"FUZZ {peer.name} {phase}: {n} messages {dict(sorted(kinds.items()))}")


def test_fuzzed_agent_and_proc_stay_alive_and_serving() -> None:
    print(f"FUZZ seed {SEED} (replay: ZMESH_FUZZ_SEED={SEED}), {FRAMES} messages to each")
    rng = random.Random(SEED)
    ctx: zmq.Context[Any] = zmq.Context.instance()
    with local_cluster(1) as agents:
        agent = agents[0]
        procs = zmesh.this_host().spawn_procs({"procs": 1}).get(timeout=60)
        mesh = procs.spawn(ACTOR, Target).get(timeout=60)
        assert mesh.ping.call_one().get(timeout=30) == "pong"
        before = procs.state().ranks[0]
        assert before.status is Status.RUNNING and before.pid and before.addr
        forbidden = {procs.name, ACTOR, _local.owner_id()}
        targets = [
            (Peer(ctx, agent.control, agent.pid, "agent"), w.AGENT_INBOX, {}),
            (Peer(ctx, before.addr, before.pid, "proc"), w.PROC_INBOX,
             {"actor": [ACTOR], "method": ["ping", "echo", "work", "nope"], "deadline": [0.0]}),
        ]  # fmt: skip
        try:
            grew = {}
            for peer, inbox, known in targets:
                frames = Frames(rng, inbox, known)
                fuzz(peer, frames, inbox, forbidden, WARMUP, "warm-up")
                start = rss(peer.pid)
                t0 = time.monotonic()
                fuzz(peer, frames, inbox, forbidden, FRAMES, "fuzz")
                took = time.monotonic() - t0
                grew[peer.name] = rss(peer.pid) - start
                print(f"FUZZ {peer.name}: {took:.1f}s, RSS {start / 2**20:.1f} MiB "
                      f"-> {(start + grew[peer.name]) / 2**20:.1f} MiB")  # fmt: skip
            # Both still serve, through zmesh as a user would see it.
            assert mesh.ping.call_one().get(timeout=30) == "pong"
            assert mesh.echo.call_one(1, b"x").get(timeout=30) == (1, b"x")
            assert mesh.work.call_one(7).get(timeout=30) == 7
            reply = targets[0][0].probe("at the end")
            mine = [m for m in reply.meshes if m.name == procs.name]
            assert mine and [r.status for r in mine[0].ranks] == ["Running"], reply
            # The fuzz reached the proc's decoder and its endpoints (its
            # statistics reach the agent about once a second).
            deadline = time.monotonic() + 15.0
            while True:
                stats = targets[0][0].probe("GetStats", msg=w.GetStats).stats
                mine_stats = [p for p in stats.procs if p.mesh == procs.name]
                calls = sum(e.calls for p in mine_stats for a in p.actors for e in a.endpoints)
                dropped = sum(p.dropped for p in mine_stats)
                if dropped > FRAMES // 2 and calls > FRAMES // 200:
                    break
                assert time.monotonic() < deadline, (dropped, calls)
                time.sleep(0.2)
            print(f"FUZZ proc dropped {dropped} messages, ran {calls} calls")
            after = procs.state().ranks[0]
            assert (after.status, after.pid, after.generation) == (
                Status.RUNNING, before.pid, before.generation,
            ), f"the proc did not survive (seed {SEED}): {after}"  # fmt: skip
            assert pid_alive(before.pid) and pid_alive(agent.pid)
            # Nothing escaped to the loop (a reader that raised would stall).
            for path in (before.log_path, os.path.join(agent.log_dir, "agent.log")):
                with open(path, errors="replace") as f:
                    text = f.read()
                assert "Exception in callback" not in text and "Traceback" not in text, (
                    f"{path} (seed {SEED}):\n{text[-3000:]}"
                )
            for name, growth in grew.items():
                assert growth < RSS_LIMIT, (
                    f"the {name} grew by {growth / 2**20:.1f} MiB over {FRAMES} fuzzed "
                    f"messages (seed {SEED})"
                )
        finally:
            for peer, _, _ in targets:
                peer.close()
            procs.stop().get(timeout=30)
