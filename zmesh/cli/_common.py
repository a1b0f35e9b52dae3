"""What the commands that watch agents share: which agents, reached how, and JSON output."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from typing import Any

from zmesh._client.control import local as _local
from zmesh._errors import AgentError, SecurityError
from zmesh._shared import registry as _registry
from zmesh._wire import security as _security


def agent_args(parser: argparse.ArgumentParser, *, timeout: float = 5.0) -> None:
    """``--agents``, ``--hostfile``, ``--keys``, ``--timeout``."""
    parser.add_argument(
        "--agents",
        default=None,
        help="agents' control addresses, comma separated (tcp://HOST:PORT, HOST:PORT or ipc://PATH)",
    )
    parser.add_argument("--hostfile", default=None, help="a file with one agent address a line")
    parser.add_argument(
        "--keys", default=None, help="a 'zmesh keygen' directory (default: ZMESH_KEYS)"
    )
    parser.add_argument(
        "--timeout", type=float, default=timeout, help="seconds to wait for the agents' answers"
    )


def doc_help(parser: argparse.ArgumentParser, doc: str | None) -> None:
    """Make a module's docstring ``parser``'s description, as a terminal shows text:
    without the reStructuredText markup (````x````, ``::``), line breaks kept."""
    parser.description = (doc or "").replace("``", "").replace("::\n", ":\n")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def json_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON")


def print_json(obj: Any) -> None:
    """``obj`` as indented JSON on stdout (bytes as hex: a wire blob must not crash it)."""
    sys.stdout.write(json.dumps(obj, indent=1, default=_json_default) + "\n")
    sys.stdout.flush()  # a reader of a pipe (zmesh up --attach --json) needs it now


def _json_default(obj: Any) -> Any:
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj).hex()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


_HOST_PORT = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})")


def normalize_address(addr: str) -> str:
    """An agent's address as zmq takes it: ``HOST:PORT`` becomes ``tcp://HOST:PORT``.

    Raises:
        AgentError: not ``tcp://HOST:PORT``, ``HOST:PORT`` or ``ipc://PATH``.
    """
    addr = addr.strip()
    if addr.startswith("ipc://") and len(addr) > len("ipc://"):
        return addr
    bare = addr[len("tcp://") :] if addr.startswith("tcp://") else addr
    if _HOST_PORT.fullmatch(bare) and 0 < int(bare.rsplit(":", 1)[1]) < 65536:
        return f"tcp://{bare}"
    raise AgentError(
        f"{addr!r} is not an agent address: give tcp://HOST:PORT, HOST:PORT or ipc://PATH"
    )


def agent_addresses(args: argparse.Namespace, *, allow_none: bool = False) -> list[str]:
    """The agents a command talks to, and the keys it reaches them with.

    ``--agents``, else ``--hostfile``; else every live agent of this user on
    this machine (the registry) together with ``ZMESH_AGENTS`` /
    ``ZMESH_HOSTFILE``. Found in the registry, an agent is reached with the
    keys it registered (each its own: two local agents may use different
    ``--keys``); every other agent with ``--keys`` or ``ZMESH_KEYS``, else
    the keys of the first keyed local agent.

    Raises:
        AgentError: no agents at all (unless ``allow_none``), a bad address
            or an unreadable host file.
        SecurityError: unreadable keys.
    """

    if args.keys:
        _security.use(args.keys)
    if args.agents:
        found = [a for a in args.agents.split(",") if a.strip()]
    elif args.hostfile:
        found = _local.read_hostfile(args.hostfile)
    else:
        entries = _registry.live()
        for e in entries:
            if e.keys:  # a keyed agent of ours: its keys are ours to reach it with
                with contextlib.suppress(SecurityError):  # gone since: the common keys
                    _security.use_for(e.address, e.keys)
        found = [e.address for e in entries] + (_local.configured_agents() or [])
        if _security.active() is None:
            keyed = [e.keys for e in entries if e.keys]
            if keyed:  # for the agents the registry does not know
                _security.use(keyed[0])
    out: list[str] = []
    for a in found:
        norm = normalize_address(a)
        if norm not in out:
            out.append(norm)
    if not out and not allow_none:  # (live top waits for agents to start)
        raise AgentError(
            "no agents to watch: none of yours runs on this machine; give --agents "
            "tcp://HOST:PORT,..., set ZMESH_AGENTS, or give --hostfile"
        )
    return out
