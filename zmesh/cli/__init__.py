"""The ``zmesh`` command: one argparse parser, one subcommand per module here.

Only the chosen command's module is imported (``zmesh agent`` starts on the
path of every embedded spawn, and need not load the dashboard); the others
contribute their one-line help to ``zmesh --help``. Each command module has
``configure_<name>(parser)`` and ``run_<name>(args) -> int | None``.

What a user can get wrong ends in one line on stderr and exit code 2, never
a traceback: an unknown command or option, a bad address, an unreachable
agent, a ``ZmeshError``. Ctrl+C ends a command quietly (130), and a closed
pipe (``zmesh ps | head``) ends it silently.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from zmesh import __version__
from zmesh._errors import ZmeshError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("zmesh.cli.agent", "run a host agent"),
    "cluster": ("zmesh.cli.cluster", "run N agents on this machine as N hosts, until Ctrl+C"),
    "keygen": ("zmesh.cli.keygen", "write CURVE keys for agents and clients"),
    "top": ("zmesh.cli.top", "a live dashboard of every agent's meshes"),
    "status": ("zmesh.cli.top", "health now: exit 0 healthy, 1 degraded, 2 unreachable"),
    "ps": ("zmesh.cli.top", "one line per proc (history folded unless --all)"),
    "stack": ("zmesh.cli.top", "the Python stack of every thread of a live proc"),
    "logs": ("zmesh.cli.logs", "what a mesh's procs printed (every rank by default; -f follows)"),
    "stop": ("zmesh.cli.logs", "stop a detached service, or a mesh, by name"),
    "get": ("zmesh.cli.get", "a mesh by name: its generation and every rank, from each agent"),
    "http": ("zmesh.cli.http", "serve detached services over HTTP/JSON and SSE (zmesh[http])"),
    "up": ("zmesh.cli.up", "start one agent per host of a host file (ssh, srun, ...)"),
    "down": ("zmesh.cli.up", "stop the agents 'zmesh up' started"),
}


def version() -> str:
    """The installed zmesh's version."""

    return __version__


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; only ``chosen`` gets its options (its module is imported)."""
    parser = argparse.ArgumentParser(
        prog="zmesh",
        description="zmesh: a broker-less actor fabric. 'zmesh COMMAND --help' for a command.",
    )
    parser.add_argument("--version", action="version", version=f"zmesh {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == chosen:
            mod = importlib.import_module(module)
            getattr(mod, f"configure_{name}")(p)
            p.set_defaults(run=getattr(mod, f"run_{name}"))
    return parser


def _first_word(args: list[str]) -> str | None:
    for a in args:
        if not a.startswith("-"):
            return a
        if a in ("-h", "--help", "--version"):
            return None
    return None


def main(argv: list[str] | None = None) -> None:
    """Dispatch ``zmesh <command> ...``; exits with the command's code."""
    args = list(sys.argv[1:] if argv is None else argv)
    chosen = _first_word(args)
    if chosen is not None and chosen not in COMMANDS:
        print(
            f"zmesh: unknown command {chosen!r} (commands: {', '.join(COMMANDS)}; "
            "'zmesh --help' says what each does)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    try:
        parser = build_parser(chosen)
        if not args:
            parser.print_help()
            raise SystemExit(2)
        ns = parser.parse_args(args)
    except BrokenPipeError:  # `zmesh --help | head -1`
        _silence_stdout()
        raise SystemExit(0) from None
    raise SystemExit(_run(ns))


def _silence_stdout() -> None:
    # The reader went away: say nothing more, to nobody (and not at exit either).
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _run(ns: argparse.Namespace) -> int:
    try:
        code: Any = ns.run(ns)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return int(code or 0)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # `zmesh ps | head`
        _silence_stdout()
        return 0
    except ZmeshError as exc:
        print(f"zmesh {ns.command}: error: {exc}", file=sys.stderr)
        return 2
