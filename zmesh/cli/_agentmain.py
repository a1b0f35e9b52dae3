"""``zmesh agent``'s second half: the agent itself, once its forkserver is starting.

``zmesh/cli/agent.py`` starts the forkserver first and imports this module
after, so that the two processes' imports overlap on two cores.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import subprocess
import sys

from zmesh._errors import AgentError, SecurityError
from zmesh._host.agent.forkserver import ForkServer
from zmesh._host.agent.hostagent import HostAgent
from zmesh._shared import registry as _registry
from zmesh._wire.boundary import AgentReady, encode, ready_line
from zmesh._wire.security import Keys


def serve(args: argparse.Namespace, epoch: str, popen: subprocess.Popen[bytes] | None) -> int:
    """Run the agent in the foreground until it stops; the command's exit code."""
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
        if forkserver is not None:
            forkserver.close()  # before the janitor finds it orphaned
        print(f"zmesh agent: error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        if entry:
            _registry.unregister(entry)
    return 0
