"""A service's replicas judged by their progress and their ``__health__`` check, never by busyness.

The supervisor (``supervisor.py``) runs ``ReplicaHealth.run`` beside its
replicas: a replica that fails its check, or answers nothing at all with
work in flight, is taken out of routing (``UNREADY``); one that stays so
for ``unready_timeout`` is replaced. A replica's death is not judged here:
its agent reports it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from zmesh._errors import ActorStoppedError, CallTimeoutError, SupervisionError
from zmesh._service.routing import HEALTHY, UNREADY
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

if TYPE_CHECKING:
    from zmesh._client.handles.mesh import ActorMesh
    from zmesh._service.supervisor import Supervisor

log = logging.getLogger("zmesh.service")


class ReplicaHealth:
    """The health checks of one supervisor's replicas."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        # Per replica: (generation, answers, when they last changed or it was idle).
        self._progress: dict[int, tuple[int, int, float]] = {}

    async def run(self) -> None:
        """Judge each replica's liveness by its proc and its progress, never by busyness.

        Its proc's death comes from its agent (and a proc that is hung, not
        busy, is declared ``Timeout`` there). Here: every ``health_interval``
        the ``__health__`` check (run in the proc beside the mailbox, not
        behind it); a replica that fails it, or answers nothing at all with
        work in flight, becomes ``UNREADY`` (out of routing); one that stays
        so for ``unready_timeout`` is replaced.
        """
        sup = self.sup
        checks = "__health__" in sup.client.endpoints
        client, cfg, loop = sup.client, sup.config, sup.rt.loop
        while not sup.stopped:
            await asyncio.sleep(cfg.health_interval)
            now = loop.time()
            for slot in client.dispatcher.slots:
                mesh = client.meshes[slot.index]
                if mesh is None or slot.state not in (HEALTHY, UNREADY):
                    continue
                if slot.state == UNREADY and now - slot.unready_since > cfg.unready_timeout:
                    why = f"{slot.last_failure}; UNREADY for over {cfg.unready_timeout:g}s"
                    client.replica_failed(slot.index, slot.generation, why)
                    continue
                # Since when it has had work and answered nothing (idle counts as progress).
                answers, in_flight = self._work(slot.index)
                key = (slot.generation, answers)
                since = self._progress.get(slot.index)
                if since is None or since[:2] != key or not in_flight:
                    self._progress[slot.index] = (*key, now)
                elif now - since[2] > cfg.request_timeout:
                    why = f"no answer for {now - since[2]:.0f}s with {in_flight} in flight"
                    if client.replica_unready(slot.index, slot.generation, why):
                        log.warning(
                            "service %s replica %d is UNREADY: %s", sup.name, slot.index, why
                        )
                        sup.report()
                    continue
                if checks:
                    self._check(slot.index, slot.generation, answers, mesh)

    def _work(self, index: int) -> tuple[int, int]:
        """Replica ``index``'s answers so far and requests in flight, over every
        client of the service in this process (each event loop routes its own)."""
        sup = self.sup
        answers = in_flight = 0
        for client in (sup.client, *sup._attached):
            slot = client.dispatcher.slots[index]
            answers += slot.answers
            in_flight += slot.in_flight
        return answers, in_flight

    def _check(self, index: int, generation: int, answers: int, mesh: ActorMesh[Any]) -> None:
        sup = self.sup
        client = sup.client
        verdicts: list[str | None] = []
        ranks = len(mesh._refs)

        def deliver(i: int, ok: bool, value: Any) -> None:
            slot = client.dispatcher.slots[index]
            if isinstance(value, SupervisionError | ActorStoppedError):
                return  # its proc died: the agent says so, and that replaces it
            if ok and value is not False:
                verdicts.append(None)
            elif ok:
                verdicts.append("health check returned False")
            elif isinstance(value, CallTimeoutError):
                # Busy is not dead: a replica that answered requests meanwhile is alive.
                progressed = slot.generation == generation and self._work(index)[0] != answers
                timeout = sup.config.health_timeout
                verdicts.append(
                    None if progressed else f"health check: no reply within {timeout:g}s"
                )
            else:
                verdicts.append(f"health check failed: {value}")
            if len(verdicts) < ranks:
                return
            why = next((v for v in verdicts if v is not None), None)
            if why is None:
                client.replica_ready(index, generation)
            elif client.replica_unready(index, generation, why):
                log.warning("service %s replica %d is UNREADY: %s", sup.name, index, why)
            sup.report()

        sup.rt.send(
            mesh._refs,
            lambda i: w.Call(i, mesh.actor, "__health__", Codec.pack((), {})[0]),
            [],
            deliver,
            sup.config.health_timeout,
        )
