"""The ``zmesh`` command."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    """Dispatch ``zmesh <command> ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "agent": "zmesh._agent",
        "cluster": "zmesh.cli._cluster",
        "keygen": "zmesh.cli._keygen",
        "top": "zmesh.top",
        "status": "zmesh.top.status",
        "ps": "zmesh.top.ps",
        "stack": "zmesh.top.stack",
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

    module = importlib.import_module(commands[args[0]])
    module.main(args[1:])
