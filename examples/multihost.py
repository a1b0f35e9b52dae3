"""A mesh over every configured host.

Start agents first, one per host (see docs/multihost.md), or on one machine:

    zmesh cluster --agents 2          # prints ZMESH_AGENTS=...
    ZMESH_AGENTS=... python examples/multihost.py

With agents on TCP ('zmesh cluster --agents 2 --tcp', or real nodes started with
--keys): add the ZMESH_KEYS=DIR it prints (or your 'zmesh keygen --client' DIR).
"""

from __future__ import annotations

import os
import socket
import sys

import zmesh


class Host(zmesh.Actor):
    @zmesh.endpoint
    def where(self) -> str:
        p = zmesh.current_rank()
        where = f"pid {os.getpid()} on {socket.gethostname()}"
        return f"rank {p.rank} (hosts={p['hosts']}, procs={p['procs']}) {where}"

    @zmesh.endpoint
    def total(self, values: list[int]) -> int:
        return sum(values)


def main() -> None:
    agents = [a for a in os.environ.get("ZMESH_AGENTS", "").split(",") if a]
    if not agents:
        sys.exit("set ZMESH_AGENTS (e.g. from 'zmesh cluster --agents 2') first")
    mesh = Host.options(hosts=len(agents), procs=2).as_actor().get(timeout=120)
    print(f"{mesh} over {len(agents)} agents")
    for where in mesh.where.call().get(timeout=30).values():
        print(" ", where)
    per_host = [mesh.slice(hosts=h) for h in range(len(agents))]
    sums = [m.total.call([h, 1, 2]).get(timeout=30).values() for h, m in enumerate(per_host)]
    print("per-host fan-out:", sums)
    mesh.stop().get(timeout=30)


if __name__ == "__main__":
    main()
