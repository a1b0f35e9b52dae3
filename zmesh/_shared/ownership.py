"""Owner ids and what proves them: an id cannot be claimed, only derived.

An owner id (``host:pid:token``) is public: events and ``GetState`` carry
it. So its ``token`` is a digest of the owner's secret, and an agent takes a
request as the owner's only when the secret sent with it digests to the
token of the id it names: an id read from an event gives nothing, and no
client can take an id first on an agent its owner has not used yet.

A mesh's **key** is derived from its owner's secret and its name. The
agent that starts the mesh's procs hands it to them (``MESH_KEY_VAR``), and
a proc accepts what changes its state (``SpawnActor``, ``StopActor``) only
with that key: where the message lands, not only at the agent. A key proves
nothing about any other mesh, so sending one to a proc of someone else's
mesh (a handle of theirs used by mistake) gives them nothing of ours.

A mesh's **grant** (``grant_of``), derived from its key, is what a
``ProcMesh`` carries when its owner passes it to one of its own actors
(``zmesh._client.control.grants``): the procs accept it for ``SpawnActor`` and
``StopActor`` too.
"""

from __future__ import annotations

import hashlib
import hmac

# Where a proc finds its mesh's key; the proc removes it from its
# environment at start, so its actors' subprocesses do not inherit it.
MESH_KEY_VAR = "ZMESH_MESH_KEY"
# A proc started as a fresh interpreter finds it on this inherited pipe
# instead: what ``execve`` is given stays in ``/proc/<pid>/environ`` for the
# process's life, readable by every process of the user.
MESH_KEY_FD_VAR = "ZMESH_MESH_KEY_FD"

_TOKEN_CHARS = 16  # 64 bits of a SHA-256: finding a secret for a given id is out of reach


def token_of(secret: str) -> str:
    """The public token an owner id made from ``secret`` ends with."""
    digest = hashlib.sha256(b"zmesh owner id\0" + secret.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:_TOKEN_CHARS]


def owner_id(host: str, pid: int, secret: str) -> str:
    """The owner id of the process ``pid`` on ``host`` whose secret is ``secret``."""
    return f"{host}:{pid}:{token_of(secret)}"


def proves(owner: str, secret: str) -> bool:
    """Whether ``secret`` is the one ``owner`` was made from (constant time)."""
    if not secret:
        return False
    return same_secret(owner.rpartition(":")[2], token_of(secret))


def mesh_key(secret: str, mesh: str) -> str:
    """The key of mesh ``mesh`` whose owner's secret is ``secret``."""
    label = b"zmesh mesh key\0" + mesh.encode("utf-8", "surrogatepass")
    return hmac.new(secret.encode("utf-8", "surrogatepass"), label, hashlib.sha256).hexdigest()


def grant_of(key: str) -> str:
    """The spawn grant of the mesh whose key is ``key``: what its owner hands,
    with a ``ProcMesh``, to the actors it calls on procs it owns, so they may
    spawn into (and stop actors of) that mesh's procs, as Monarch's may. It
    proves nothing else: a proc's hello, heartbeats and statistics need the
    key, which a grant does not give away (an HMAC of it)."""
    label = b"zmesh spawn grant\0"
    return hmac.new(key.encode("utf-8", "surrogatepass"), label, hashlib.sha256).hexdigest()


def same_secret(a: str, b: str) -> bool:
    """Whether two secrets are equal, in constant time, whatever a peer sent.

    ``hmac.compare_digest`` refuses ``str`` with non-ASCII characters
    (``TypeError``), and a secret arrives from the wire as any text: compare
    the UTF-8 bytes.
    """
    return hmac.compare_digest(
        a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass")
    )
