"""The replicas' side of the dispatcher: each replica's state, and what a change does to routing.

A mixin of ``Dispatcher`` (``dispatch.py``), which the service client tells
of every replica that comes up, fails, fails its health check or stays down
(from the supervisor, the supervision stream or the orchestrator's table).
Each event returns its decisions as the dispatcher's do: requests queued on
a replica that can no longer take them are routed again (``Send``,
``Settle``), those waiting for any replica are routed when one comes up, a
failed generation is reported once (``Failed``: the supervisor replaces
it), and a fan-out waiting for a replica is woken (``Changed``). The rules
are in ``dispatch.py``'s docstring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zmesh._service.decisions import CHANGED, Decision, Failed
from zmesh._service.routing import HEALTHY, RECOVERING, UNHEALTHY, UNREADY

if TYPE_CHECKING:
    from collections.abc import Callable

    from zmesh._service.requests import Request, Slot


class ReplicaStates:
    """How replica events (up, failed, unready, ready, gone) change routing."""

    if TYPE_CHECKING:  # the Dispatcher's, which this is a part of
        slots: list[Slot]
        stopped: bool
        orphaned: str
        clock: Callable[[], float]
        _out: list[Decision]

        def _take(self) -> list[Decision]: ...
        def _dispatch(self, req: Request) -> None: ...
        def _pump(self, slot: Slot) -> None: ...
        def _pump_waiting(self) -> None: ...

    def replica_up(self, index: int, generation: int) -> list[Decision]:
        """Replica ``index`` serves in ``generation`` (newer than the one known)."""
        slot = self.slots[index]
        if self.stopped or generation <= slot.generation:
            return []
        if slot.state in (HEALTHY, UNREADY):  # a newer generation replaces one thought alive
            self._replica_failed(index, slot.generation, "replaced by a newer generation", False)
        slot.generation = generation
        slot.state = HEALTHY
        slot.sent = 0
        self.orphaned = ""  # someone does replace replicas
        self._pump(slot)
        self._pump_waiting()
        self._out.append(CHANGED)
        return self._take()

    def replica_failed(
        self, index: int, generation: int, reason: str, notify: bool = True
    ) -> list[Decision]:
        """Generation ``generation`` of replica ``index`` failed.

        The first time, ``Failed`` is decided (unless ``notify`` is false:
        the one who says so replaces it itself).
        """
        self._replica_failed(index, generation, reason, notify)
        return self._take()

    def _replica_failed(self, index: int, generation: int, reason: str, notify: bool) -> None:
        slot = self.slots[index]
        if slot.generation != generation or slot.state not in (HEALTHY, UNREADY) or self.stopped:
            return
        slot.state = RECOVERING
        slot.last_failure = reason
        queued = list(slot.queue)
        slot.queue.clear()
        for req in queued:  # never sent: always safe to send elsewhere
            self._dispatch(req)
        if notify:
            self._out.append(Failed(index, generation, reason))

    def replica_unready(self, index: int, generation: int, reason: str) -> list[Decision]:
        """Generation ``generation`` of replica ``index`` is alive but should not
        get work (its health check failed): out of routing, not replaced.

        Its queued requests go elsewhere; those in flight stay (it may still
        answer them). Only a HEALTHY replica becomes UNREADY.
        """
        slot = self.slots[index]
        if slot.generation != generation or slot.state != HEALTHY or self.stopped:
            return []
        slot.state = UNREADY
        slot.last_failure = reason
        slot.unready_since = self.clock()
        queued = list(slot.queue)
        slot.queue.clear()
        for req in queued:
            self._dispatch(req)
        return self._take()

    def replica_ready(self, index: int, generation: int) -> list[Decision]:
        """An ``UNREADY`` replica passes its check again: back in routing."""
        slot = self.slots[index]
        if slot.generation != generation or slot.state != UNREADY or self.stopped:
            return []
        slot.state = HEALTHY
        self._pump(slot)
        self._pump_waiting()
        self._out.append(CHANGED)
        return self._take()

    def replica_gone(self, index: int) -> list[Decision]:
        """Replica ``index`` stays down for good (restart intensity)."""
        slot = self.slots[index]
        if self.stopped:
            return []
        slot.state = UNHEALTHY
        for req in list(slot.queue):
            slot.queue.remove(req)
            self._dispatch(req)
        self._pump_waiting()  # if nothing can recover, waiting calls fail now
        self._out.append(CHANGED)
        return self._take()

    def owner_gone(self, index: int, generation: int, reason: str) -> list[Decision]:
        """Generation ``generation`` of replica ``index`` was stopped because the
        process that made the service (its supervisor) is gone: nothing will
        replace it, so it is down for good, and once no replica serves or may
        recover, what waits fails now (``why_down``)."""
        slot = self.slots[index]
        if self.stopped or slot.generation != generation:
            return []
        self.orphaned = reason
        slot.last_failure = reason
        return self.replica_gone(index)

    def why_down(self) -> str:
        """Why no replica can serve when none is healthy or recovering."""
        if self.orphaned:
            gone = "the process that made it is gone, and nothing restarts its replicas"
            return f"{gone}: {self.orphaned}"
        return "every replica reached its restart limit"

    def healthy(self) -> list[Slot]:
        return [s for s in self.slots if s.state == HEALTHY]

    def recovering(self) -> bool:
        """Whether a replica that is not healthy now may serve again (being
        replaced, or UNREADY: it may pass its check, or be replaced)."""
        return any(s.state in (RECOVERING, UNREADY) for s in self.slots)
