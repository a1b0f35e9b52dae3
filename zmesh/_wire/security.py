"""CURVE keys, and who may connect to an agent or a proc.

An agent executes code on request, so reaching an agent is reaching a shell
(Ray's unauthenticated job API became CVE-2023-48022), and reaching a proc is
reaching ``pickle.loads``. So nothing zmesh binds accepts a peer that has
neither filesystem permission nor a key:

* ipc:// sockets (the default on one host) live in a directory only this
  user may enter (``zmesh._shared.paths``); they use no CURVE.
* Every TCP socket is a CURVE server with a ZAP handler over an allow-list of
  client public keys, fail-closed. Keyless TCP needs ``--insecure``.

Key directories, made by ``zmesh keygen`` (the layout of a Jupyter
connection file, split in two so that no client holds the agents' secret)::

    agents' directory (zmesh keygen DIR)     a client's (zmesh keygen --client DIR2 ...)
      zmesh.key          agents' public key    zmesh.key          the client's public key
      zmesh.key_secret   agents' secret, 0600  zmesh.key_secret   the client's secret, 0600
      agents.key         = zmesh.key           agents.key         the agents' public key
      authorized/*.key   who may connect

A client uses its own keypair and ``agents.key`` as the server key; an
agent (and its procs) uses the agents' keypair and admits the public keys in
``authorized/`` (which holds the agents' own key, so procs can reach each
other and the holder of the agents' directory is a client too). Files added
to or removed from ``authorized/`` take effect within about a second
(``Gate.refresh``); connections already made stay.

Measured pitfalls this avoids: a CURVE server *without* a ZAP handler
accepts any client key; pyzmq's authenticator domain ``'*'`` is not a
wildcard once a socket sets ``zap_domain``, so both use ``zmesh`` and
``ZAP_ENFORCE_DOMAIN`` makes a mismatch fail closed. Authorisation is by the
CURVE key (the ZAP User-Id), never by routing id.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.auth

from zmesh._errors import SecurityError
from zmesh._shared.paths import private_dir, runtime_dir

DOMAIN = "zmesh"
_ENFORCE_DOMAIN = getattr(zmq, "ZAP_ENFORCE_DOMAIN", 93)
SECRET_FILE = "zmesh.key_secret"
PUBLIC_FILE = "zmesh.key"
AGENTS_FILE = "agents.key"


@dataclass(frozen=True)
class Keys:
    """A keypair and the agents' public key, loaded from a ``zmesh keygen`` dir.

    Attributes:
        dir: the directory.
        public: this side's public key (z85).
        secret: this side's secret key (z85).
        server: the agents' public key, which client sockets expect.
    """

    dir: str
    public: bytes
    secret: bytes
    server: bytes

    @property
    def authorized(self) -> str:
        """The allow-list directory of an agents' key directory."""
        return os.path.join(self.dir, "authorized")

    @property
    def can_serve(self) -> bool:
        """Whether these are the agents' keys (so sockets may be CURVE servers)."""
        return self.public == self.server and os.path.isdir(self.authorized)

    @classmethod
    def load(cls, path: str, *, agent: bool = False) -> Keys:
        """Read the keys in ``path`` (``agent``: an agent's own, else a client's).

        Raises:
            SecurityError: the directory or a key file is missing or unreadable,
                or the secret key file may be read by group or others.
        """
        path = os.path.abspath(os.path.expanduser(path))
        secret_file = os.path.join(path, SECRET_FILE)
        try:
            public, secret = zmq.auth.load_certificate(secret_file)
            mode = stat.S_IMODE(os.stat(secret_file).st_mode)
        except (OSError, ValueError) as exc:
            # New agents' keys are right for an agent; a client's new keys would
            # be refused by every agent until authorised there.
            fix = (
                f"make them with 'zmesh keygen {path}'"
                if agent
                else "use the agents' key directory, or a client key authorised in it "
                "('zmesh keygen --client DIR --authorize-in AGENTS_DIR')"
            )
            raise SecurityError(f"cannot read CURVE keys from {path!r} ({exc}); {fix}") from exc
        if not secret:
            raise SecurityError(f"{secret_file} holds no secret key")
        if mode & 0o077:
            raise SecurityError(
                f"refusing {secret_file}: group or others may read it (mode {mode:04o}); "
                f"'chmod 600 {secret_file}'"
            )
        server = public
        agents_file = os.path.join(path, AGENTS_FILE)
        if os.path.exists(agents_file):
            try:
                server, _ = zmq.auth.load_certificate(agents_file)
            except (OSError, ValueError) as exc:
                raise SecurityError(f"cannot read the agents' public key {agents_file}") from exc
        return cls(path, public, secret, server)

    def check_server(self) -> None:
        """Refuse to serve with a client's keys.

        Raises:
            SecurityError: this directory holds a client's keypair, or has no
                ``authorized/`` allow-list.
        """
        if self.public != self.server:
            raise SecurityError(
                f"{self.dir} holds a client's keys (its agents.key is another key): an agent "
                "needs the agents' directory made by 'zmesh keygen DIR'"
            )
        if not os.path.isdir(self.authorized):
            raise SecurityError(f"{self.dir!r} has no authorized/ directory of client keys")


def keygen(path: str) -> Keys:
    """Write the agents' keypair into ``path`` (secret 0600) and authorise its public key.

    ``zmq.auth.create_certificates`` writes the secret file 0644 under the
    usual umask; this writes it 0600 from the first byte.
    """
    os.makedirs(os.path.join(path, "authorized"), mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    public, secret = zmq.curve_keypair()
    _write_pair(path, public, secret)
    _write(os.path.join(path, AGENTS_FILE), _cert(public), 0o644)
    _write(os.path.join(path, "authorized", PUBLIC_FILE), _cert(public), 0o644)
    return Keys.load(path)


def keygen_client(path: str, agents_key: bytes) -> Keys:
    """Write a client's own keypair into ``path``, with the agents' public key.

    The client's public key (``path/zmesh.key``) still has to be authorised
    on the agents (``authorize``, or a copy into their ``authorized/``).
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    public, secret = zmq.curve_keypair()
    _write_pair(path, public, secret)
    _write(os.path.join(path, AGENTS_FILE), _cert(agents_key), 0o644)
    return Keys.load(path)


def read_public(path: str) -> bytes:
    """The public key in a certificate file, or in a key directory's ``zmesh.key``.

    Raises:
        SecurityError: it cannot be read.
    """
    if os.path.isdir(path):
        path = os.path.join(path, PUBLIC_FILE)
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read a public key from {path!r} ({exc})") from exc
    return public


def authorize(agents_dir: str, public: bytes, name: str) -> str:
    """Admit ``public`` to the agents of ``agents_dir``: write ``authorized/<name>.key``.

    Raises:
        SecurityError: ``agents_dir`` is not an agents' key directory, the
            name is not a plain file name, or a key of that name exists.
    """
    Keys.load(agents_dir, agent=True).check_server()
    if not name or "/" in name or name.startswith("."):
        raise SecurityError(f"{name!r} cannot name a key file")
    target = os.path.join(agents_dir, "authorized", f"{name}.key")
    if os.path.exists(target):  # replacing it would lock out whoever holds that key
        raise SecurityError(f"{target} exists already: choose another name (--name)")
    _write(target, _cert(public), 0o644)
    return target


def _cert(public: bytes) -> str:
    return f'#   zmesh CURVE certificate\nmetadata\ncurve\n    public-key = "{public.decode()}"\n'


def _write_pair(path: str, public: bytes, secret: bytes) -> None:
    _write(
        os.path.join(path, SECRET_FILE),
        _cert(public) + f'    secret-key = "{secret.decode()}"\n',
        0o600,
    )
    _write(os.path.join(path, PUBLIC_FILE), _cert(public), 0o644)


def _write(path: str, text: str, mode: int) -> None:
    if os.path.exists(path):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


# ------------------------------------------------------------ this process's keys

_keys: Keys | None = None
_loaded = False
_by_agent: dict[str, Keys] = {}  # agent address -> its own keys (use_for)


def use(path: str | None) -> None:
    """Use the keys in ``path`` for every TCP socket from now on (``None``: none)."""
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
        try:
            _keys = Keys.load(path) if path else None
        except SecurityError as exc:
            raise SecurityError(f"ZMESH_KEYS={path}: {exc.message}") from exc
        _loaded = True
    return _keys


def use_for(address: str, path: str) -> None:
    """Reach the agent at ``address`` with the keys in ``path`` (other agents: ``active()``).

    The commands that watch this user's local agents read each one's keys
    from the registry: two agents started with different ``--keys`` are
    both reachable from one command.

    Raises:
        SecurityError: the keys cannot be read.
    """
    _by_agent[address] = Keys.load(path)


def keys_for(address: str) -> Keys | None:
    """The keys to reach the agent at ``address`` with: its own (``use_for``), else ``active()``."""
    return _by_agent.get(address) or active()


def _curve(addr: str | None) -> bool:
    # Unix sockets are guarded by their directory; every other transport by keys.
    return addr is None or not addr.startswith("ipc://")


def secure_server(sock: Any, keys: Keys | None = None, addr: str | None = None) -> Any:
    """Make ``sock`` (before it binds ``addr``) a CURVE server checked by the ZAP handler.

    An ipc:// address needs no keys: its directory keeps others out.
    """
    keys = keys or active()
    if keys is not None and _curve(addr):
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
        sock.setsockopt(zmq.ZAP_DOMAIN, DOMAIN.encode())
        sock.setsockopt(_ENFORCE_DOMAIN, 1)
    return sock


def secure_client(sock: Any, keys: Keys | None = None, addr: str | None = None) -> Any:
    """Make ``sock`` (before it connects to ``addr``) a CURVE client of the agents' key.

    An ipc:// address needs no keys; without ``addr`` the keys always apply.
    """
    keys = keys or active()
    if keys is not None and _curve(addr):
        sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    return sock


class Gate:
    """The ZAP handler (a thread) that admits only the keys in ``authorized/``.

    Without it a CURVE server would accept any client key. ``refresh()``
    re-reads the directory when it changed (files added or removed).
    """

    def __init__(self, ctx: Any, keys: Keys) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self.keys = keys
        self._stamp = self._mtime()
        self.auth = ThreadAuthenticator(ctx)
        self.auth.start()
        self.auth.configure_curve(domain=DOMAIN, location=keys.authorized)

    def _mtime(self) -> int:
        try:
            return os.stat(self.keys.authorized).st_mtime_ns
        except OSError:
            return 0

    def refresh(self) -> None:
        """Re-read ``authorized/`` if a key file was added or removed since."""
        stamp = self._mtime()
        if stamp != self._stamp:
            self._stamp = stamp
            self.auth.configure_curve(domain=DOMAIN, location=self.keys.authorized)

    def stop(self) -> None:
        """Stop the handler thread."""
        self.auth.stop()


def throwaway_keys(name: str) -> Keys:
    """Fresh agents' keys in ``runtime_dir()/name``, for one run (``zmesh cluster --tcp``).

    The directory is private to this user; whoever made it removes it.
    """
    return keygen(private_dir(os.path.join(runtime_dir(), name)))


def probe(addr: str, timeout: float = 10.0, keys: Keys | None = None) -> str:
    """Connect to ``addr`` with our keys (or none) and watch the handshake (blocking).

    A server that refuses our key says nothing to the socket itself (calls
    would just wait), but libzmq reports the refusal to a socket monitor.

    Returns:
        ``""`` if the handshake succeeded or nothing was heard within
        ``timeout``; else what went wrong, in a sentence with the fix.
    """
    import zmq.utils.monitor

    keys = keys or active()
    if not _curve(addr):
        return ""
    events = (
        zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    )
    sock = secure_client(zmq.Context.instance().socket(zmq.DEALER), keys, addr)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(events)
    try:
        sock.connect(addr)
        if not monitor.poll(int(timeout * 1000)):
            return ""
        event = zmq.utils.monitor.recv_monitor_message(monitor)
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
    if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
        return ""
    if keys is None:  # we spoke NULL to a CURVE server: it drops us at the greeting
        return (
            f"the agent at {addr} requires CURVE keys (it runs with --keys) and this client "
            "has none: set ZMESH_KEYS=DIR or zmesh.connect([...], keys=DIR), with DIR from "
            "'zmesh keygen --client DIR --authorize-in AGENTS_DIR'"
        )
    if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (
            f"the agent at {addr} refused our CURVE key (ZAP status {event['value']}): "
            f"authorise {os.path.join(keys.dir, PUBLIC_FILE)} in the agents' authorized/ "
            "(zmesh keygen --client DIR --authorize-in AGENTS_DIR)"
        )
    return (
        f"the CURVE handshake with {addr} failed: check that the agent runs with --keys "
        f"and that {os.path.join(keys.dir, AGENTS_FILE)} holds the agents' public key"
    )
