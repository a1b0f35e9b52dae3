"""CURVE keys, and who may connect to an agent or a proc.

An agent executes code on request, so reaching an agent is reaching a shell
(Ray's unauthenticated job API became CVE-2023-48022). Agents bind loopback
by default; anything else needs keys, made by ``zmesh keygen DIR``::

    DIR/zmesh.key            the public key (servers' and clients' alike)
    DIR/zmesh.key_secret     the secret key, mode 0600
    DIR/authorized/*.key     public keys allowed to connect (the ZAP allow-list)

Every socket a keyed agent or proc binds is a CURVE server with a ZAP
handler over ``authorized/``. Measured pitfalls this avoids: a CURVE server
*without* a ZAP handler accepts any client key; pyzmq's authenticator domain
``'*'`` is not a wildcard once a socket sets ``zap_domain``, so both use
``zmesh`` and ``ZAP_ENFORCE_DOMAIN`` makes a mismatch fail closed.
Authorisation is by the CURVE key (the ZAP User-Id), never by routing id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.auth

from zmesh._errors import SecurityError

DOMAIN = "zmesh"
_ENFORCE_DOMAIN = getattr(zmq, "ZAP_ENFORCE_DOMAIN", 93)


@dataclass(frozen=True)
class Keys:
    """A keypair and its allow-list directory, loaded from a ``zmesh keygen`` dir."""

    dir: str
    public: bytes
    secret: bytes

    @property
    def authorized(self) -> str:
        return os.path.join(self.dir, "authorized")

    @classmethod
    def load(cls, path: str) -> Keys:
        """Read the keys in ``path``.

        Raises:
            SecurityError: the directory or a key file is missing or unreadable.
        """
        secret_file = os.path.join(path, "zmesh.key_secret")
        try:
            public, secret = zmq.auth.load_certificate(secret_file)
        except (OSError, ValueError) as exc:
            raise SecurityError(
                f"cannot read CURVE keys from {path!r} ({exc}); "
                f"make them with 'zmesh keygen {path}'"
            ) from exc
        if not secret:
            raise SecurityError(f"{secret_file} holds no secret key")
        if not os.path.isdir(os.path.join(path, "authorized")):
            raise SecurityError(f"{path!r} has no authorized/ directory of client keys")
        return cls(os.path.abspath(path), public, secret)


def keygen(path: str) -> Keys:
    """Write a new keypair into ``path`` (secret 0600) and authorise its public key.

    ``zmq.auth.create_certificates`` writes the secret file 0644 under the
    usual umask; this writes it 0600 from the first byte.
    """
    os.makedirs(os.path.join(path, "authorized"), mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    public, secret = zmq.curve_keypair()
    body = "#   zmesh CURVE certificate\nmetadata\ncurve\n"
    pub_text = body + f'    public-key = "{public.decode()}"\n'
    sec_text = pub_text + f'    secret-key = "{secret.decode()}"\n'
    _write(os.path.join(path, "zmesh.key_secret"), sec_text, 0o600)
    _write(os.path.join(path, "zmesh.key"), pub_text, 0o644)
    _write(os.path.join(path, "authorized", "zmesh.key"), pub_text, 0o644)
    return Keys.load(path)


def _write(path: str, text: str, mode: int) -> None:
    if os.path.exists(path):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


# ------------------------------------------------------------ this process's keys

_keys: Keys | None = None
_loaded = False


def use(path: str | None) -> None:
    """Use the keys in ``path`` for every socket from now on (``None``: none)."""
    global _keys, _loaded
    _keys = Keys.load(path) if path else None
    _loaded = True
    # Child processes (embedded agents, procs, tools) follow the same choice.
    if _keys is not None:
        os.environ["ZMESH_KEYS"] = _keys.dir
    else:
        os.environ.pop("ZMESH_KEYS", None)


def active() -> Keys | None:
    """The keys in use: set by ``use()`` or by the ``ZMESH_KEYS`` variable."""
    global _keys, _loaded
    if not _loaded:
        path = os.environ.get("ZMESH_KEYS")
        _keys = Keys.load(path) if path else None
        _loaded = True
    return _keys


def secure_server(sock: Any, keys: Keys | None = None) -> Any:
    """Make ``sock`` (before bind) a CURVE server checked by the ZAP handler."""
    keys = keys or active()
    if keys is not None:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
        sock.setsockopt(zmq.ZAP_DOMAIN, DOMAIN.encode())
        sock.setsockopt(_ENFORCE_DOMAIN, 1)
    return sock


def secure_client(sock: Any, keys: Keys | None = None) -> Any:
    """Make ``sock`` (before connect) a CURVE client of servers using ``keys``."""
    keys = keys or active()
    if keys is not None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, keys.public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    return sock


def start_authenticator(ctx: Any, keys: Keys) -> Any:
    """Run the ZAP handler (a thread) that admits only the keys in ``authorized/``.

    Without it a CURVE server would accept any client key.
    """
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain=DOMAIN, location=keys.authorized)
    return auth


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1", "[::1]") or host.startswith("127.")
