"""``zmesh cluster --agents N``: N agents on loopback, as N hosts, until Ctrl+C."""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading

from zmesh.testing import AgentProcess, start_agent, stop_agent


def main(argv: list[str] | None = None) -> None:
    """Start N loopback agents, print the ``ZMESH_AGENTS=...`` line, stop them on Ctrl+C."""
    parser = argparse.ArgumentParser(prog="zmesh cluster", description=main.__doc__)
    parser.add_argument("--agents", type=int, default=2, help="how many agents (hosts)")
    parser.add_argument("--log-dir", default=None, help="where agent and proc logs go")
    args = parser.parse_args(argv)
    if args.agents < 1:
        parser.error("--agents must be at least 1")
    base = args.log_dir or tempfile.mkdtemp(prefix="zmesh-cluster-")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    agents: list[AgentProcess] = []
    try:
        for i in range(args.agents):
            agents.append(start_agent(f"host{i}", os.path.join(base, f"host{i}")))
        print(f"ZMESH_AGENTS={','.join(a.control for a in agents)}", flush=True)
        print(f"# {len(agents)} agents; logs in {base}; Ctrl+C stops them all", flush=True)
        while not stop.wait(0.5):
            for a in agents:
                if a.popen.poll() is not None:
                    print(f"# agent {a.label} exited with code {a.popen.returncode}", flush=True)
                    agents.remove(a)
            if not agents:
                break
    finally:
        for a in agents:
            stop_agent(a)
