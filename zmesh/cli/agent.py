"""``zmesh agent``: run one host agent in the foreground."""

from __future__ import annotations

import argparse
import logging
import sys

from zmesh._errors import SecurityError
from zmesh._host.agent import HostAgent
from zmesh._wire.boundary import AgentReady, ready_line
from zmesh._wire.security import Keys


def main(argv: list[str] | None = None) -> None:
    """``zmesh agent``: run one host agent in the foreground."""
    parser = argparse.ArgumentParser(prog="zmesh agent", description=main.__doc__)
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        keys = Keys.load(args.keys) if args.keys else None
        agent = HostAgent(
            args.bind, label=args.label, log_dir=args.log_dir, parent_pid=args.parent_pid,
            keys=keys, insecure=args.insecure,
        )  # fmt: skip
    except SecurityError as exc:
        parser.error(str(exc))
    if keys is None and args.bind.startswith("tcp://"):
        print(
            f"\n*** WARNING: zmesh agent on {args.bind} WITHOUT authentication (--insecure).\n"
            "*** Anyone who can reach this address can run any code as this user\n"
            "*** (on loopback that is every local user): what it sends is unpickled.\n"
            "*** Use 'zmesh keygen DIR' and '--keys DIR' instead.\n",
            file=sys.stderr,
            flush=True,
        )

    def ready(info: AgentReady) -> None:
        # One machine-readable line, for whoever started us and waits for it.
        print(ready_line(info), flush=True)

    try:
        agent.run(ready)
    except SecurityError as exc:  # a socket or log directory that is not ours alone
        print(f"zmesh agent: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
