"""``zmesh.shutdown()``."""

from __future__ import annotations

from zmesh._client.control import local as _local


def shutdown() -> None:
    """Stop everything this process owns: its meshes and its embedded agents.

    Runs by itself at a normal exit and on Ctrl+C; call it to stop earlier.
    zmesh can be used again afterwards (new embedded agents start on demand).
    """
    _local.release_all()
