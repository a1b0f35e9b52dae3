"""The gateway's bearer token: kept in a file only its user can read, checked per request."""

from __future__ import annotations

import hmac
import os
import secrets
import stat

from zmesh._errors import SecurityError


def read_or_create(path: str) -> str:
    """The token in ``path``; a new random one written there (mode 0600) if it is missing.

    Raises:
        SecurityError: the file is readable or writable by others (anyone who
            can read it can call every service it serves), empty, or unreadable.
    """
    path = os.path.abspath(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read(path)
    except OSError as exc:
        raise SecurityError(f"cannot create the token file {path}: {exc.strerror}") from exc
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def _read(path: str) -> str:
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise SecurityError(f"cannot read the token file {path}: {exc.strerror}") from exc
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecurityError(
            f"the token file {path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}): "
            f"'chmod 600 {path}', or give a new path and a token is made there"
        )
    if not token:
        raise SecurityError(f"the token file {path} is empty")
    return token


def authorized(header: bytes | None, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` (``Bearer <token>``)."""
    if header is None:
        return False
    scheme, _, given = header.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer":
        return False
    # In constant time: how much of the token matched must not show in the timing.
    return hmac.compare_digest(given.strip().encode(), token.encode())
