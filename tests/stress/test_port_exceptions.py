"""``Port.exception`` with what a future cannot raise, or what cannot travel.

The receiver's ``recv()`` raises what was sent. Three things cannot be
raised as they are: a value that is no exception (``port.exception("boom")``),
a ``StopIteration`` (an asyncio future refuses it), and an exception whose
class does not unpickle (an ``__init__`` with arguments of its own). Before,
the first two raised inside the receiving process's port inbox, so the
waiting ``recv()`` never resolved and the inbox stalled until the next
message; the third was dropped at the receiver, so ``recv()`` got the next
value as if nothing had been sent. Now: a ``TypeError`` at the sender for
the first, and for the others an ``EncodeError`` at the receiver, in order,
that names what was sent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import zmesh
from zmesh import Channel, Port

pytestmark = [pytest.mark.stress, pytest.mark.anyio]


class PickyError(Exception):
    def __init__(self, code: int, where: str) -> None:
        super().__init__(f"{code} at {where}")  # args != (code, where): does not unpickle


class Sender(zmesh.Actor):
    @zmesh.endpoint
    async def fail(self, port: Port[Any], how: str) -> str:
        try:
            if how == "str":
                port.exception("not an exception")  # type: ignore[arg-type]
            elif how == "stop":
                port.exception(StopIteration(7))
            elif how == "picky":
                port.exception(PickyError(3, "disk"))
        except TypeError as exc:
            port.send("after")
            return f"TypeError: {exc}"
        port.send("after")
        return "sent"


@pytest.fixture
def sender() -> Any:
    return Sender.options().as_actor().get(timeout=60)  # (stopped by the per-test shutdown)


async def test_a_non_exception_is_a_type_error_at_the_sender(sender: Any) -> None:
    port, receiver = Channel.open()
    said = await sender.fail.call_one(port, "str")
    assert said.startswith("TypeError:") and "str" in said, said
    assert await asyncio.wait_for(receiver.recv(), 5) == "after"


@pytest.mark.parametrize(("how", "what"), [("stop", "StopIteration"), ("picky", "PickyError")])
async def test_an_exception_that_cannot_be_raised_as_is_arrives_as_encode_error(
    sender: Any, how: str, what: str
) -> None:
    port, receiver = Channel.open()
    assert await sender.fail.call_one(port, how) == "sent"
    with pytest.raises(zmesh.EncodeError, match=what):
        await asyncio.wait_for(receiver.recv(), 5)
    assert await asyncio.wait_for(receiver.recv(), 5) == "after"  # in order, nothing stalled
