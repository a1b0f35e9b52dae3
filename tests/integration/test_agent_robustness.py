"""Crafted messages to a real agent and a real proc, from a raw DEALER.

Every field of every message is checked when it is decoded: a request with
a wrong-typed or out-of-range field gets an error reply (``Ack`` with
``ok=False``, or ``Failure`` from a proc) that names the field, and the same
peer's later messages are served. Names are restricted to a safe character
set, so no name writes anything outside the agent's log directory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

import zmesh
from zmesh._shared import ownership
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec
from zmesh.testing import AgentProcess, start_agent, stop_agent

ENC = msgspec.msgpack.Encoder()
REPLIES = Codec(w.AGENT_REPLIES)
# An owner id is made from its secret (zmesh._shared.ownership): "s3cret" here.
SPEC = {
    "owner": ownership.owner_id("attacker", 1, "s3cret"),
    "ranks": [0],
    "dims": {"hosts": 1, "procs": 1},
}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    """One agent for the module: every attack below is made on the agent the
    earlier ones were made on, and it must serve each next one."""
    root = tmp_path_factory.mktemp("robust")
    a = start_agent("robust", log_dir=str(root / "logs" / "agent"))
    yield a
    stop_agent(a)


def _dealer(addr: str) -> zmq.Socket:
    s: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    return s


def _ask(sock: zmq.Socket, frames: list[bytes], timeout: float = 5.0) -> Any:
    sock.send_multipart(frames)
    assert sock.poll(int(timeout * 1000)), f"no answer to {frames!r}"
    return REPLIES.decode(sock.recv_multipart())


def _create(req_id: int, name: Any, **spec: Any) -> list[bytes]:
    # With an owner's secret: a request without one is refused before its spec is read.
    return [ENC.encode(["CreateOrUpdate", req_id, name, {**SPEC, **spec}, "s3cret"])]


def _still_serves(sock: zmq.Socket) -> None:
    info = _ask(sock, [ENC.encode(["Describe", 4242])])
    assert isinstance(info, w.AgentInfo) and info.id == 4242


BAD_CREATES: dict[str, tuple[Any, dict[str, Any], str]] = {
    # what: (name, spec fields, words the error names)
    "main of a wrong type": ("m1", {"main": {"x": b""}}, "main"),
    "main not an object": ("m2", {"main": [1, 2]}, "main"),
    "sys_path of ints": ("m3", {"main": {"sys_path": [1]}}, "sys_path"),
    "dir with a NUL": ("m4", {"main": {"dir": "/tmp\x00x"}}, "dir"),
    "negative rank": ("m5", {"ranks": [-1]}, "ranks"),
    "rank as a string": ("m6", {"ranks": ["0"]}, "ranks"),
    "no rank": ("m7", {"ranks": []}, "ranks"),
    "the same rank twice": ("m8", {"ranks": [0, 0]}, "twice"),
    "rank outside the dims": ("m9", {"ranks": [5]}, "dims"),
    "a dim of size 0": ("m10", {"dims": {"procs": 0}}, "dims"),
    "env name with '='": ("m11", {"env": {"A=B": "x"}}, "env"),
    "env value with a NUL": ("m12", {"env": {"A": "x\x00y"}}, "env"),
    "env value not a string": ("m13", {"env": {"A": 1}}, "env"),
    "owner missing": ("m14", {"owner": None}, "owner"),
    "an unknown field": ("m15", {"surprise": 1}, "surprise"),
    "a path in the name": ("../../escaped", {}, "name"),
    "a slash in the name": ("a/b", {}, "name"),
    "dots in the name": ("..", {}, "name"),
    "an empty name": ("", {}, "name"),
    "a long name": ("n" * 200, {}, "name"),
    "a name that is not a string": (7, {}, "name"),
}


@pytest.mark.parametrize("what", list(BAD_CREATES))
def test_a_bad_create_gets_an_error_reply_and_the_peer_is_served(
    agent: AgentProcess, what: str
) -> None:
    name, spec, word = BAD_CREATES[what]
    sock = _dealer(agent.control)
    try:
        before = _ask(sock, [ENC.encode(["GetState", 6, ""])])
        reply = _ask(sock, _create(7, name, **spec))
        assert isinstance(reply, w.Ack) and reply.id == 7 and not reply.ok, reply
        assert word in reply.error, reply.error
        _still_serves(sock)
        state = _ask(sock, [ENC.encode(["GetState", 8, ""])])
        assert (
            isinstance(state, w.StateReply) and state.meshes == before.meshes
        )  # nothing half-made
    finally:
        sock.close()
    # Nothing was written anywhere but in the agent's own log directory.
    logs = Path(agent.log_dir)
    root = logs.parents[1]
    stray = [p for p in root.rglob("*") if p.is_file() and logs not in p.parents and p != logs]
    assert stray == []


BAD_REQUESTS: dict[str, list[Any]] = {
    "GetState with an int name": ["GetState", 11, 5],
    "Stop with bytes": ["Stop", 12, b"x"],
    "Stop of a path": ["Stop", 13, "../x"],
    "Describe with a string id": ["Describe", "x"],
    "GetStats with a float id": ["GetStats", 1.5],
}


@pytest.mark.parametrize("what", list(BAD_REQUESTS))
def test_a_bad_request_gets_an_error_reply(agent: AgentProcess, what: str) -> None:
    msg = BAD_REQUESTS[what]
    sock = _dealer(agent.control)
    try:
        if isinstance(msg[1], int):
            reply = _ask(sock, [ENC.encode(msg)])
            assert isinstance(reply, w.Ack) and reply.id == msg[1] and not reply.ok, reply
            assert msg[0] in reply.error
        else:  # no usable id: nothing to answer, but the peer is still served
            sock.send_multipart([ENC.encode(msg)])
        _still_serves(sock)
    finally:
        sock.close()


BAD_NOTES: dict[str, list[Any]] = {
    # Messages that expect no reply: dropped, and the peer is still served.
    "ProcHello with a string rank": ["ProcHello", "m", "0", 1, "tcp://x:1", 1],
    "ProcHeartbeat with a negative rank": ["ProcHeartbeat", "m", -1, 1],
    "OwnerHeartbeat with no owner": ["OwnerHeartbeat", None],
    "OwnerGone with an int": ["OwnerGone", 5],
    "ProcStats of garbage": ["ProcStats", {"mesh": 1}],
    "ServiceReport of garbage": ["ServiceReport", [1, 2]],
}


@pytest.mark.parametrize("what", list(BAD_NOTES))
def test_a_bad_note_is_dropped_and_the_peer_is_served(agent: AgentProcess, what: str) -> None:
    sock = _dealer(agent.control)
    try:
        sock.send_multipart([ENC.encode(BAD_NOTES[what])])
        _still_serves(sock)
    finally:
        sock.close()


def test_a_good_create_after_bad_ones_works(agent: AgentProcess) -> None:
    sock = _dealer(agent.control)
    try:
        for i, (name, spec, _) in enumerate(BAD_CREATES.values()):
            assert not _ask(sock, _create(100 + i, name, **spec)).ok
        ok = _ask(sock, _create(1, "good-one", owner=ownership.owner_id("raw", 1, "s3cret")))
        assert isinstance(ok, w.Ack) and ok.ok, ok.error
        stop = _ask(sock, [ENC.encode(["Stop", 2, "good-one", "s3cret"])])
        assert stop.ok
    finally:
        sock.close()


# --------------------------------------------------------------- procs


class Echo(zmesh.Actor):
    @zmesh.endpoint
    def echo(self, x: object) -> object:
        return x


BAD_PROC_MSGS: dict[str, list[Any]] = {
    "SpawnActor with a path as its name": ["SpawnActor", 21, "../x", b"", [], "m", {}, 0],
    "SpawnActor with a negative rank": ["SpawnActor", 22, "a", b"", [], "m", {}, -1],
    "SpawnActor with a dim of size 0": ["SpawnActor", 23, "a", b"", [], "m", {"procs": 0}, 0],
    "Call with a negative buffer count": ["Call", 24, "echo", "echo", [[], {}, None, -1]],
    "Call with a string payload": ["Call", 25, "echo", "echo", "payload"],
    "StopActor with an int name": ["StopActor", 26, 5],
}


@pytest.mark.parametrize("what", list(BAD_PROC_MSGS))
def test_a_bad_request_to_a_proc_gets_a_failure(what: str) -> None:
    mesh = Echo.options().as_actor().get(timeout=60)
    msg = BAD_PROC_MSGS[what]
    sock = _dealer(mesh._refs[0].addr)
    try:
        sock.send_multipart([ENC.encode(msg)])
        assert sock.poll(5000), "no answer"
        reply = Codec(w.CLIENT_INBOX).decode(sock.recv_multipart())
        assert isinstance(reply, w.Failure) and reply.id == msg[1], reply
        assert msg[0] in reply.message
        call = w.Call(5, "echo", "echo", w.Payload(args=(42,)))
        sock.send_multipart(Codec(w.PROC_INBOX).encode(call))
        assert sock.poll(5000)
        again = Codec(w.CLIENT_INBOX).decode(sock.recv_multipart())
        assert isinstance(again, w.Reply) and again.payload.args == (42,)
    finally:
        sock.close()
    assert mesh.echo.call_one(1).get(timeout=10) == 1
    mesh.stop().get(timeout=10)


# ------------------------------------------------------ client-side names


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", "", "n" * 200, "sp ace", "é"])
def test_a_bad_name_is_refused_before_anything_is_sent(name: str) -> None:
    with pytest.raises(ValueError, match="name"):
        Echo.options(name=name)
    with pytest.raises(ValueError, match="name"):
        zmesh.this_host().spawn_procs(name=name)
    procs = zmesh.this_host().spawn_procs().get(timeout=60)
    try:
        with pytest.raises(ValueError, match="name"):
            procs.spawn(name, Echo)
    finally:
        procs.stop().get(timeout=10)


def test_a_class_name_that_is_no_safe_name_gets_a_safe_default() -> None:
    cls: type[Echo] = type("Zähler", (Echo,), {})
    opts = cls.options()
    assert opts.name and all(c.isascii() for c in opts.name)
    assert os.sep not in opts.name


# ------------------------------------------------------------- mutations

ODD_VALUES: list[Any] = [
    None, -1, 0, 2**64 - 1, 1.5, True, "", "../x", "a" * 300, "\x00", b"", b"\x00" * 10,
    [], [1, "a"], {}, {"x": b""}, {"": None}, {"procs": -3}, [[[]]],
]  # fmt: skip

AGENT_SEEDS: list[list[Any]] = [
    ["CreateOrUpdate", 1, "fuzz", {**SPEC, "main": {"sys_path": ["/x"], "dir": "/"},
                                   "env": {"A": "b"}, "host_index": 0}],
    ["GetState", 1, ""], ["Stop", 1, "fuzz"], ["ListMeshes", 1], ["Describe", 1],
    ["GetStats", 1], ["OwnerHeartbeat", "o"], ["OwnerGone", "nobody"],
    ["ProcHello", "fuzz", 0, 1, "tcp://127.0.0.1:1", 1], ["ProcHeartbeat", "fuzz", 0, 1],
]  # fmt: skip


def _mutate(rng: Any, msg: Any, depth: int = 0) -> Any:
    """``msg`` with one value somewhere in it (never the tag) replaced by an odd one."""
    if isinstance(msg, list) and len(msg) > (1 if depth == 0 else 0):
        msg = list(msg)
        i = rng.randrange(1 if depth == 0 else 0, len(msg))
        go_deeper = isinstance(msg[i], list | dict) and msg[i] and rng.random() < 0.5
        msg[i] = _mutate(rng, msg[i], depth + 1) if go_deeper else rng.choice(ODD_VALUES)
    elif isinstance(msg, dict) and msg:
        msg = dict(msg)
        k = rng.choice(list(msg))
        if rng.random() < 0.2:
            msg[rng.choice(["x", "", "owner", "\x00"])] = rng.choice(ODD_VALUES)  # a new key
        elif isinstance(msg[k], list | dict) and msg[k] and rng.random() < 0.5:
            msg[k] = _mutate(rng, msg[k], depth + 1)
        else:
            msg[k] = rng.choice(ODD_VALUES)
    return msg


def _send_mutations(
    sock: zmq.Socket, rng: Any, seeds: list[Any], answered: Callable[[Any], bool]
) -> set[int]:
    """Send 2000 mutations of ``seeds``; the ids of those that must be answered.

    A mutation that is still a request (``answered(msg)``, with an int id) gets
    a fresh id, to count the answers.
    """
    asked: set[int] = set()
    for n in range(2000):
        msg = _mutate(rng, rng.choice(seeds))
        if type(msg[1]) is int and answered(msg):
            msg[1] = 10_000 + n
            asked.add(msg[1])
        sock.send_multipart([ENC.encode(msg)])
    return asked


def _expect_answers(
    sock: zmq.Socket, asked: set[int], ids: Callable[[list[bytes]], list[int]]
) -> None:
    """Read answers (``ids`` of each message) until every one ``asked`` came, or fail."""
    answered: set[int] = set()
    deadline = time.monotonic() + 30
    while not asked <= answered and time.monotonic() < deadline:
        if sock.poll(500):
            answered.update(ids(sock.recv_multipart()))
    assert asked <= answered, f"{len(asked - answered)} requests got no answer"


@pytest.mark.stress
def test_mutated_fields_to_an_agent_are_each_answered_or_dropped(agent: AgentProcess) -> None:
    import random

    rng = random.Random(11)
    sock = _dealer(agent.control)
    try:
        asked = _send_mutations(sock, rng, AGENT_SEEDS, lambda msg: msg[0] in w.AGENT_REQUESTS)
        _expect_answers(sock, asked, lambda frames: [REPLIES.decode(frames).id])
        _still_serves(sock)
        for name in ("fuzz",):  # a mutation may have been a valid spawn
            _ask(sock, [ENC.encode(["Stop", 1, name])])
    finally:
        sock.close()


@pytest.mark.stress
def test_mutated_fields_to_a_proc_are_each_answered_or_dropped() -> None:
    import random

    mesh = Echo.options().as_actor().get(timeout=60)
    rng = random.Random(12)
    seeds: list[list[Any]] = [
        ["Call", 1, "echo", "echo", [[1], {}, None, 0], 0.0, False, ""],
        ["SpawnActor", 1, "fuzzed", b"\x80", [[], {}, None, 0], "m", {"procs": 1}, 0],
        ["StopActor", 1, "nobody"],
    ]
    sock = _dealer(mesh._refs[0].addr)
    codec = Codec(w.CLIENT_INBOX)

    def ids(frames: list[bytes]) -> list[int]:
        if frames[0][:1] == b"\xc1":  # a proc batches its answers
            return [m.id for m in codec.decode_batch(frames[0])]
        return [codec.decode(frames).id]

    try:
        asked = _send_mutations(
            sock, rng, seeds, lambda msg: not (msg[0] == "Call" and len(msg) > 6 and msg[6] is True)
        )
        _expect_answers(sock, asked, ids)
        assert mesh.echo.call_one(7).get(timeout=10) == 7
    finally:
        sock.close()
        mesh.stop().get(timeout=10)


def test_a_secret_in_any_characters_is_refused_not_a_crash(agent: AgentProcess) -> None:
    # Secrets are compared in constant time; hmac.compare_digest raises
    # TypeError on non-ASCII str, which once escaped the agent's handlers.
    odd = "s\u00e9cret-\u2603"
    sock = _dealer(agent.control)
    try:
        spec = {**SPEC, "owner": ownership.owner_id("odd", 1, odd)}
        made = _ask(sock, [ENC.encode(["CreateOrUpdate", 21, "odd", spec, odd])])
        assert isinstance(made, w.Ack) and made.ok, made  # an owner id made from it
        again = _ask(sock, [ENC.encode(["CreateOrUpdate", 22, "odd", spec, "s3cret"])])
        assert isinstance(again, w.Ack) and not again.ok  # another secret: not the owner
        for req_id, msg in [
            (23, ["Stop", 23, "odd", "\u00e9"]),  # neither the owner's nor the operator's
            (24, ["StopDetached", 24, "x", "\u00e9", "\u00e9"]),
            (25, ["Lookup", 25, "x", "\u00e9"]),
        ]:
            reply = _ask(sock, [ENC.encode(msg)])
            assert reply.id == req_id and not reply.ok, reply
        stopped = _ask(sock, [ENC.encode(["Stop", 26, "odd", odd])])
        assert isinstance(stopped, w.Ack) and stopped.ok, stopped  # the owner may
        _still_serves(sock)
    finally:
        sock.close()
    log = Path(agent.log_dir) / "agent.log"
    assert "Traceback" not in log.read_text(errors="replace")
