"""Lookups and calls of a detached service while it is being stopped.

Three threads keep attaching (``zmesh.lookup``) and calling the service
while another script's handle stops it. Every lookup and every call must
resolve within seconds, with a result or a typed ``ZmeshError`` (never a
hang, never a bare ``AttributeError``), every looker must end on
``NameNotFoundError`` once the name is gone, and the replicas' processes
must go with it.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

import zmesh
from zmesh._wire import security as _security

from _helpers import connected, keyed_loopback_agent, replica_pids, wait_gone

pytestmark = pytest.mark.stress

LOOKERS, ROUNDS = 3, 2


class Embedder(zmesh.Actor):
    @zmesh.endpoint
    async def embed(self, x: int) -> int:
        return 2 * x

    @zmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("detached-race")
    keys = str(root / "keys")
    _security.keygen(keys)
    with keyed_loopback_agent(keys, root / "logs", "race") as control:
        with connected([control], keys=keys):
            yield control


def looker(name: str, seen: Counter[str], slow: list[str], errors: list[BaseException]) -> None:
    """Attach and call until the name is gone; note each outcome and anything slow."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            svc = zmesh.lookup(name).get(timeout=30)
            assert [svc.embed(i).get(timeout=30) for i in range(3)] == [0, 2, 4]
            what = "ok"
        except zmesh.NameNotFoundError:
            seen["NameNotFoundError"] += 1
            return
        except zmesh.ZmeshError as exc:
            what = type(exc).__name__
        except BaseException as exc:  # anything else is the bug this test is for
            errors.append(exc)
            return
        seen[what] += 1
        took = time.monotonic() - t0
        if took > 10:
            slow.append(f"{what} after {took:.1f}s")
    errors.append(AssertionError(f"{name} was still found 60 s after it was stopped"))


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_lookups_and_calls_while_it_stops_all_resolve(agent: str, round_: int) -> None:
    import asyncio

    name = f"race{round_}"
    svc = Embedder.options(name=name, replicas=2, detached=True).spawn().get(timeout=60)
    assert svc.embed(1).get(timeout=10) == 2
    pids = asyncio.run(replica_pids(svc))
    seen: Counter[str] = Counter()
    slow: list[str] = []
    errors: list[BaseException] = []
    threads = [threading.Thread(target=looker, args=(name, seen, slow, errors))
               for _ in range(LOOKERS)]  # fmt: skip
    for t in threads:
        t.start()
    time.sleep(0.5)  # attached and calling
    zmesh.lookup(name).get(timeout=30).stop().get(timeout=30)
    for t in threads:
        t.join(70)
    assert not any(t.is_alive() for t in threads), "a looker hangs"
    assert not errors, errors
    assert not slow, slow
    assert seen["NameNotFoundError"] == LOOKERS and seen["ok"] > 0, seen
    wait_gone(pids, 15, "the replicas")
