"""A decision the service client cannot carry out does not strand the others.

The dispatcher decides (send this attempt, answer that request) and the
client carries the decisions out in order. A send that raises (here: the
socket layer refusing, as under EMFILE) must end its own request with a
``ServiceError`` saying why, and leave the replica's slot free, not drop
the decisions after it: their callers would wait for ever.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import zmesh
from zmesh._service import client as _client

from _actors import Napper

pytestmark = pytest.mark.anyio


async def test_a_send_that_raises_fails_its_call_and_the_rest_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc = await Napper.options(replicas=1).as_service()
    try:
        assert await svc.nap.options(timeout=20)(0) is not None  # it serves
        real, broken = _client._call, [2]

        def flaky(client: Any, attempt: Any, mesh: Any) -> None:
            if broken[0]:
                broken[0] -= 1
                raise OSError(24, "Too many open files")
            real(client, attempt, mesh)

        monkeypatch.setattr(_client, "_call", flaky)
        calls = [asyncio.ensure_future(svc.nap.options(timeout=20)(0)) for _ in range(6)]
        got = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
        failed = [g for g in got if isinstance(g, BaseException)]
        assert len(failed) == 2, got
        assert all(isinstance(e, zmesh.ServiceError) for e in failed), failed
        assert all("could not be sent: OSError" in str(e) for e in failed), failed
        stats = svc.statistics().replicas[0]
        assert stats.in_flight == 0  # the slots of the failed sends came back
    finally:
        await svc.stop()
