"""Private directories: where zmesh keeps its sockets and its logs.

On one host zmesh's sockets are ipc:// (Unix domain) sockets, and what keeps
other local users out of them is the directory they live in: connecting to a
Unix socket needs search permission on every directory above it, so a socket
in a directory that only we may enter is ours alone (loopback TCP, by
contrast, is open to every uid on the machine). Logs hold whatever procs
print, so they are kept the same way.

Every directory here is checked before use: it must be a real directory (not
a symlink), owned by this user, with no access for group or others.
Anything else is refused with a ``SecurityError`` that names the path: a
directory someone else made in ``/tmp`` first is how one user reads or
hijacks another's sockets.

* ``runtime_dir()``: ``$XDG_RUNTIME_DIR/zmesh`` when that exists and is
  ours and private, else ``/tmp/zmesh-<uid>`` (``ZMESH_RUNTIME_DIR``
  overrides both). Each agent keeps its sockets in ``a<pid>/`` there, with
  short names: a Unix socket path must fit in ``sun_path`` (108 bytes).
* ``log_root()``: ``$ZMESH_LOG_DIR``, else ``$XDG_CACHE_HOME/zmesh/logs``
  (``~/.cache/zmesh/logs``), else ``runtime_dir()/logs``. Each client's
  embedded agents log into a *run directory* there; old runs are removed
  (``prune_runs``) so they do not pile up.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import time

from zmesh._errors import SecurityError

# A Unix socket path longer than this cannot be bound (sun_path is 108 bytes
# with its NUL); an agent's directory must leave room for "/a<pid>/p<n>".
_MAX_BASE = 72
RUN_MARKER = ".zmesh-run"  # in a run directory: the pid of the process it belongs to
KEEP_RUNS = 50
MAX_RUN_AGE = 7 * 86400.0


def private_dir(path: str, *, create: bool = True, strict: bool = True) -> str:
    """Return ``path`` after checking that it is ours; create it 0700 if missing.

    Args:
        path: the directory.
        create: make it (and missing parents, 0700) if it does not exist.
        strict: also refuse group or other access, and a symlink. Directories
            zmesh picks itself are strict; one the user named (``--log-dir``)
            need only be theirs.

    Raises:
        SecurityError: it is not a directory, or is owned by another user, or
            (``strict``) is a symlink or open to group or others.
    """
    if create:
        parent = os.path.dirname(os.path.abspath(path))
        try:
            if not os.path.isdir(parent):
                os.makedirs(parent, mode=0o700, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise SecurityError(f"cannot create the private directory {path}: {exc}") from exc
    check_private(path, strict=strict)
    return path


def check_private(path: str, *, strict: bool = True) -> None:
    """Refuse ``path`` unless it is a directory of this user (``strict``: only theirs).

    Raises:
        SecurityError: with the path and what is wrong with it.
    """
    try:
        st = os.lstat(path) if strict else os.stat(path)
    except OSError as exc:
        raise SecurityError(f"cannot use {path}: {exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise SecurityError(f"refusing {path}: it is a symbolic link, not a directory")
    if not stat.S_ISDIR(st.st_mode):
        raise SecurityError(f"refusing {path}: it is not a directory")
    if st.st_uid != os.getuid():
        raise SecurityError(
            f"refusing {path}: it belongs to uid {st.st_uid}, not to us (uid {os.getuid()}); "
            "another user may have made it to read or take over zmesh's files"
        )
    if strict and st.st_mode & 0o077:
        raise SecurityError(
            f"refusing {path}: group or others may access it "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); 'chmod 700 {path}' if it is yours"
        )


def runtime_dir() -> str:
    """This user's private directory for sockets (see the module docstring).

    Raises:
        SecurityError: the directory exists but is not private to us.
    """
    explicit = os.environ.get("ZMESH_RUNTIME_DIR")
    if explicit:
        return private_dir(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and len(xdg) < _MAX_BASE - 6:
        try:
            check_private(xdg)
        except SecurityError:
            pass  # not a usable runtime directory: fall back to /tmp
        else:
            return private_dir(os.path.join(xdg, "zmesh"))
    tmp = tempfile.gettempdir()
    if len(tmp) > _MAX_BASE - 16:
        tmp = "/tmp"
    return private_dir(os.path.join(tmp, f"zmesh-{os.getuid()}"))


def agent_socket_dir() -> str:
    """A fresh private directory for this agent's sockets: ``runtime_dir()/a<pid>``.

    Directories of agents that died without cleaning up (kill -9) are
    removed first.

    Raises:
        SecurityError: the runtime directory is not private to us.
    """
    base = runtime_dir()
    for entry in os.listdir(base):
        m = re.fullmatch(r"a(\d+)", entry)
        if m and (int(m.group(1)) == os.getpid() or not pid_exists(int(m.group(1)))):
            shutil.rmtree(os.path.join(base, entry), ignore_errors=True)
    return private_dir(os.path.join(base, f"a{os.getpid()}"))


def local_agents() -> list[str]:
    """Control addresses of this user's running ipc:// agents on this machine."""
    try:
        base = runtime_dir()
        entries = sorted(os.listdir(base))
    except (SecurityError, OSError):
        return []
    found = []
    for entry in entries:
        m = re.fullmatch(r"a(\d+)", entry)
        control = os.path.join(base, entry, "c")
        if m and pid_exists(int(m.group(1))) and os.path.exists(control):
            found.append(f"ipc://{control}")
    return found


def ipc_path(addr: str) -> str:
    """``ipc:///run/x/c`` -> ``/run/x/c``; ``""`` for any other transport."""
    return addr[len("ipc://") :] if addr.startswith("ipc://") else ""


def log_root() -> str:
    """This user's private directory for logs (see the module docstring).

    Raises:
        SecurityError: the directory exists but is not private to us.
    """
    explicit = os.environ.get("ZMESH_LOG_DIR")
    if explicit:
        return private_dir(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(cache, "zmesh", "logs")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        pass  # no writable home (a service account): logs go with the sockets
    else:
        # Ours, or refused: a bad directory in our home is not silently replaced.
        return private_dir(path)
    return private_dir(os.path.join(runtime_dir(), "logs"))


def new_run_dir(name: str, *, unique: bool = False) -> str:
    """A private log directory for one run (``log_root()/name``), marked as ours.

    Runs of processes that are gone are pruned first (``prune_runs``).

    Args:
        name: the directory's name (with ``unique``: its prefix).
        unique: add a random suffix, for several runs in one process.

    Raises:
        SecurityError: the log root is not private to us.
    """
    root = log_root()
    prune_runs(root)
    if unique:
        path = tempfile.mkdtemp(prefix=f"{name}-", dir=root)  # 0700
    else:
        path = private_dir(os.path.join(root, name))
    fd = os.open(os.path.join(path, RUN_MARKER), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return path


def prune_runs(root: str, keep: int = KEEP_RUNS, max_age: float = MAX_RUN_AGE) -> list[str]:
    """Remove old run directories in ``root``; return the ones removed.

    Only directories holding a run marker are candidates, and never one whose
    process is still alive. Of the rest, the ``keep`` newest stay unless they
    are older than ``max_age`` seconds.
    """
    runs: list[tuple[float, str]] = []
    for entry in os.listdir(root):
        path = os.path.join(root, entry)
        try:
            with open(os.path.join(path, RUN_MARKER)) as f:
                pid = int(f.read().strip() or 0)
            mtime = os.stat(path).st_mtime
        except (OSError, ValueError):
            continue  # not a run directory (an agent's own --label dir, say)
        if pid and pid_exists(pid):
            continue
        runs.append((mtime, path))
    runs.sort(reverse=True)
    now = time.time()
    removed = []
    for i, (mtime, path) in enumerate(runs):
        if i >= keep or now - mtime > max_age:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def stderr_path(log_path: str) -> str:
    """Where a proc whose log is ``log_path`` writes its stderr (``.err`` beside it).

    The agent copies its lines into the log, marked (``zmesh._host.agent.logtail``).
    """
    return os.path.splitext(log_path)[0] + ".err"


def open_private(path: str, *, append: bool = True) -> int:
    """Open ``path`` for writing as a file only we can read (0600); return the fd."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)  # a file that existed keeps its mode otherwise
    return fd


def pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (ours or not; a zombie still exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
