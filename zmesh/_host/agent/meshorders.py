"""The agent's answers to the requests that change its meshes: create or update one, stop one.

Each takes what the agent knows (its proc table, its owners, its label)
and the request, acts on the proc table, and returns the ``Ack`` the agent
sends back; the owner checks come first, so a client that cannot prove it
owns a mesh changes nothing.
"""

from __future__ import annotations

import logging

from zmesh._host.agent import updates as _updates
from zmesh._host.agent.owners import Owners, not_owner, not_proven
from zmesh._host.agent.proctable import ProcTable, spec_error
from zmesh._shared import ownership as _ownership
from zmesh._shared.ownership import same_secret as _same_secret
from zmesh._wire import messages as w

log = logging.getLogger("zmesh.agent")


def create_or_update(procs: ProcTable, owners: Owners, label: str, msg: w.CreateOrUpdate) -> w.Ack:
    """Create the mesh ``msg`` names, or update it in place (its owner only)."""
    # The owner id is made from the secret: a claimed id without it gives nothing.
    if not msg.secret:
        return w.Ack(msg.id, ok=False, denied=True, error="CreateOrUpdate needs a secret")
    if not owners.is_owner(msg.spec.owner, msg.secret):
        return w.Ack(msg.id, ok=False, denied=True, error=not_proven(msg.spec.owner))
    existing = procs.meshes.get(msg.name)
    if existing is not None and existing.spec == msg.spec and not existing.stopped:
        return w.Ack(msg.id)  # idempotent
    live = existing is not None and not existing.stopped
    if existing is not None and live and existing.spec.owner != msg.spec.owner:
        why = not_owner(existing.spec.owner, "update it or spawn under its name")
        error = f"mesh {msg.name!r} on {label}: {why}"
        return w.Ack(msg.id, ok=False, denied=True, error=error)
    error = spec_error(msg.spec)
    if error:
        return w.Ack(msg.id, ok=False, error=f"bad CreateOrUpdate of {msg.name!r}: {error}")
    owners.track(msg.spec.owner)
    if existing is not None and live:
        _updates.update(procs, existing, msg.spec)  # grow, shrink or roll, in place
    else:
        key = _ownership.mesh_key(msg.secret, msg.name)  # its procs' (ownership.py)
        _updates.create(procs, msg.name, msg.spec, key)
    return w.Ack(msg.id)


def stop(procs: ProcTable, owners: Owners, label: str, operator: str, msg: w.Stop) -> w.Ack:
    """Stop the mesh ``msg`` names, for its owner or the agent's operator (``zmesh stop``)."""
    req_id, name, secret = msg.id, msg.name, msg.secret
    mesh = procs.meshes.get(name)
    if mesh is None:
        return w.Ack(req_id, ok=False, error=f"no mesh named {name!r} on {label}")
    is_operator = bool(operator) and _same_secret(operator, secret)
    if not owners.is_owner(mesh.spec.owner, secret) and not is_operator:
        log.warning("refused a Stop of mesh %s from a client that does not own it", name)
        error = f"mesh {name!r} on {label}: {not_owner(mesh.spec.owner)}"
        return w.Ack(req_id, ok=False, denied=True, error=error)
    procs.stop(mesh)
    return w.Ack(req_id)
