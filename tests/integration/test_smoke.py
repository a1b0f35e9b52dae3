from __future__ import annotations

import pytest

import zmesh


class Echo(zmesh.Actor):
    @zmesh.endpoint
    async def echo(self, x: object) -> object:
        return x

    @zmesh.endpoint
    def where(self) -> int:
        return zmesh.current_rank().rank


@pytest.mark.anyio
async def test_async_echo_roundtrip() -> None:
    mesh = await Echo.options(procs=2).as_actor()
    assert (await mesh.echo.call((1, "a"))).values() == [(1, "a"), (1, "a")]
    assert (await mesh.where.call()).values() == [0, 1]


def test_sync_get_roundtrip() -> None:
    mesh = Echo.options(procs=2).as_actor().get(timeout=30)
    assert mesh.slice(procs=1).echo.call_one(b"x" * 100_000).get(timeout=10) == b"x" * 100_000
    assert [v for v in mesh.where.stream()] in ([0, 1], [1, 0])
