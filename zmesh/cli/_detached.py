"""``zmesh stop NAME`` for a detached service or mesh (``detached=True``).

Asked first, before the meshes by name: every agent is asked to stop what
it keeps under ``NAME`` for our keys (or, on this machine, for anyone: we
prove we are the agent's user with the operator secret of its registry
entry). For a service that stops its orchestrator, whose cleanup stops the
replicas.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from zmesh._client.control.lookup import principal
from zmesh._wire import messages as w


async def stop_detached(
    col: Any, addresses: list[str], name: str, operators: dict[str, str], timeout: float
) -> list[dict[str, Any]]:
    """``[{"mesh", "host", "ok", "error"}]`` of the agents that kept ``name`` (``[]``: none)."""

    mine = principal()

    async def one(address: str) -> Any:
        make = functools.partial(
            w.StopDetached, name=name, principal=mine, secret=operators.get(address, "")
        )
        try:
            return await col.request(address, make, timeout)
        except (asyncio.TimeoutError, LookupError):
            return None

    await col.wait(1, timeout)
    replies = await asyncio.gather(*(one(a) for a in addresses))
    snap = col.snapshot()
    labels = {a.address: a.stats.agent for a in snap.agents if a.stats is not None}
    return [
        {"mesh": name, "host": labels.get(a, a), "ok": True, "error": "", "detached": True}
        for a, reply in zip(addresses, replies, strict=True)
        if reply is not None and reply.ok
    ]
