"""``zmesh cluster --agents N``: N agents on this machine, as N hosts, until Ctrl+C.

By default the agents listen on ipc:// sockets in a directory only this user
can enter, so no other local user can reach them and no keys are needed.
``--tcp`` puts them on loopback TCP instead, with CURVE: keys made for this
run in a private directory (printed as ``ZMESH_KEYS=``, removed at exit), or
the agents' keys given with ``--keys``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading

from zmesh._errors import ZmeshError
from zmesh._shared import paths as _paths
from zmesh._wire import security as _security
from zmesh.testing import AgentProcess, start_agent, stop_agent


def configure_cluster(parser: argparse.ArgumentParser) -> None:
    """``zmesh cluster``'s options."""
    parser.add_argument("--agents", type=int, default=2, help="how many agents (hosts)")
    parser.add_argument("--log-dir", default=None, help="where agent and proc logs go")
    parser.add_argument(
        "--tcp", action="store_true", help="loopback TCP with CURVE keys instead of ipc://"
    )
    parser.add_argument("--keys", default=None, help="with --tcp: an agents' key directory")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="with --tcp: no keys (every local user can run code as you)",
    )
    parser.add_argument(
        "--json", action="store_true", help='one JSON line {"agents", "keys", "logs"} when ready'
    )


def run_cluster(args: argparse.Namespace) -> int:
    """Start N agents, print the ``ZMESH_AGENTS=...`` line, stop them on Ctrl+C."""
    if args.agents < 1:
        print("zmesh cluster: error: --agents must be at least 1", file=sys.stderr)
        return 2
    if (args.keys or args.insecure) and not args.tcp:
        print("zmesh cluster: error: --keys and --insecure go with --tcp", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    agents: list[AgentProcess] = []
    made_keys = ""
    try:
        base = args.log_dir or _paths.new_run_dir(f"cluster-{os.getpid()}")
        keys = args.keys
        if args.tcp and not keys and not args.insecure:
            made_keys = keys = _security.throwaway_keys(f"cluster-{os.getpid()}").dir
        bind = "tcp://127.0.0.1:0" if args.tcp else None
        for i in range(args.agents):
            log_dir = os.path.join(base, f"host{i}")
            agent = start_agent(f"host{i}", log_dir, bind=bind, keys=keys, insecure=args.insecure)
            agents.append(agent)
    except ZmeshError as exc:
        for a in agents:
            stop_agent(a)
        if made_keys:
            shutil.rmtree(made_keys, ignore_errors=True)
        print(f"zmesh cluster: error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.json:
            out = {
                "agents": [a.control for a in agents],
                "keys": os.path.abspath(keys) if keys else "",
                "logs": base,
            }
            print(json.dumps(out), flush=True)
        else:
            print(f"ZMESH_AGENTS={','.join(a.control for a in agents)}", flush=True)
            if keys:
                print(f"ZMESH_KEYS={os.path.abspath(keys)}", flush=True)
            print(f"# {len(agents)} agents; logs in {base}; Ctrl+C stops them all", flush=True)
        while not stop.wait(0.5):
            for a in list(agents):
                if a.popen.poll() is not None:
                    if not args.json:
                        code = a.popen.returncode
                        print(f"# agent {a.label} exited with code {code}", flush=True)
                    agents.remove(a)
            if not agents:
                break
    finally:
        for a in agents:
            stop_agent(a)
        if made_keys:
            shutil.rmtree(made_keys, ignore_errors=True)
    return 0
