"""The worker pool grows past its base when all its threads are blocked; full, it says so once."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from zmesh._shared.workers import Workers


def test_threads_that_wait_for_each_other_each_get_one() -> None:
    pool = Workers(max_threads=50, base=8)
    barrier = threading.Barrier(40, timeout=10)
    try:
        futs = [pool.submit(barrier.wait) for _ in range(40)]
        assert sorted(f.result(timeout=15) for f in futs) == list(range(40))
        assert not pool.warned
    finally:
        pool.shutdown(wait=True)


def test_short_work_in_a_burst_keeps_to_the_base() -> None:
    pool = Workers(max_threads=500, base=4)
    try:
        futs = [pool.submit(sum, (i, 1)) for i in range(20_000)]
        assert [f.result(timeout=30) for f in futs] == [i + 1 for i in range(20_000)]
        assert len(pool._threads) <= 8  # progress all along: it had no reason to grow
    finally:
        pool.shutdown(wait=True)


def test_a_full_pool_logs_once_and_runs_the_rest_later(caplog: pytest.LogCaptureFixture) -> None:
    pool = Workers(max_threads=2)
    gate = threading.Event()
    caplog.set_level(logging.WARNING, logger="zmesh.workers")
    try:
        futs = [pool.submit(gate.wait, 10) for _ in range(5)]
        # Other threads of this process (a runtime left by an earlier test) can be
        # runnable, and then the pool waits out STUCK (1 s) first: on a loaded
        # machine that took over 5 s once. The pool sets ``warned`` just before it
        # logs (from its watcher thread), so the record is what is waited for.
        deadline = time.monotonic() + 30
        while not (
            warnings := [r for r in caplog.records if "ZMESH_PROC_THREADS" in r.getMessage()]
        ):
            assert time.monotonic() < deadline, "the full pool never said so"
            time.sleep(0.01)
        assert pool.warned and len(warnings) == 1
        gate.set()
        assert all(f.result(timeout=15) for f in futs)
    finally:
        gate.set()
        pool.shutdown(wait=True)


BURST = """
import os, sys
from zmesh._shared.workers import Workers
if len(sys.argv) > 1:  # starved from here on: the interpreter's start and imports ran at full speed
    os.sched_setaffinity(0, {int(sys.argv[1])})
    os.nice(15)
pool = Workers(max_threads=500, base=4)
futs = [pool.submit(sum, (i, 1)) for i in range(8_000)]  # several seconds starved
assert [f.result(timeout=60) for f in futs] == [i + 1 for i in range(8_000)]
print(len(pool._threads))
pool.shutdown(wait=True)
"""


@pytest.mark.stress
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_a_starved_process_does_not_read_its_wait_for_a_core_as_blocked() -> None:
    # A spinner shares one core with the burst, which runs at nice 15 (a twentieth of
    # the core): the process then goes tens of ms without the CPU, which is not its
    # threads being blocked. Before the pool asked the kernel, this grew 70-180 threads.
    core = {min(os.sched_getaffinity(0))}
    spin = [sys.executable, "-c", "while True: pass"]
    spinners = [subprocess.Popen(spin)]
    try:
        for p in spinners:
            os.sched_setaffinity(p.pid, core)
        out = subprocess.run(
            [sys.executable, "-c", BURST, str(min(core))],
            capture_output=True,
            text=True,
            timeout=90,
            check=True,
        ).stdout
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert int(out) <= 8, f"a starved pool grew to {out.strip()} threads"
