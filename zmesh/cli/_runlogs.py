"""The logs of ended runs, read from disk: ``zmesh logs NAME`` once its script is gone.

An embedded agent ends with its script, and nobody is left to ask; its
procs' logs stay in a run directory of the log root (``paths.log_root()``:
``<label>-<pid>/<mesh>.<rank>.g<generation>.log``) until old runs are
pruned. This finds them by the name the user gave, as the live path does.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from zmesh._errors import SecurityError
from zmesh._shared import paths as _paths
from zmesh.top._health import base_name, means

_LOG = re.compile(r"^(?P<mesh>.+)\.(?P<rank>\d+)\.g(?P<gen>\d+)\.log$")


@dataclass(frozen=True)
class RunLog:
    """One proc's log file of some run.

    Attributes:
        run: the run directory's name (``local-4242``: label and script pid).
        mesh: the mesh's full name; rank, generation: which proc.
        path: the file; mtime: when it was last written.
    """

    run: str
    mesh: str
    rank: int
    generation: int
    path: str
    mtime: float


def scan(root: str | None = None) -> list[RunLog]:
    """Every proc log under the log root (one level of run directories), oldest first.

    A log root that is not private to us is not read (``[]``).
    """
    try:
        root = root or _paths.log_root()
        runs = os.listdir(root)
    except (OSError, SecurityError):
        return []
    uid = os.getuid()
    found = []
    for run in runs:
        base = os.path.join(root, run)
        try:
            names = os.listdir(base) if not os.path.islink(base) else []
        except OSError:
            continue
        for name in names:
            m = _LOG.match(name)
            if m is None:
                continue
            path = os.path.join(base, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if st.st_uid != uid or not os.path.isfile(path) or os.path.islink(path):
                continue  # only our own plain files
            found.append(RunLog(run, m["mesh"], int(m["rank"]), int(m["gen"]), path, st.st_mtime))
    return sorted(found, key=lambda r: (r.mtime, r.path))


def find(name: str, rank: int | None = None, root: str | None = None) -> list[RunLog]:
    """The logs of the newest run that had a mesh ``name`` means (each rank's latest
    generation; one rank if ``rank`` is given), in mesh and rank order."""
    logs = [r for r in scan(root) if means(name, r.mesh) and (rank is None or r.rank == rank)]
    if not logs:
        return []
    newest = logs[-1].run
    latest: dict[tuple[str, int], RunLog] = {}
    for r in logs:
        if r.run == newest:
            key = (r.mesh, r.rank)
            if key not in latest or latest[key].generation < r.generation:
                latest[key] = r
    return sorted(latest.values(), key=lambda r: (r.mesh, r.rank))


def names(root: str | None = None) -> list[tuple[str, str, str, int, float]]:
    """``(given name, full mesh name, run, ranks, last written)`` for every mesh with
    logs on disk, newest first."""
    meshes: dict[tuple[str, str], tuple[int, float]] = {}
    for r in scan(root):
        ranks, mtime = meshes.get((r.run, r.mesh), (0, 0.0))
        meshes[(r.run, r.mesh)] = (max(ranks, r.rank + 1), max(mtime, r.mtime))
    rows = [
        (base_name(mesh), mesh, run, ranks, mtime) for (run, mesh), (ranks, mtime) in meshes.items()
    ]
    return sorted(rows, key=lambda row: -row[4])
