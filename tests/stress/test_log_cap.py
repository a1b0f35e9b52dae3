"""A proc printing at full speed: its log keeps its last bytes, with a marker, and stays readable.

Two procs write ~100 MB each to stdout (and some to stderr) as fast as they
can, with the agent's log cap set to 8 MiB. While they do, neither log (nor
its stderr file) grows past the cap by more than what the proc writes until
the agent's next tick; afterwards
each log starts with the marker line saying how much was dropped, ends with
the proc's last line, and reading it through the agent (``zmesh logs``'s
``GetLogs``, from offset 0 and from an offset taken before the flood) works
with offsets that only move forward.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from _helpers import own_runtime_dir

pytestmark = pytest.mark.stress

CAP = 8 << 20

SCRIPT = textwrap.dedent(
    """
    import asyncio, functools, json, os, sys, time
    import zmesh
    from zmesh._client.calls import runtime as _runtime
    from zmesh._shared.paths import stderr_path
    from zmesh._wire import messages as w

    class Printer(zmesh.Actor):
        @zmesh.endpoint
        def flood(self, nbytes: int) -> int:
            line = b"x" * 100
            written, i = 0, 0
            while written < nbytes:
                block = b"".join(b"%d %s\\n" % (i + k, line) for k in range(500))
                os.write(1, block)
                if i % 10_000 == 0:
                    os.write(2, block[:20_000])
                written += len(block)
                i += 500
            os.write(1, b"THE END\\n")
            return written

    async def read_all(agent, mesh, rank, offset):
        text, offsets = [], []
        while True:
            make = functools.partial(w.GetLogs, mesh=mesh, rank=rank, offset=offset, limit=1 << 20)
            reply = await agent.request(make, 10)
            assert reply.ok, reply.error
            offsets.append(reply.offset)
            text.append(reply.text)
            offset = reply.offset
            if reply.offset >= reply.size or not reply.text:
                return "".join(text), offsets

    async def main(out, nbytes):
        mesh = await Printer.options(procs=2).as_actor()
        rt, _ = _runtime.current()
        ref = mesh._refs[0]
        agent = rt.controller.agents[ref.agent]
        _, start = await read_all(agent, mesh.proc_mesh, 0, 0)
        paths = [r.log_path for r in mesh._refs]
        biggest = {"log": 0, "err": 0}
        t0 = time.monotonic()
        flood = asyncio.ensure_future(mesh.flood.call(nbytes))
        while not flood.done():
            for p in paths:
                for key, path in (("log", p), ("err", stderr_path(p))):
                    try:
                        biggest[key] = max(biggest[key], os.stat(path).st_size)
                    except OSError:
                        pass
            await asyncio.sleep(0.02)
        written = sum((await flood).values())
        seconds = time.monotonic() - t0
        await asyncio.sleep(1.0)  # a few agent ticks: the last lines are copied, the cap applied
        text, offsets = await read_all(agent, mesh.proc_mesh, 0, 0)
        later, later_offsets = await read_all(agent, mesh.proc_mesh, 0, start[-1])
        sizes = [os.stat(p).st_size for p in paths]
        heads = [open(p, "rb").readline().decode() for p in paths]
        with open(out, "w") as f:
            json.dump({"written": written, "seconds": seconds, "biggest": biggest,
                       "sizes": sizes, "heads": heads,
                       "text_len": len(text), "end": "THE END" in text,
                       "marker": "bytes of this log were dropped" in text,
                       "offsets": offsets, "later_offsets": later_offsets,
                       "later_len": len(later), "later_end": "THE END" in later}, f)
        await mesh.stop()

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with own_runtime_dir(monkeypatch, unset=("ZMESH_FORWARD_LOGS",)) as path:
        yield path


def test_a_flooding_proc_keeps_its_last_bytes_with_a_marker(
    runtime_dir: str, tmp_path: Path
) -> None:
    script, result = tmp_path / "printer.py", tmp_path / "result.json"
    script.write_text(SCRIPT)
    cache = tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.update(XDG_CACHE_HOME=str(cache), ZMESH_LOG_MAX_BYTES=str(CAP), ZMESH_FORWARD_LOGS="0")
    env.pop("ZMESH_LOG_DIR", None)
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(result), str(100 << 20)], capture_output=True,
            text=True, stdin=subprocess.DEVNULL, env=env, timeout=120,
        )  # fmt: skip
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(result.read_text())
    print({k: v for k, v in r.items() if "offsets" not in k})
    assert r["written"] >= 2 * (100 << 20)
    # Bounded while it floods: the cap, plus what a proc writes until the agent's
    # next tick (100 ms; up to a second and a half on this loaded machine).
    rate = r["written"] / 2 / r["seconds"]
    lag = CAP + int(rate * 1.5)
    print(f"{rate / (1 << 20):.0f} MiB/s a proc; the log peaked at {r['biggest']}")
    assert r["biggest"]["log"] < lag, (r["biggest"], lag)
    assert r["biggest"]["err"] < lag, (r["biggest"], lag)
    assert all(size <= CAP for size in r["sizes"]), r["sizes"]
    # The marker says what was dropped; the newest lines are all there.
    for head in r["heads"]:
        assert head.startswith("[zmesh] ") and "bytes of this log were dropped" in head, head
        assert int(head.split()[1]) > 80 << 20, head
    assert r["marker"] and r["end"], r
    # Offsets (as zmesh logs follows them) only move forward, past what was cut.
    for offsets in (r["offsets"], r["later_offsets"]):
        assert offsets == sorted(offsets), offsets
    assert r["offsets"][-1] > 100 << 20
    assert r["later_end"] and r["later_len"] <= CAP, r["later_len"]
