"""A detached service: made by one script, used by others, stopped by name.

Needs an agent that outlives scripts (the embedded one ends with its script)::

    zmesh agent &                 # prints its address: ZMESH-AGENT-READY {"control": ...}
    export ZMESH_AGENTS=ipc://... # that address

    python examples/detached_service.py up     # makes "embedder" (2 replicas), exits
    python examples/detached_service.py call   # any script: zmesh.lookup("embedder")
    zmesh stop embedder                        # or: python examples/detached_service.py down

With no argument it runs all three as separate processes, and between the
calls SIGKILLs a replica whose creator is long gone: the orchestrator on the
agent respawns it. Look for ``up: made embedder``, ``call: [0, 2, 4, 6]``
(twice) and ``down: stopped``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import zmesh


class Embedder(zmesh.Actor):
    @zmesh.endpoint
    def embed(self, x: int) -> int:
        return 2 * x

    @zmesh.endpoint
    def pid(self) -> int:
        return os.getpid()


def up() -> None:
    svc = Embedder.options(name="embedder", replicas=2, detached=True).spawn().get(timeout=60)
    print(f"up: made embedder with {len(svc)} replicas; this script exits now", flush=True)


def call() -> None:
    svc = zmesh.lookup("embedder").get(timeout=30)
    print("call:", [svc.embed(i).get(timeout=30) for i in range(4)], flush=True)


def kill_one() -> None:
    svc = zmesh.lookup("embedder").get(timeout=30)
    pid = svc.replica(0).pid.call_one().get(timeout=10)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the orchestrator, not this script, respawns it
        mesh = svc.replica(0)
        if mesh is not None and svc.statistics().replicas[0].restarts:
            print(f"kill: replica 0 (pid {pid}) killed and respawned", flush=True)
            return
        time.sleep(0.1)
    raise SystemExit("replica 0 was not respawned")


def down() -> None:
    zmesh.lookup("embedder").get(timeout=30).stop().get(timeout=30)
    print("down: stopped", flush=True)


def main() -> None:
    if not os.environ.get("ZMESH_AGENTS"):
        raise SystemExit("set ZMESH_AGENTS to the address of a running 'zmesh agent' first")
    steps = {"up": up, "call": call, "kill": kill_one, "down": down}
    if len(sys.argv) > 1:
        steps[sys.argv[1]]()
        return
    for step in ("up", "call", "kill", "call", "down"):  # each its own script
        subprocess.run([sys.executable, __file__, step], check=True)


if __name__ == "__main__":
    main()
