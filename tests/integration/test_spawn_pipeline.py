"""A new mesh's actors start in each proc as soon as it runs (``_client.control.actorstart``).

``Cls.options(procs=N).as_actor()`` sends each proc its ``SpawnActor`` the
moment its agent reports it Running, not after the last of the N: the
first actors' ``__init__`` overlaps the other procs' start. Real procs
show it: every proc but rank 0 holds its start (its bootstrap, before it
says hello) until rank 0's actor has run its ``__init__``. Before, no
actor started until every proc ran, so each of them waited its full limit.
What a spawn promises is kept: a proc that fails to start still fails the
spawn with ``SpawnError`` and leaves nothing running, even with some
actors already up.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import pytest

import zmesh
from zmesh._client.control.procsetup import ProcSetup
from zmesh._wire.boundary import PROC_ENV_VAR, decode_proc_env

LIMIT = 20.0  # how long a held proc waits for rank 0's actor at most (ample under load)


class Marks(zmesh.Actor):
    """Rank 0's ``__init__`` leaves a mark the other procs' starts wait for."""

    def __init__(self, marker: str) -> None:
        if zmesh.current_rank().rank == 0:
            Path(marker).write_text("up")

    @zmesh.endpoint
    async def waited(self) -> float:
        return float(os.environ.get("WAITED", "0"))


def hold_until_rank0(marker: str, fail_rank: int = -1) -> None:
    """A bootstrap: every proc but rank 0 waits for rank 0's actor (``LIMIT`` at most)."""
    rank = decode_proc_env(os.environ[PROC_ENV_VAR]).rank
    if rank == 0:
        return
    t0 = time.monotonic()
    while not Path(marker).exists() and time.monotonic() - t0 < LIMIT:
        time.sleep(0.01)
    os.environ["WAITED"] = str(time.monotonic() - t0)
    if rank == fail_rank:
        raise RuntimeError("this proc cannot start")


def _options(procs: int, bootstrap: functools.partial[None]) -> zmesh.Options[Marks]:
    opts = Marks.options(procs=procs)
    opts.setup = ProcSetup(bootstrap=bootstrap)  # (as_actor takes no bootstrap of its own)
    return opts


def test_a_procs_actor_starts_before_the_last_proc_runs(tmp_path: Path) -> None:
    marker = str(tmp_path / "rank0-up")
    mesh = _options(3, functools.partial(hold_until_rank0, marker)).as_actor(marker)
    try:
        waited = mesh.waited.call().get(timeout=60).values()
        # Rank 0's actor ran while ranks 1 and 2 were still starting.
        assert waited[0] == 0.0
        assert all(0 < w < LIMIT / 2 for w in waited[1:]), waited
    finally:
        mesh.stop().get(timeout=30)


def test_a_proc_that_fails_after_others_actors_started_fails_the_spawn(tmp_path: Path) -> None:
    marker = str(tmp_path / "rank0-up")
    mesh = _options(3, functools.partial(hold_until_rank0, marker, fail_rank=2)).as_actor(marker)
    with pytest.raises(zmesh.SpawnError) as info:
        mesh.initialized.get(timeout=60)
    assert info.value.rank == 2
    assert "this proc cannot start" in str(info.value)
    assert Path(marker).exists()  # rank 0's actor was up before the spawn failed
    # (the session's end checks that none of the three procs is left)
