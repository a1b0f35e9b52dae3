"""``zmesh agent``: run one host agent in the foreground."""

from __future__ import annotations

import argparse
import logging
import secrets

from zmesh._host.agent import forklaunch
from zmesh.cli._common import normalize_address


def configure_agent(parser: argparse.ArgumentParser) -> None:
    """``zmesh agent``'s options."""
    parser.add_argument(
        "--bind",
        default="ipc://",
        help="control address: ipc:// (default: a socket only this user can reach) "
        "or tcp://ADDR:PORT (needs --keys)",
    )
    parser.add_argument("--label", default=None, help="this host's name")
    parser.add_argument("--log-dir", default=None, help="where proc logs go")
    parser.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--keys", default=None, help="a 'zmesh keygen' directory: use CURVE")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow a TCP bind without keys (anyone who reaches it runs code as you)",
    )
    parser.add_argument(
        "--json", action="store_true", help="the ready line as bare JSON (no ZMESH-AGENT-READY)"
    )


def run_agent(args: argparse.Namespace) -> int:
    """``zmesh agent``: run one host agent in the foreground, registered for the CLI."""
    if not args.bind.startswith(("ipc://", "tcp://")):
        args.bind = normalize_address(args.bind)  # HOST:PORT
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # The forkserver first: its imports (~0.2 s of CPU) then overlap with the
    # agent's own, on another core, instead of following them: a script's
    # first spawn waits for both.
    epoch = secrets.token_hex(6)
    try:
        popen = forklaunch.launch(epoch)
    except OSError:
        popen = None  # the agent tries again, and says why
    # Late, for the same overlap: the agent's own modules load only now.
    from zmesh.cli import _agentmain

    return _agentmain.serve(args, epoch, popen)
