"""Forwarded output: deduplicated and rate-limited on the client; tailed and capped at the agent."""

from __future__ import annotations

import io
import time
from pathlib import Path
from types import SimpleNamespace

from zmesh._client.control import logforward
from zmesh._client.control.logforward import Printer
from zmesh._host.agent import logtail
from zmesh._host.agent.logtail import LogTail
from zmesh._wire import messages as w


def lines(mesh: str, rank: int, *text: str, skipped: int = 0) -> w.LogLines:
    return w.LogLines(mesh, rank, "host0", list(text), skipped=skipped, path="/x.log")


def test_the_same_line_from_many_ranks_is_printed_once_then_counted() -> None:
    out = io.StringIO()
    p = Printer(out)
    for r in range(4):
        p.lines(lines("m-1", r, "loading model"), 100.0)
    p.lines(lines("m-1", 2, "rank 2 only"), 100.1)
    assert out.getvalue().splitlines() == [
        "(m-1 0 host0) loading model",
        "(m-1 2 host0) rank 2 only",
    ]
    p.flush(100.0 + logforward.DEDUP_WINDOW)
    assert out.getvalue().splitlines()[-1] == "(m-1 host0) loading model [repeated 3x across ranks]"
    p.lines(lines("m-1", 0, "loading model"), 200.0)  # a new window: shown again
    assert out.getvalue().splitlines()[-1] == "(m-1 0 host0) loading model"


def test_past_the_rate_lines_are_cut_and_counted_on_stderr() -> None:
    out, err = io.StringIO(), io.StringIO()
    p = Printer(out, err)
    p.lines(lines("m-1", 0, *(f"line {i}" for i in range(logforward.MAX_LINES + 50))), 10.0)
    assert len(out.getvalue().splitlines()) == logforward.MAX_LINES
    assert len(p.seen) == logforward.MAX_LINES  # what is cut is not remembered
    p.flush(11.0)
    assert (
        err.getvalue().splitlines()[-1]
        == "[zmesh: 50 lines of actor output not shown; see zmesh logs]"
    )
    p.lines(lines("m-1", 0, "skipped some", skipped=1000), 11.5)
    p.lines(lines("m-1", 0, "skipped more", skipped=234), 11.6)
    p.flush(11.7)  # said once a second per proc, with the sum
    assert "1234 bytes of output not forwarded" in err.getvalue().splitlines()[-1]
    assert err.getvalue().count("bytes of output not forwarded") == 1
    assert p.cut_total == 50 and p.skipped_total == 1234
    assert len(out.getvalue().splitlines()) == logforward.MAX_LINES + 2  # notes are not stdout


def test_stderr_lines_go_to_stderr_and_stdout_lines_to_stdout() -> None:
    out, err = io.StringIO(), io.StringIO()
    p = Printer(out, err)
    p.lines(w.LogLines("m-1", 0, "host0", ["to out"], stream=1), 1.0)
    p.lines(w.LogLines("m-1", 1, "host0", ["to err", "to out"], stream=2), 1.0)
    assert out.getvalue() == "(m-1 0 host0) to out\n"
    assert err.getvalue() == "(m-1 1 host0) to err\n(m-1 1 host0) to out\n"  # not deduplicated


class FakePub:
    def __init__(self) -> None:
        self.sent: list[w.LogLines] = []

    def send(self, frames: list[bytes]) -> None:
        from zmesh._wire.codec import Codec

        self.sent.append(Codec(w.LOG_STREAM).decode(frames[1:]))


def _tail(tmp_path: Path) -> tuple[LogTail, Path, FakePub]:
    log = tmp_path / "m-1.0.g1.log"
    log.write_bytes(b"")
    proc = SimpleNamespace(log_path=str(log), generation=1, reaped=False)
    mesh = SimpleNamespace(spec=SimpleNamespace(owner="me"), procs={0: proc})
    tail = LogTail({"m-1": mesh}, "host0")
    pub = FakePub()
    tail._pub = pub  # type: ignore[assignment]
    tail._subscribed[b"me"] = 1
    return tail, log, pub


def test_the_agent_forwards_whole_lines_to_their_owner(tmp_path: Path) -> None:
    tail, log, pub = _tail(tmp_path)
    with open(log, "ab") as f:
        f.write(b"one\ntwo\npart")
    tail.tick()
    assert [m.lines for m in pub.sent] == [["one", "two"]]
    with open(log, "ab") as f:
        f.write(b"ial\n")
    tail.tick()
    assert pub.sent[-1].lines == ["partial"] and pub.sent[-1].mesh == "m-1"


def test_the_agent_copies_stderr_into_the_log_marked_and_forwards_it_apart(
    tmp_path: Path,
) -> None:
    tail, log, pub = _tail(tmp_path)
    err = tmp_path / "m-1.0.g1.err"
    with open(log, "ab") as f:
        f.write(b"printed\n")
    with open(err, "ab") as f:
        f.write(b"Traceback (most recent call last):\nValueError: x\nhalf")
    tail.tick()
    assert log.read_bytes() == (
        b"printed\n[stderr] Traceback (most recent call last):\n[stderr] ValueError: x\n"
    )  # the combined view zmesh logs reads
    by_stream = {m.stream: m.lines for m in pub.sent}
    assert by_stream == {1: ["printed"], 2: ["Traceback (most recent call last):", "ValueError: x"]}
    with open(err, "ab") as f:
        f.write(b" a line\n")
    tail.tick()
    assert pub.sent[-1].stream == 2 and pub.sent[-1].lines == ["half a line"]


def test_a_proc_over_the_rate_is_skipped_to_its_newest_lines(tmp_path: Path) -> None:
    tail, log, pub = _tail(tmp_path)
    tail.tick()
    line = b"x" * 99 + b"\n"
    with open(log, "ab") as f:
        f.write(line * (2 * logtail.RATE // len(line)))  # two seconds' worth at once
    tail.tick()
    sent = pub.sent[-1]
    assert (
        sent.skipped >= logtail.RATE // 2 and sent.lines and all(len(x) == 99 for x in sent.lines)
    )
    assert sum(len(x) + 1 for x in sent.lines) <= logtail.RATE


def test_get_logs_reads_from_an_offset_or_since_a_time(tmp_path: Path) -> None:
    tail, log, _ = _tail(tmp_path)
    log.write_bytes(b"early\n")
    tail.tick()
    all_ = tail.answer(w.GetLogs(1, "m-1", 0, offset=0))
    assert all_.ok and all_.text == "early\n" and all_.offset == 6 and all_.live
    time.sleep(0.05)
    mark = time.time()
    time.sleep(0.05)
    with open(log, "ab") as f:
        f.write(b"late\n")
    tail.tick()
    since = tail.answer(w.GetLogs(2, "m-1", 0, since=time.time() - mark))
    assert since.text == "late\n", since
    more = tail.answer(w.GetLogs(3, "m-1", 0, offset=all_.offset))
    assert more.text == "late\n"
    missing = tail.answer(w.GetLogs(4, "m-1", 5))
    assert not missing.ok and "no rank 5" in missing.error
