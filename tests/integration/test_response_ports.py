"""An explicit response port never leaves its caller waiting for ever (issue 23 item 5).

``@endpoint(explicit_response_port=True)`` answers through its port. An
endpoint that returns a value instead, or drops the port (garbage collected)
with nothing sent, fails its call with ``ResponsePortError`` naming the
endpoint and the mistake, at once, whether the port went before the endpoint
returned or later; a port kept and forgotten is bounded by the call's
timeout (``CallTimeoutError``), and without one the caller's log says the
call still waits. A second answer on the port raises at the sender. Real
procs: one actor, a mesh (``call``), several actors per proc, a sync and an
async endpoint, and a port handed on to another actor (no false alarm).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import zmesh
from zmesh import Port
from zmesh._client.ports import portcalls as _portcalls
from zmesh.testing import local_mesh

pytestmark = pytest.mark.anyio

PROMPT = 5.0  # an error "at once" arrives well within this, even on a loaded machine


class Answerer(zmesh.Actor):
    def __init__(self) -> None:
        self.kept: list[Port[Any]] = []
        self.refused: list[str] = []

    @zmesh.endpoint(explicit_response_port=True)
    async def returns(self, port: Port[int], x: int) -> Any:  # (typed -> None, rightly)
        return x  # the mistake: returned, never sent

    @zmesh.endpoint(explicit_response_port=True)
    def returns_sync(self, port: Port[int], x: int) -> Any:
        return x

    @zmesh.endpoint(explicit_response_port=True)
    async def drops(self, port: Port[int], x: int) -> None:
        del port  # the mistake: nothing sent, nothing kept

    @zmesh.endpoint(explicit_response_port=True)
    def drops_sync(self, port: Port[int], x: int) -> None:
        pass

    @zmesh.endpoint(explicit_response_port=True)
    async def keeps(self, port: Port[int], x: int) -> None:
        self.kept.append(port)  # the mistake, maybe: kept, and (so far) forgotten

    @zmesh.endpoint
    async def forget(self) -> int:
        """Let go of the kept ports (they are garbage collected, unsent)."""
        n = len(self.kept)
        self.kept.clear()
        gc.collect()
        return n

    @zmesh.endpoint
    async def answer_kept(self, value: int) -> None:
        for port in self.kept:
            port.send(value)
        self.kept.clear()

    @zmesh.endpoint(explicit_response_port=True)
    async def twice(self, port: Port[int], x: int) -> None:
        port.send(x)
        try:
            port.send(x + 1)
        except zmesh.ResponsePortError as exc:
            self.refused.append(str(exc))

    @zmesh.endpoint(explicit_response_port=True)
    def twice_sync(self, port: Port[int], x: int) -> None:
        port.send(x)
        try:
            port.send(x + 1)
        except ValueError as exc:  # (a ResponsePortError is a ValueError too)
            self.refused.append(str(exc))

    @zmesh.endpoint
    async def refusals(self) -> list[str]:
        return list(self.refused)

    @zmesh.endpoint(explicit_response_port=True)
    async def later(self, port: Port[int], x: int) -> None:
        async def answer() -> None:
            await asyncio.sleep(0.05)
            port.send(x * x)  # answers after the endpoint returned: fine

        self.task = asyncio.get_running_loop().create_task(answer())

    @zmesh.endpoint(explicit_response_port=True)
    async def delegate(self, port: Port[int], helper: Any, x: int) -> None:
        await helper.send_on.call_one(port, x)  # the port is handed on: the helper answers

    @zmesh.endpoint
    async def send_on(self, port: Port[int], x: int) -> None:
        port.send(x + 100)

    @zmesh.endpoint(explicit_response_port=True)
    async def sends_then_returns(self, port: Port[int], x: int) -> Any:
        port.send(x)
        return x  # ignored (logged): the port answered

    @zmesh.endpoint
    async def ping(self) -> str:
        return "pong"


@pytest.fixture
async def one() -> AsyncIterator[Any]:
    mesh = await Answerer.options().as_actor()
    yield mesh
    await mesh.stop()


async def fails_at_once(fut: Any, mistake: str, endpoint: str) -> zmesh.ResponsePortError:
    t0 = time.monotonic()
    with pytest.raises(zmesh.ResponsePortError) as info:
        await asyncio.wait_for(fut, PROMPT)
    assert time.monotonic() - t0 < PROMPT
    err = info.value
    assert err.mistake == mistake and err.endpoint == endpoint
    assert f"Answerer.{endpoint}" in str(err)
    assert isinstance(err, zmesh.EndpointError) and err.mesh and err.rank is not None
    return err


@pytest.mark.parametrize("endpoint", ["returns", "returns_sync"])
async def test_a_value_returned_instead_of_sent_fails_the_call(one: Any, endpoint: str) -> None:
    err = await fails_at_once(getattr(one, endpoint).call_one(7), "returned a value", endpoint)
    assert "returned 7" in str(err) and "port.send(value)" in str(err)
    assert await one.ping.call_one() == "pong"  # the actor serves on


@pytest.mark.parametrize("endpoint", ["drops", "drops_sync"])
async def test_a_port_dropped_unsent_fails_the_call_at_once(one: Any, endpoint: str) -> None:
    await fails_at_once(getattr(one, endpoint).call_one(1), "dropped the port", endpoint)
    assert await one.ping.call_one() == "pong"


async def test_a_kept_port_dropped_later_fails_the_call_then(one: Any) -> None:
    waiting = asyncio.ensure_future(one.keeps.call_one(1))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # kept: it may still answer
    assert await one.forget.call_one() == 1
    await fails_at_once(waiting, "dropped the port", "keeps")


async def test_a_kept_port_answered_later_answers(one: Any) -> None:
    waiting = asyncio.ensure_future(one.keeps.call_one(1))
    await asyncio.sleep(0.2)
    await one.answer_kept.call_one(42)
    assert await asyncio.wait_for(waiting, PROMPT) == 42


@pytest.mark.chaos
@pytest.mark.parametrize("whole", [False, True], ids=["call_one", "call"])
async def test_a_kept_port_whose_proc_dies_fails_the_call(whole: bool) -> None:
    mesh = await Answerer.options(procs=2).as_actor()
    try:
        ref = mesh.slice(procs=0) if not whole else mesh
        waiting = asyncio.ensure_future(ref.keeps.call(1) if whole else ref.keeps.call_one(1))
        await ref.ping.call()  # in order after keeps: its endpoint has returned, port kept
        assert not waiting.done()
        os.kill(mesh.state().ranks[0].pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(zmesh.SupervisionError, match="SIGKILL"):
            await asyncio.wait_for(waiting, PROMPT)
        assert time.monotonic() - t0 < PROMPT
    finally:
        await mesh.stop()


async def test_a_kept_and_forgotten_port_is_bounded_by_the_calls_timeout(one: Any) -> None:
    t0 = time.monotonic()
    with pytest.raises(zmesh.CallTimeoutError, match=r"response port of Answerer\.keeps"):
        await one.keeps.options(timeout=0.5).call_one(1)
    assert 0.5 <= time.monotonic() - t0 < 0.5 + PROMPT
    with pytest.raises(zmesh.CallTimeoutError):  # a mesh's call too
        await one.keeps.options(timeout=0.3).call(1)


async def test_without_a_timeout_the_log_says_the_call_still_waits(
    one: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_portcalls, "PATIENCE", 0.3)
    with caplog.at_level(logging.WARNING, logger="zmesh.ports"):
        waiting = asyncio.ensure_future(one.keeps.call_one(1))
        deadline = time.monotonic() + PROMPT
        while "without sending on its response port" not in caplog.text:
            assert time.monotonic() < deadline, "nothing said the call still waits"
            await asyncio.sleep(0.05)
    assert "Answerer.keeps" in caplog.text and "options(timeout=" in caplog.text
    assert not waiting.done()
    await one.answer_kept.call_one(5)
    assert await asyncio.wait_for(waiting, PROMPT) == 5


@pytest.mark.parametrize("endpoint", ["twice", "twice_sync"])
async def test_a_second_answer_is_refused_at_the_sender(one: Any, endpoint: str) -> None:
    assert await getattr(one, endpoint).call_one(3) == 3
    refused = await one.refusals.call_one()
    assert len(refused) == 1 and "has sent its answer already" in refused[0]
    assert f"Answerer.{endpoint}" in refused[0]


async def test_ports_used_rightly_raise_nothing(one: Any) -> None:
    helper = await Answerer.options().as_actor()
    try:
        assert await one.later.call_one(6) == 36  # kept by a task, sent later
        assert await one.delegate.call_one(helper, 1) == 101  # handed on to another actor
        assert await one.sends_then_returns.call_one(9) == 9
        for _ in range(50):  # and again, no late "dropped" error for any of them
            assert await one.delegate.call_one(helper, 2) == 102
        gc.collect()
        assert await one.ping.call_one() == "pong"
    finally:
        await helper.stop()


async def test_every_actor_of_a_mesh_call_is_held_to_it() -> None:
    mesh = await Answerer.options(procs=2).as_actor()
    try:
        assert (await mesh.later.call(3)).values() == [9, 9]
        await fails_at_once(mesh.drops.call(1), "dropped the port", "drops")
        await fails_at_once(mesh.returns.call(1), "returned a value", "returns")
        assert (await mesh.twice.call(4)).values() == [4, 4]
        assert [len(r) for r in (await mesh.refusals.call()).values()] == [1, 1]
    finally:
        await mesh.stop()


async def test_several_actors_per_proc_are_each_held_to_it() -> None:
    mesh = await Answerer.options(procs=1, actors_per_proc=3).as_actor()
    try:
        assert (await mesh.later.call(2)).values() == [4, 4, 4]
        await fails_at_once(mesh.drops_sync.call(1), "dropped the port", "drops_sync")
        await fails_at_once(mesh.returns.call(1), "returned a value", "returns")
        assert (await mesh.ping.call()).values() == ["pong"] * 3
    finally:
        await mesh.stop()


@pytest.mark.stress
async def test_a_thousand_dropped_ports_each_fail_their_call(one: Any) -> None:
    futs = [one.drops.call_one(i) if i % 2 else one.drops_sync.call_one(i) for i in range(1000)]
    results = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 60)
    assert all(isinstance(r, zmesh.ResponsePortError) for r in results)
    kept = [one.keeps.call_one(i) for i in range(200)]
    await asyncio.sleep(0.2)
    assert await one.forget.call_one() == 200
    results = await asyncio.wait_for(asyncio.gather(*kept, return_exceptions=True), 60)
    assert all(isinstance(r, zmesh.ResponsePortError) for r in results), results[:3]
    assert await one.ping.call_one() == "pong"


def test_a_local_mesh_says_it_does_not_run_port_endpoints() -> None:
    with local_mesh(Answerer) as mesh:
        with pytest.raises(zmesh.EndpointError, match="explicit-response-port"):
            mesh.drops.call_one(1).get(timeout=10)
        assert mesh.ping.call_one().get(timeout=10) == "pong"
