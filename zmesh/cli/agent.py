"""``zmesh agent``: run one host agent in the foreground."""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
from typing import TYPE_CHECKING

from zmesh._errors import AgentError, SecurityError
from zmesh._host import forklaunch
from zmesh._host.agent import HostAgent
from zmesh._host.forkserver import ForkServer
from zmesh._shared import registry as _registry
from zmesh._wire.boundary import encode, ready_line
from zmesh._wire.security import Keys
from zmesh.cli._common import normalize_address

if TYPE_CHECKING:
    from zmesh._wire.boundary import AgentReady


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

    forkserver = ForkServer(popen) if popen is not None else None

    try:
        keys = Keys.load(args.keys, agent=True) if args.keys else None
        agent = HostAgent(
            args.bind, label=args.label, log_dir=args.log_dir, parent_pid=args.parent_pid,
            keys=keys, insecure=args.insecure, epoch=epoch, forkserver=forkserver,
        )  # fmt: skip
    except SecurityError as exc:
        if forkserver is not None:
            forkserver.close()
        print(f"zmesh agent: error: {exc}", file=sys.stderr)
        return 2
    if keys is None and args.bind.startswith("tcp://"):
        print(
            f"\n*** WARNING: zmesh agent on {args.bind} WITHOUT authentication (--insecure).\n"
            "*** Anyone who can reach this address can run any code as this user\n"
            "*** (on loopback that is every local user): what it sends is unpickled.\n"
            "*** Use 'zmesh keygen DIR' and '--keys DIR' instead.\n",
            file=sys.stderr,
            flush=True,
        )

    entry = ""
    # Whoever reads our registry entry (this user only) may stop our meshes.
    agent.operator_secret = secrets.token_hex(16)  # type: ignore[attr-defined]

    def ready(info: AgentReady) -> None:
        nonlocal entry  # `zmesh top` and friends find us here with no --agents
        try:
            entry = _registry.register(
                info.control, info.label, keys=args.keys or "",
                owner=args.parent_pid or 0, log_dir=info.log_dir,
                operator=agent.operator_secret,  # type: ignore[attr-defined]
            )  # fmt: skip
        except SecurityError as exc:  # we still serve; the CLI just cannot find us
            logging.getLogger("zmesh.agent").warning("not registered: %s", exc)
        # One machine-readable line, for whoever started us and waits for it.
        print(encode(info).decode() if args.json else ready_line(info), flush=True)

    try:
        agent.run(ready)
    except (SecurityError, AgentError) as exc:  # not ours alone, or taken: say so, no traceback
        print(f"zmesh agent: error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        if entry:
            _registry.unregister(entry)
    return 0
