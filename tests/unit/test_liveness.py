"""The liveness policy (busy or hung), driven with made-up times and samples."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from zmesh._shared.liveness import (
    ProcLiveness,
    ProcSample,
    identity,
    machine,
    owner_pid,
    sample,
    watch_owner,
)

TICK = 0.1  # the agent's tick


def run(
    live: ProcLiveness,
    *,
    seconds: float,
    cpu_per_s: float = 0.0,
    state: str = "S",
    last_beat: float = 0.0,
    start: float = 0.0,
    cpu0: float = 0.0,
) -> tuple[float, str] | None:
    """Tick the judge from ``start`` for ``seconds``; (when, why) it first says hung."""
    looks = 0

    def look_at(t: float) -> ProcSample:
        nonlocal looks
        looks += 1
        return ProcSample(state, cpu0 + cpu_per_s * (t - start), 1)

    t = start
    while t <= start + seconds + 1e-9:
        why = live.judge(t, last_beat, lambda: look_at(t))  # noqa: B023 (called at once)
        if why is not None:
            return t, why
        t = round(t + TICK, 6)
    return None


def test_heartbeats_on_time_are_alive_without_looking() -> None:
    live = ProcLiveness(hang_timeout=10)

    def look() -> ProcSample:
        raise AssertionError("a proc whose heartbeats are on time is not looked at")

    for i in range(100):
        now = i * TICK
        assert live.judge(now, last_beat=now - 0.15, look=look) is None


def test_stopped_is_hung_as_soon_as_heartbeats_are_late() -> None:
    for state in ("T", "t"):
        live = ProcLiveness(hang_timeout=10, suspect_after=0.3)
        when, why = run(live, seconds=5, state=state) or (None, "")
        assert when is not None and 0.3 <= when < 0.4
        assert f"stopped (state {state})" in why and "no heartbeat" in why


def test_silent_but_computing_is_busy_forever() -> None:
    """A sync endpoint in one C call that holds the GIL: no beats, full CPU."""
    live = ProcLiveness(hang_timeout=10)
    assert run(live, seconds=120, cpu_per_s=1.0, state="S") is None


def test_silent_and_idle_is_hung_after_the_hang_timeout() -> None:
    live = ProcLiveness(hang_timeout=10)
    when, why = run(live, seconds=30) or (None, "")
    assert when is not None and 10 <= when < 10.2
    assert "no heartbeat for 10.0s" in why and "no CPU used for 10.0s" in why


def test_a_trickle_of_cpu_is_not_progress() -> None:
    """libzmq's I/O thread uses a little CPU in a hung proc: under 5 % is idle."""
    live = ProcLiveness(hang_timeout=5)
    assert run(live, seconds=30, cpu_per_s=0.01) is not None


def test_computing_then_idle_is_hung_a_hang_timeout_after_the_cpu_stopped() -> None:
    live = ProcLiveness(hang_timeout=5)
    assert run(live, seconds=20, cpu_per_s=1.0) is None  # busy for 20 s
    when, _ = run(live, seconds=30, start=20.1, cpu0=20.0) or (None, "")
    assert when is not None and 20 + 5 <= when <= 20 + 5 + 1.2  # within one CPU window


def test_a_heartbeat_starts_the_judgement_over() -> None:
    live = ProcLiveness(hang_timeout=5)
    assert run(live, seconds=4.5) is None  # 4.5 s of idle silence
    # It beat at t=4.5: the next silence is measured from there.
    assert run(live, seconds=4.5, start=4.6, last_beat=4.5) is None
    assert run(live, seconds=2, start=9.2, last_beat=4.5) is not None


def test_when_the_process_cannot_be_seen_silence_alone_decides() -> None:
    live = ProcLiveness(hang_timeout=3)
    assert live.judge(2.9, 0.0, lambda: None) is None
    assert live.judge(3.0, 0.0, lambda: None) == "no heartbeat for 3.0s"


@settings(max_examples=200, deadline=None)
@given(
    beats=st.lists(st.floats(min_value=0, max_value=60), max_size=20),
    jitter=st.lists(st.floats(min_value=0.0, max_value=0.5), min_size=1, max_size=50),
    share=st.floats(min_value=0.06, max_value=2.0),
)
def test_a_proc_that_keeps_computing_is_never_hung(
    beats: list[float], jitter: list[float], share: float
) -> None:
    """Whatever its heartbeats do and however irregular the agent's ticks (a
    loaded agent), a proc using more than the minimum CPU share is never hung."""
    live = ProcLiveness(hang_timeout=2.0)
    beats = sorted(beats)
    t, i, last = 0.0, 0, 0.0
    while t < 60:
        last = max([last, *(b for b in beats if b <= t)])
        assert live.judge(t, last, lambda: ProcSample("R", share * t, 1)) is None  # noqa: B023
        t += TICK + jitter[i % len(jitter)]
        i += 1


@settings(max_examples=200, deadline=None)
@given(hang=st.floats(min_value=0.5, max_value=30))
def test_an_idle_silent_proc_is_hung_within_a_tick_of_the_timeout(hang: float) -> None:
    live = ProcLiveness(hang_timeout=hang)
    when, _ = run(live, seconds=hang + 1) or (None, "")
    assert when is not None and hang <= when < hang + TICK + 1e-6


# ------------------------------------------------------------ the kernel's view


def test_sample_reads_this_process() -> None:
    before = sample(os.getpid())
    assert before is not None and before.state == "R"  # we are running this line
    sum(range(3_000_000))
    after = sample(os.getpid())
    assert after is not None and after.cpu > before.cpu and after.start == before.start


def test_sample_of_a_stopped_child_says_T() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while (s := sample(child.pid)) is None or s.state != "T":
            assert time.monotonic() < deadline, s
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    assert sample(child.pid) is None  # reaped: no such process


def test_watch_owner_opens_a_pidfd_only_for_the_same_process_here() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        seen = sample(child.pid)
        assert seen is not None
        assert watch_owner("another-boot/pid:[1]", child.pid, seen.start) is None
        assert watch_owner(machine(), child.pid, seen.start + 1) is None  # a reused pid
        assert watch_owner("", child.pid, seen.start) is None
        fd = watch_owner(machine(), child.pid, seen.start)
        assert fd is not None
        try:
            assert select.select([fd], [], [], 0)[0] == []  # alive: not readable
            child.kill()
            assert select.select([fd], [], [], 5)[0] == [fd]  # its death, at once
        finally:
            os.close(fd)
    finally:
        child.kill()
        child.wait()
    assert watch_owner(machine(), child.pid, seen.start) is None  # gone


def test_identity_is_what_watch_owner_expects() -> None:
    where, pid, start = identity()
    assert where == machine() and pid == os.getpid()
    fd = watch_owner(where, pid, start)
    assert fd is not None
    os.close(fd)


def test_owner_pid_is_the_pid_the_owner_id_names() -> None:
    from zmesh._client.control import local as _local

    assert owner_pid(_local.owner_id()) == os.getpid()
    assert owner_pid("node-7.example:4242:ab12cd34") == 4242
    assert owner_pid("fe80::1:4242:ab12cd34") == 4242  # a hostname with colons
    assert owner_pid("no-pid-here") is None
    assert owner_pid("host:notanumber:ab12") is None
