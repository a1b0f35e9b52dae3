"""The ``zmesh`` command."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    """Dispatch ``zmesh <command> ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "agent": ("zmesh.cli.agent", "main"),
        "cluster": ("zmesh.cli.cluster", "main"),
        "keygen": ("zmesh.cli.keygen", "main"),
        "top": ("zmesh.cli.top", "top_main"),
        "status": ("zmesh.cli.top", "status_main"),
        "ps": ("zmesh.cli.top", "ps_main"),
        "stack": ("zmesh.cli.top", "stack_main"),
    }
    if not args or args[0] in ("-h", "--help") or args[0] not in commands:
        print(
            "usage: zmesh {agent,cluster,keygen,top,status,ps,stack} [options]\n\n"
            "  agent   run a host agent\n"
            "  cluster run N agents on loopback as N hosts, until Ctrl+C\n"
            "  keygen  write a CURVE keypair for agents and clients\n"
            "  top     a live dashboard of the mesh (--once, --json)\n"
            "  status  health now: exit 0 healthy, 1 degraded, 2 unreachable\n"
            "  ps      one line per proc (--json; --all with history)\n"
            "  stack   the Python stack of every thread of a live proc",
            file=sys.stderr,
        )
        raise SystemExit(0 if args and args[0] in ("-h", "--help") else 2)
    import importlib

    module, func = commands[args[0]]
    getattr(importlib.import_module(module), func)(args[1:])
