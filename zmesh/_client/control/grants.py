"""A ``ProcMesh`` its owner hands to its own actors lets them spawn there, as in Monarch.

Only a mesh's owner may spawn actors into its procs (docs/security.md). A
Monarch program hands a ``ProcMesh`` to an actor (an argument of a call or
of a spawn) for that actor to spawn into, and supervise, what it spawns
there. So a ``ProcMesh`` pickled as part of a message to actors on procs
this process owns carries the mesh's grant (``zmesh._shared.ownership.grant_of``),
which the receiver holds and spawns (and stops its actors) with. Pickled
anywhere else (``pickle.dumps``, a call to another client's actors) it
carries nothing: a handle is a capability to call, and only its owner's own
actors are given more.

While arguments are encoded the caller says where they go (``sending_to``, ``sent``);
``ProcMesh.__reduce__`` asks ``grant`` whether that destination earns one.
"""

from __future__ import annotations

import threading

from zmesh._client.calls import runtime as _runtime
from zmesh._client.control import local as _local

_state = threading.local()  # .to: the proc mesh the message being encoded goes to


def sending_to(proc_mesh: str) -> str:
    """Encode a message for actors of ``proc_mesh`` from now on; what to give
    ``sent`` after (a plain pair of calls: this is on every call's path)."""
    before: str = getattr(_state, "to", "")
    _state.to = proc_mesh
    return before


def sent(before: str) -> None:
    """The message is encoded: back to ``before`` (what ``sending_to`` returned)."""
    _state.to = before


def grant(mesh: str) -> str:
    """The grant of ``mesh`` to put in its pickled handle now: ``""`` unless
    it goes to actors on procs this process owns."""
    to = getattr(_state, "to", "")
    if not to:
        return ""
    rt, _ = _runtime.current()
    ctl = rt.controller
    if to not in ctl.owned and to not in ctl.creating:
        return ""
    return _local.mesh_grant(mesh)


def take(mesh: str, grant: str) -> None:
    """A handle of ``mesh`` arrived with ``grant``: spawn there with it."""
    if grant:
        _local.hold_grant(mesh, grant)
