"""Errors a user meets, and that the actor (or agent) survives every one of them.

Remote exceptions, bad endpoint names and arguments, values that cannot be
sent, ``__init__`` failures, malformed frames on the wire, timeouts.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq

import zmesh
from zmesh._wire import messages as w
from zmesh._wire.codec import NONE, Codec

from _helpers import session_pids, wait_for
from _keptagents import stop_meshes

THIS_FILE = os.path.basename(__file__)


class Flaky(Exception):
    """A user's own exception type."""


def _deep_helper(message: str) -> None:
    raise ValueError(message)


class Faulty(zmesh.Actor):
    def __init__(self) -> None:
        self.calls = 0

    @zmesh.endpoint
    def explode(self, message: str) -> None:
        self.calls += 1
        _deep_helper(message)

    @zmesh.endpoint
    async def aexplode(self, message: str) -> None:
        self.calls += 1
        raise Flaky(message)

    @zmesh.endpoint
    def explode_on(self, rank: int) -> int:
        me = zmesh.current_rank().rank
        if me == rank:
            raise RuntimeError(f"rank {me} is unhappy")
        return me

    @zmesh.endpoint
    async def count(self) -> int:
        self.calls += 1
        return self.calls

    @zmesh.endpoint
    def add(self, a: int, b: int) -> int:
        return a + b

    @zmesh.endpoint
    async def aadd(self, a: int, b: int) -> int:
        return a + b

    @zmesh.endpoint
    def user_type_error(self) -> None:
        len(5)  # type: ignore[arg-type]

    @zmesh.endpoint
    def give_lock(self) -> Any:
        return threading.Lock()

    @zmesh.endpoint
    async def give_generator(self) -> Any:
        return (i for i in range(3))  # neither pickle nor cloudpickle carries one

    @zmesh.endpoint
    async def echo(self, x: Any) -> Any:
        return x

    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


class Sleepy(zmesh.Actor):
    def __init__(self) -> None:
        self.ran: list[str] = []

    @zmesh.endpoint
    async def sleep(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    @zmesh.endpoint
    async def mark(self, token: str) -> None:
        self.ran.append(token)

    @zmesh.endpoint
    async def marks(self) -> list[str]:
        return list(self.ran)


@pytest.fixture(autouse=True)
def _stop_everything() -> Iterator[None]:
    yield  # the module's procs outlive single tests; the fixture below stops them


@pytest.fixture(scope="module")
def procs() -> Iterator[zmesh.ProcMesh]:
    pm = zmesh.this_host().spawn_procs(per_host={"procs": 2}).get(timeout=60)
    yield pm
    stop_meshes()


@pytest.fixture(scope="module")
def faulty(procs: zmesh.ProcMesh) -> zmesh.ActorMesh[Faulty]:
    return procs.spawn("faulty", Faulty).get(timeout=30)


@pytest.fixture
def sleepy(procs: zmesh.ProcMesh) -> Iterator[zmesh.ActorMesh[Sleepy]]:
    """A fresh actor per test (a timed-out call may keep it busy a while)."""
    m = procs.spawn(f"sleepy-{uuid.uuid4().hex[:6]}", Sleepy).get(timeout=30)
    yield m.slice(procs=0)
    m.stop().get(timeout=10)


# ------------------------------------------------------- remote errors


def test_remote_traceback(faulty: zmesh.ActorMesh[Faulty]) -> None:
    one = faulty.slice(procs=1)
    before = one.count.call_one().get(timeout=10)
    with pytest.raises(zmesh.ActorError) as info:
        one.explode.call_one("the reactor is on fire").get(timeout=10)
    err = info.value
    assert err.remote_type == "ValueError"
    assert err.remote_message == "the reactor is on fire"
    assert err.endpoint == "explode"
    tb = err.remote_traceback
    assert "Traceback (most recent call last)" in tb
    assert "explode" in tb and "_deep_helper" in tb  # the user's frames
    assert THIS_FILE in tb
    assert "ValueError: the reactor is on fire" in tb
    assert err.mesh in (faulty.actor, faulty.proc_mesh)
    assert err.rank == 1
    assert isinstance(err.cause, ValueError)
    text = str(err)
    assert "the reactor is on fire" in text and "_deep_helper" in text and "rank=1" in text
    assert isinstance(err, zmesh.ZmeshError)
    # The actor is alive, with its state.
    assert one.count.call_one().get(timeout=10) == before + 2


@pytest.mark.anyio
async def test_remote_error_of_a_user_type_async(faulty: zmesh.ActorMesh[Faulty]) -> None:
    one = faulty.slice(procs=0)
    with pytest.raises(zmesh.ActorError) as info:
        await one.aexplode.call_one("flaky!")
    err = info.value
    assert err.remote_type.endswith("Flaky")
    assert err.remote_message == "flaky!"
    assert "aexplode" in err.remote_traceback and THIS_FILE in err.remote_traceback
    assert err.rank == 0
    assert type(err.cause).__name__ == "Flaky"
    assert await one.add.call_one(2, 3) == 5


def test_call_fails_with_the_failing_rank(faulty: zmesh.ActorMesh[Faulty]) -> None:
    with pytest.raises(zmesh.ActorError) as info:
        faulty.explode_on.call(1).get(timeout=10)
    assert info.value.rank == 1
    assert "rank 1 is unhappy" in info.value.remote_message
    # The other rank answered normally, and both keep serving.
    assert faulty.explode_on.call(5).get(timeout=10).values() == [0, 1]
    got = []
    with pytest.raises(zmesh.ActorError):
        for v in faulty.explode_on.stream(0):
            got.append(v)
    assert got in ([], [1])


def test_user_type_error_is_an_actor_error(faulty: zmesh.ActorMesh[Faulty]) -> None:
    # A TypeError raised inside the endpoint is the user's error, not bad arguments.
    with pytest.raises(zmesh.ActorError) as info:
        faulty.slice(procs=0).user_type_error.call_one().get(timeout=10)
    assert info.value.remote_type == "TypeError"
    assert "user_type_error" in info.value.remote_traceback


# ------------------------------------------------ endpoints and arguments


def test_unknown_endpoint_raises_at_attribute_access(faulty: zmesh.ActorMesh[Faulty]) -> None:
    with pytest.raises(zmesh.EndpointError) as info:
        faulty.no_such_thing  # type: ignore[attr-defined]  # noqa: B018
    assert "no_such_thing" in str(info.value)
    assert "explode" in str(info.value)  # it lists what exists
    with pytest.raises(AttributeError):
        faulty._private  # type: ignore[attr-defined]  # noqa: B018


def test_unknown_endpoint_on_the_wire(faulty: zmesh.ActorMesh[Faulty]) -> None:
    # An EndpointRef made by hand gets past the client: the actor refuses it.
    one: Any = faulty.slice(procs=0)  # the handle, not the class a checker sees
    ref: zmesh.EndpointRef[Any] = zmesh.EndpointRef(one, "vanished")
    with pytest.raises(zmesh.EndpointError, match="vanished"):
        ref.call_one().get(timeout=10)
    assert faulty.slice(procs=0).add.call_one(1, 1).get(timeout=10) == 2


@pytest.mark.parametrize("endpoint", ["add", "aadd"])
def test_wrong_arguments_raise_endpoint_error(
    faulty: zmesh.ActorMesh[Faulty], endpoint: str
) -> None:
    ep = getattr(faulty.slice(procs=1), endpoint)
    for args, kwargs in [((1,), {}), ((1, 2, 3), {}), ((1, 2), {"c": 3}), ((), {})]:
        with pytest.raises(zmesh.EndpointError) as info:
            ep.call_one(*args, **kwargs).get(timeout=10)
        assert endpoint in str(info.value)
        assert not isinstance(info.value, zmesh.ActorError)
    # Still serving, to the same caller and with the right arguments.
    assert ep.call_one(2, b=40).get(timeout=10) == 42


@pytest.mark.anyio
async def test_wrong_arguments_async_caller(faulty: zmesh.ActorMesh[Faulty]) -> None:
    with pytest.raises(zmesh.EndpointError, match="add"):
        await faulty.add.call(1)  # type: ignore[call-arg]
    assert (await faulty.add.call(1, 2)).values() == [3, 3]


UNSENDABLE = [
    pytest.param((i for i in range(3)), id="generator"),
    pytest.param(threading.Lock(), id="lock"),
    pytest.param([1, threading.Lock()], id="nested-lock"),
]


@pytest.mark.parametrize("bad", UNSENDABLE)
def test_unsendable_argument_raises_at_the_call_site(
    faulty: zmesh.ActorMesh[Faulty], bad: Any
) -> None:
    one = faulty.slice(procs=0)
    with pytest.raises(zmesh.EncodeError):
        one.echo.call_one(bad)  # raised here, not from a future
    with pytest.raises(zmesh.EncodeError):
        one.echo.call_one(x=bad)
    with pytest.raises(zmesh.EncodeError):
        faulty.echo.call(bad)
    with pytest.raises(zmesh.EncodeError):
        faulty.echo.choose(bad)
    with pytest.raises(zmesh.EncodeError):
        faulty.echo.broadcast(bad)
    with pytest.raises(zmesh.EncodeError):
        faulty.echo.stream(bad)
    assert one.echo.call_one("fine").get(timeout=10) == "fine"


@pytest.mark.anyio
async def test_unsendable_argument_async(faulty: zmesh.ActorMesh[Faulty]) -> None:
    with pytest.raises(zmesh.EncodeError, match="echo"):
        faulty.echo.call(threading.Lock())
    assert (await faulty.echo.call(1)).values() == [1, 1]


class Unpicklable:
    """A user's value whose pickling raises (as Monarch's test_broken_pickle_class)."""

    def __getstate__(self) -> dict[str, Any]:
        raise RuntimeError("__getstate__ error: not today")


def test_pickling_error_is_also_of_its_own_type(faulty: zmesh.ActorMesh[Faulty]) -> None:
    # Monarch raises the pickling error itself; zmesh's EncodeError is also
    # of its type, so either `except` catches it, and the message says both.
    one = faulty.slice(procs=0)
    calls = [lambda: one.echo.call_one(Unpicklable()), lambda: faulty.echo.call(Unpicklable())]
    for call in calls:
        with pytest.raises(RuntimeError, match="__getstate__ error") as info:
            call()
        assert isinstance(info.value, zmesh.EncodeError)
        assert "arguments of 'echo' cannot be sent: RuntimeError" in str(info.value)
    with pytest.raises(TypeError, match="cannot pickle") as lock:
        one.echo.call_one(threading.Lock())
    assert isinstance(lock.value, zmesh.EncodeError)
    assert one.echo.call_one("fine").get(timeout=10) == "fine"


@pytest.mark.parametrize("endpoint", ["give_lock", "give_generator"])
def test_unsendable_return_value(faulty: zmesh.ActorMesh[Faulty], endpoint: str) -> None:
    one = faulty.slice(procs=1)
    with pytest.raises(zmesh.EncodeError) as info:
        getattr(one, endpoint).call_one().get(timeout=10)
    assert endpoint in str(info.value)
    assert info.value.rank == 1
    assert one.add.call_one(20, 22).get(timeout=10) == 42


# ------------------------------------------------------- spawn failures


class Boom(zmesh.Actor):
    def __init__(self, on_rank: int | None = None) -> None:
        if on_rank is None or zmesh.current_rank().rank == on_rank:
            _no_gpu()

    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


def _no_gpu() -> None:
    raise RuntimeError("no GPU on this host")


@pytest.mark.parametrize("on_rank", [None, 1], ids=["every-rank", "rank-1-only"])
def test_init_failure_is_a_spawn_error_and_leaves_no_proc(on_rank: int | None) -> None:
    before = session_pids("proc")
    with pytest.raises(zmesh.SpawnError) as info:
        Boom.options(procs=2).as_actor(on_rank).get(timeout=60)
    text = str(info.value)
    assert "RuntimeError" in text and "no GPU on this host" in text
    assert "_no_gpu" in text and "__init__" in text and THIS_FILE in text  # remote traceback
    wait_for(lambda: session_pids("proc") <= before, 5, "the failed mesh's procs to exit")


@pytest.mark.anyio
async def test_init_failure_on_existing_procs_keeps_the_procs(procs: zmesh.ProcMesh) -> None:
    with pytest.raises(zmesh.SpawnError, match="no GPU on this host"):
        await procs.spawn("boom", Boom, 0)
    # The procs are the caller's to keep: they still host actors.
    m = await procs.spawn(f"ok-{uuid.uuid4().hex[:6]}", Boom, 99)
    assert len(set((await m.pid.call()).values())) == 2
    await m.stop()


# --------------------------------------------------- malformed frames


def _garbage() -> list[list[bytes]]:
    enc = msgspec.msgpack.Encoder()
    dangling = w.Call(
        7, "faulty", "echo", w.Payload(args=(msgspec.msgpack.Ext(1, (9).to_bytes(4, "little")),)),
        0.0, False,
    )  # fmt: skip
    return [
        [b""],
        [b"\xff\xfe\xfd"],
        [b"\xc1"],  # never-used msgpack byte
        [enc.encode(["NoSuchMessage", 1, 2])],
        [enc.encode({"msg": "Call"})],
        [enc.encode(w.Reply(1, NONE))],  # a valid message of the wrong kind
        [enc.encode(dangling)],  # an Ext pointing at a frame that is not there
        [b"\x91" * 100_000],  # very deep nesting
        [b"\xc1\x92\x01\x02"],  # a batch of things that are not messages
        [b"\xc1\x91" + enc.encode(dangling)],  # a batch may carry no Ext
        [b"\xc1" + b"\x91" * 100_000],  # a very deep batch
        [b"x" * 10, b"y" * 10, b"z" * 10],
        [os.urandom(4096) for _ in range(20)],
    ]


def _raw_dealer(addr: str) -> zmq.Socket:
    s: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    return s


def _request(sock: zmq.Socket, frames: list[bytes], timeout: float = 5.0) -> list[bytes]:
    sock.send_multipart(frames)
    assert sock.poll(int(timeout * 1000)), "no answer"
    return sock.recv_multipart()


def test_malformed_frames_to_the_agent_are_dropped(faulty: zmesh.ActorMesh[Faulty]) -> None:
    ref = faulty._refs[0]
    sock = _raw_dealer(ref.agent)
    try:
        for frames in _garbage():
            sock.send_multipart(frames)
        # The agent still answers, this very peer included.
        codec = Codec(w.AGENT_REPLIES)
        info = codec.decode(_request(sock, Codec(w.AGENT_INBOX).encode(w.Describe(99))))
        assert isinstance(info, w.AgentInfo) and info.id == 99
    finally:
        sock.close()
    # ...and its procs keep running and serving.
    assert faulty.count.call().get(timeout=10)
    assert faulty.state().status == zmesh.Status.RUNNING


def test_malformed_frames_to_a_proc_are_dropped(faulty: zmesh.ActorMesh[Faulty]) -> None:
    ref = faulty._refs[0]
    pid = faulty.slice(procs=0).pid.call_one().get(timeout=10)
    sock = _raw_dealer(ref.addr)
    try:
        for frames in _garbage():
            sock.send_multipart(frames)
        # A well-formed call from the same peer is still answered (after the
        # Failures that answer the garbage that looked like requests).
        call = w.Call(5, "faulty", "add", w.Payload(args=(40, 2)), 0.0, False)
        codec = Codec(w.CLIENT_INBOX)
        reply = codec.decode(_request(sock, Codec(w.PROC_INBOX).encode(call)))
        while isinstance(reply, w.Failure) and reply.id != 5:
            assert "bad Call" in reply.message
            assert sock.poll(5000), "no answer"
            reply = codec.decode(sock.recv_multipart())
        assert isinstance(reply, w.Reply) and reply.id == 5 and reply.payload.args == (42,)
    finally:
        sock.close()
    assert faulty.slice(procs=0).pid.call_one().get(timeout=10) == pid  # same process
    assert faulty.add.call(1, 1).get(timeout=10).values() == [2, 2]
    assert faulty.state().status == zmesh.Status.RUNNING


def test_a_batch_from_a_raw_peer_is_answered_in_order(faulty: zmesh.ActorMesh[Faulty]) -> None:
    """The batch format is plain: a mark byte, then a msgpack array of messages."""
    ref = faulty._refs[0]
    enc = msgspec.msgpack.Encoder()
    calls = [w.Call(i, "faulty", "add", w.Payload(args=(i, 100)), 0.0, False) for i in range(3)]
    sock = _raw_dealer(ref.addr)
    try:
        sock.send_multipart([b"\xc1" + enc.encode(calls)])
        codec = Codec(w.CLIENT_INBOX)
        got: list[tuple[int, int]] = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            if not sock.poll(1000):
                continue
            frame = sock.recv_multipart()[0]
            msgs = codec.decode_batch(frame) if frame[0] == 0xC1 else [codec.decode([frame])]
            got += [(m.id, m.payload.args[0]) for m in msgs]
        assert got == [(0, 100), (1, 101), (2, 102)]
    finally:
        sock.close()


# ------------------------------------------------------------ timeouts


def test_call_timeout_on_a_slow_async_endpoint(sleepy: zmesh.ActorMesh[Sleepy]) -> None:
    t0 = time.monotonic()
    with pytest.raises(zmesh.CallTimeoutError) as info:
        sleepy.sleep.options(timeout=0.2).call_one(5).get(timeout=10)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, zmesh.ZmeshError)


@pytest.mark.anyio
async def test_call_timeout_async(sleepy: zmesh.ActorMesh[Sleepy]) -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await sleepy.sleep.options(timeout=0.2).call_one(5)
    assert time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    with pytest.raises(zmesh.CallTimeoutError):
        await sleepy.sleep.options(timeout=0.2).call(5)  # fan-out adverbs too
    assert time.monotonic() - t0 < 1.0


def test_future_get_timeout(sleepy: zmesh.ActorMesh[Sleepy]) -> None:
    fut = sleepy.sleep.call_one(0.5)
    t0 = time.monotonic()
    with pytest.raises(zmesh.CallTimeoutError) as info:
        fut.get(timeout=0.1)
    assert time.monotonic() - t0 < 0.5
    assert isinstance(info.value, TimeoutError)
    # It says what it waited for: the proc, its host and log, the endpoint.
    ref = sleepy._refs[0]
    err = info.value
    assert (err.mesh, err.rank, err.host) == (ref.mesh, 0, ref.host)
    assert err.log_path == ref.log_path and "'sleep'" in str(err)
    # Giving up waiting does not cancel the call: its result still comes.
    assert fut.get(timeout=10) == 0.5


def test_future_get_timeout_of_a_fan_out_names_the_mesh(sleepy: zmesh.ActorMesh[Sleepy]) -> None:
    fut = sleepy.sleep.call(0.5)
    with pytest.raises(zmesh.CallTimeoutError) as info:
        fut.get(timeout=0.1)
    assert info.value.mesh == sleepy._refs[0].mesh and "'sleep'" in str(info.value)
    assert fut.get(timeout=10).values() == [0.5] * len(sleepy._refs)


def test_a_request_that_times_out_in_the_queue_never_runs(sleepy: zmesh.ActorMesh[Sleepy]) -> None:
    busy = sleepy.sleep.call_one(1.0)  # the actor handles one message at a time
    token = uuid.uuid4().hex
    with pytest.raises(zmesh.CallTimeoutError):
        sleepy.mark.options(timeout=0.2).call_one(token).get(timeout=10)
    assert busy.get(timeout=10) == 1.0
    assert token not in sleepy.marks.call_one().get(timeout=10)


def test_stopped_actor_raises_actor_stopped(procs: zmesh.ProcMesh) -> None:
    m = procs.spawn(f"short-{uuid.uuid4().hex[:6]}", Sleepy).get(timeout=30)
    assert m.sleep.call(0).get(timeout=10).values() == [0, 0]
    m.stop().get(timeout=10)
    with pytest.raises(zmesh.ActorStoppedError):
        m.sleep.call(0).get(timeout=10)
    with pytest.raises(zmesh.ActorStoppedError):
        m.slice(procs=0).sleep.call_one(0).get(timeout=10)
    # The procs were not the actor mesh's to stop: they keep hosting others.
    other = procs.spawn(f"other-{uuid.uuid4().hex[:6]}", Sleepy).get(timeout=30)
    assert other.sleep.call(0).get(timeout=10).values() == [0, 0]
    other.stop().get(timeout=10)


class SlowInit(zmesh.Actor):
    def __init__(self) -> None:
        time.sleep(60)

    @zmesh.endpoint
    def ping(self) -> int:
        return 1


def test_init_that_never_returns_fails_the_spawn_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import zmesh._client.control.spawning

    monkeypatch.setattr(zmesh._client.control.spawning, "INIT_TIMEOUT", 1.0)
    before = session_pids("proc")
    t0 = time.monotonic()
    with pytest.raises(zmesh.SpawnError) as info:
        SlowInit.options(procs=2).as_actor().get(timeout=30)
    assert time.monotonic() - t0 < 10
    assert "no reply within 1.0s" in str(info.value)
    # The procs made for the failed spawn are stopped.
    wait_for(lambda: session_pids("proc") <= before, 10, "the spawned procs to go")
