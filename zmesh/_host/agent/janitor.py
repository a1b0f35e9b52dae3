"""An agent's janitor: the one process that outlives the agent, for a moment.

While the agent lives it stops what its procs leave behind itself (see
``strays.Strays.sweep``). An agent that is SIGKILLed cannot: its procs die with
it (``PR_SET_PDEATHSIG``), but their children are handed to init, out of
reach. So each agent starts a janitor: a small process in a session of its
own that blocks reading a pipe whose only writer is the agent. When the agent
is gone, for any reason, the read returns; the janitor then kills every
process tagged with that agent's incarnation (``ZMESH_PROC`` in its
environment names the agent's ``epoch``), with everything below it, and
exits.

A descendant that emptied its environment carries no tag: once the agent is
gone nothing says whose it is, so it is the one thing that can escape an
agent's SIGKILL (an agent that stops normally finds it by the tree).
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

if __name__ == "__main__":
    # Run as a script by a bare interpreter (-S -E: ~4x cheaper to start than
    # one that imports the zmesh package): its module sits next to us.
    import ptree as _ptree
else:
    from zmesh._host.agent import ptree as _ptree

if TYPE_CHECKING:
    import subprocess

# Procs die of PDEATHSIG at the agent's death, and their children go to init
# meanwhile: look again for this long.
SWEEP_FOR = 1.0
CLEAN = b"clean"  # what an agent writes when it stopped all of its processes itself


def start(epoch: str) -> tuple[subprocess.Popen[bytes], int] | None:
    """Start the janitor of the agent incarnation ``epoch`` (this process).

    Returns the janitor and the pipe's write end, which the agent keeps open
    (and never passes to a child) until it exits; ``None`` if it cannot start.
    """
    import subprocess

    if not sys.platform.startswith("linux"):
        return None
    r, w = os.pipe()  # both close on exec: no child of the agent holds w
    try:
        popen = subprocess.Popen(
            [sys.executable, "-S", "-E", os.path.abspath(__file__), epoch],
            stdin=r, stdout=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    except OSError:
        os.close(w)
        return None
    finally:
        os.close(r)
    return popen, w


class Janitor:
    """An agent's handle on its janitor: started again if someone kills it."""

    def __init__(self, epoch: str) -> None:
        self.epoch = epoch
        self._started = start(epoch)

    def pids(self) -> set[int]:
        """The janitor's pid (none if it cannot run), after restarting a dead one."""
        if self._started is not None and self._started[0].poll() is not None:
            import logging

            code = self._started[0].returncode
            logging.getLogger("zmesh.agent").warning(
                "janitor exited with %s; starting another", code
            )
            os.close(self._started[1])
            self._started = start(self.epoch)
        return {self._started[0].pid} if self._started is not None else set()

    def close(self) -> None:
        """Tell the janitor that the agent stopped everything itself (one look is enough)."""
        if self._started is not None:
            os.write(self._started[1], CLEAN)
            os.close(self._started[1])
            self._started = None


def sweep(epoch: str, duration: float = SWEEP_FOR) -> int:
    """Kill every process tagged with ``epoch``, and their trees; return how many."""
    killed: set[int] = set()
    deadline = time.monotonic() + duration
    while True:
        found = [p for p in _ptree.tagged(epoch) if p not in killed]
        for pid in found:
            _ptree.kill_tree(pid)
        killed.update(found)
        if time.monotonic() > deadline:
            return len(killed)
        time.sleep(0.05)


def main(epoch: str) -> None:
    said = b""
    while chunk := os.read(0, 4096):  # returns b"" when the agent is gone
        said += chunk
    # An agent that shut down cleanly says so first: one look is enough then.
    n = sweep(epoch, 0.0 if said.endswith(CLEAN) else SWEEP_FOR)
    if n:
        print(f"zmesh janitor: agent {epoch} is gone; stopped {n} of its processes",
              file=sys.stderr, flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
