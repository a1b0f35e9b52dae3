"""Actors into procs: a ``SpawnActor`` to each proc, sent as soon as it runs.

An ``ActorStart`` pickles the actor class and packs its arguments once, then
sends ``SpawnActor`` to each proc handed to ``send``, and ``finish`` waits
for every answer. A new mesh (``spawning.spawn_owned_mesh``) hands it each
proc the moment its agent reports it Running (``procstart.spawn_procs``'s
``on_running``), so the first actors start while the last procs are still
being forked: a spawn of 64 procs no longer waits for all 64 before it
connects to any, then for 64 actors' ``__init__`` after that.
``ProcMesh.spawn`` (its procs are up already) sends to all of them at once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from zmesh._actor import ActorBase
from zmesh._client.calls import grouping as _grouping
from zmesh._client.calls.runtime import ProcRef, Runtime
from zmesh._client.control import grants as _grants
from zmesh._client.control import local as _local
from zmesh._errors import SecurityError, SpawnError, ZmeshError
from zmesh._wire import messages as w
from zmesh._wire import pickling
from zmesh._wire.codec import Codec

A = TypeVar("A", bound=ActorBase)


class ActorStart(Generic[A]):
    """The actor ``name`` of class ``cls`` started in the procs of ``proc_mesh``.

    Args:
        dims: the proc mesh's sizes (every ``SpawnActor`` carries them).
        per_proc: actors in each proc.
        init_timeout: how long each proc's ``__init__`` may take, from its send.

    Raises:
        SpawnError: the class or its arguments cannot be sent (at construction).
    """

    def __init__(
        self,
        rt: Runtime,
        proc_mesh: str,
        dims: dict[str, int],
        name: str,
        cls: type[A],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        per_proc: int,
        init_timeout: float,
    ) -> None:
        if not (isinstance(cls, type) and issubclass(cls, ActorBase)):
            raise TypeError(f"{cls!r} is not a zmesh.Actor subclass")
        try:
            self._blob, _ = pickling.dumps(cls, lambda _: True)  # by value if in __main__
            before = _grants.sending_to(proc_mesh)
            try:
                self._payload, self._buffers = Codec.pack(args, kwargs)
            finally:
                _grants.sent(before)
        except Exception as exc:
            raise SpawnError(f"cannot send {cls.__qualname__} or its arguments: {exc}") from exc
        self._rt = rt
        self._proc_mesh = proc_mesh
        self._dims = dims
        self._name = name
        self._per_proc = per_proc
        self._timeout = init_timeout
        self._proof = _local.mesh_proof(proc_mesh)  # the procs spawn only for their owner
        self._sent: set[int] = set()  # ranks
        self._answered = 0
        self._all = False  # finish() has sent to every proc
        self._done: asyncio.Future[None] = rt.loop.create_future()
        self.errors: list[BaseException] = []

    def send(self, ref: ProcRef) -> None:
        """Start the actor(s) in ``ref``'s proc (once per rank; from the loop)."""
        if ref.rank in self._sent:
            return
        self._sent.add(ref.rank)
        members = _grouping.member_refs([ref], self._per_proc)
        self._rt.send(
            [ref],
            functools.partial(
                w.SpawnActor,
                actor=self._name,
                cls=self._blob,
                payload=self._payload,
                mesh=self._proc_mesh,
                dims=self._dims,
                rank=ref.rank,
                count=self._per_proc if self._per_proc > 1 else 0,
                proof=self._proof,
            ),
            self._buffers,
            functools.partial(self._deliver, members[0] if members else []),
            self._timeout,  # an __init__ that never returns must not hang the spawn
        )

    def _deliver(self, members: list[ProcRef], _i: int, ok: bool, value: Any) -> None:
        self._answered += 1
        if ok and type(value) is _grouping.Parts:  # each actor's __init__, apart
            codec = self._rt.codec
            self.errors.extend(v for part_ok, v in value.outcomes(codec, members) if not part_ok)
        elif not ok:
            self.errors.append(value)
        if self._answered == len(self._sent) and self._all and not self._done.done():
            self._done.set_result(None)

    async def finish(
        self, refs: list[ProcRef], failed: Callable[[list[BaseException]], None] | None = None
    ) -> None:
        """Send to whichever of ``refs`` has not had it yet, and wait for every answer.

        Args:
            failed: told of the errors (each actor's owner hears of them) before
                the first is raised.

        Raises:
            SpawnError: an actor could not start (the first rank's error).
            SecurityError: the procs are not ours.
        """
        for ref in refs:
            self.send(ref)
        self._all = True
        if self._answered == len(self._sent) and not self._done.done():
            self._done.set_result(None)
        await self._done
        errors = self.errors
        if errors and failed is not None:
            failed(errors)  # (their owner hears of each, as Monarch's does)
        if errors:
            err = min(errors, key=lambda e: getattr(e, "rank", None) or 0)  # the first rank's
            said = _as_spawns(self._name, err)
            if said is None:
                raise err
            raise said from err


def _as_spawns(name: str, err: BaseException) -> ZmeshError | None:
    """``err`` said as the spawn's error, or ``None`` to raise it as it is."""
    if isinstance(err, SecurityError):  # not our procs: refused, nothing started
        return SecurityError(
            f"cannot spawn actor {name}: {err.message}", mesh=err.mesh, rank=err.rank,
            host=err.host, log_path=err.log_path,
        )  # fmt: skip
    if isinstance(err, SpawnError):
        tb = getattr(err, "remote_traceback", "")
        return SpawnError(
            f"{err.message}\n--- remote traceback ---\n{tb}".rstrip(),
            mesh=err.mesh, rank=err.rank, host=err.host, log_path=err.log_path,
        )  # fmt: skip
    if isinstance(err, ZmeshError):
        return SpawnError(
            f"actor {name} could not start: {err.message}", mesh=err.mesh, rank=err.rank,
            host=err.host, log_path=err.log_path,
        )  # fmt: skip
    return None
