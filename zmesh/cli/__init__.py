"""The ``zmesh`` command."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    """Dispatch ``zmesh <command> ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {"agent": "zmesh._agent"}
    if not args or args[0] in ("-h", "--help") or args[0] not in commands:
        print("usage: zmesh {agent} [options]\n\n  agent   run a host agent", file=sys.stderr)
        raise SystemExit(0 if args and args[0] in ("-h", "--help") else 2)
    import importlib

    module = importlib.import_module(commands[args[0]])
    module.main(args[1:])
