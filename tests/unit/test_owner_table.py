"""An agent's owner table holds one entry per owner with meshes on it, whatever clients send."""

from __future__ import annotations

import asyncio
import os

from zmesh._host.agent import owners as owners_mod
from zmesh._host.agent.owners import Owners
from zmesh._shared import ownership
from zmesh._wire import messages as w


def test_heartbeats_of_owners_with_no_mesh_here_add_nothing() -> None:
    async def main() -> None:
        owners = Owners()
        mine = ownership.owner_id("h", os.getpid(), "s" * 32)
        owners.track(mine)
        for i in range(10_000):  # proven ids, made by a client that spawns nothing here
            secret = f"{i:032d}"
            owners.beat(w.OwnerHeartbeat(ownership.owner_id("h", 1, secret), secret=secret))
        owners.beat(w.OwnerHeartbeat(mine, secret="s" * 32))
        assert list(owners.heard) == [mine]
        assert len(owners._early) <= owners_mod.EARLY  # the others' last beats: a few
        owners.forget(mine)
        owners.beat(w.OwnerHeartbeat(mine, secret="s" * 32))  # its meshes are gone: so is it
        assert owners.heard == {} and owners.due(0.0) == []

    asyncio.run(main())
