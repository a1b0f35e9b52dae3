"""Each proc's setup: ``env``, ``cwd``, ``bootstrap`` and ``proc_bind`` (``_host.proc.procsetup``).

Real procs report what they see: their environment, working directory,
CPU affinity (of the loop's thread and of a worker thread) and what their
bootstrap did, before any actor. Bad input fails at once with the caller's
terms; a setup that fails in the proc fails the spawn with ``SpawnError``
naming the proc, the step and its log.
"""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import zmesh
from zmesh._shared.procbind import BOOTSTRAP_VAR, PROC_BIND_VAR, cpu_list


class Probe(zmesh.Actor):
    @zmesh.endpoint
    async def seen(self) -> dict[str, Any]:
        return {
            "env": {k: v for k, v in os.environ.items() if k.startswith(("MY_", "BOOT", "CUDA"))},
            "setup_vars": [k for k in (BOOTSTRAP_VAR, PROC_BIND_VAR) if k in os.environ],
            "cwd": os.getcwd(),
            "cpus": sorted(os.sched_getaffinity(0)),
            "pid": os.getpid(),
        }

    @zmesh.endpoint
    def worker_cpus(self) -> list[int]:  # a worker thread, started after the binding
        assert threading.current_thread() is not threading.main_thread()
        return sorted(os.sched_getaffinity(0))


def boot_writes(path: str, word: str) -> None:
    """A bootstrap: say so in the environment and in a file of its own."""
    os.environ["BOOTED"] = word
    Path(path, f"{os.getpid()}.booted").write_text(word)


async def boot_async(word: str) -> None:
    os.environ["BOOTED"] = word


def boot_fails() -> None:
    raise RuntimeError("no such device")


def _seen(procs: zmesh.ProcMesh) -> list[dict[str, Any]]:
    probes = procs.spawn("probe", Probe)
    return probes.seen.call().get(timeout=60).values()


def test_env_and_cwd_reach_every_proc(tmp_path: Path) -> None:
    procs = zmesh.this_host().spawn_procs({"procs": 2}, env={"MY_SETTING": "on"}, cwd=str(tmp_path))
    try:
        for s in _seen(procs):
            assert s["env"] == {"MY_SETTING": "on"}
            assert s["cwd"] == str(tmp_path)
            assert s["setup_vars"] == []
    finally:
        procs.stop().get(timeout=30)


def test_options_env_and_cwd(tmp_path: Path) -> None:
    mesh = Probe.options(procs=2, env={"MY_OPTION": "1"}, cwd=str(tmp_path)).as_actor()
    try:
        for s in mesh.seen.call().get(timeout=60).values():
            assert s["env"] == {"MY_OPTION": "1"} and s["cwd"] == str(tmp_path)
    finally:
        mesh.stop().get(timeout=30)


def test_bootstrap_runs_in_each_proc_before_any_actor(tmp_path: Path) -> None:
    procs = zmesh.this_host().spawn_procs(
        {"procs": 2}, bootstrap=functools.partial(boot_writes, str(tmp_path), "yes")
    )
    try:
        procs.initialized.get(timeout=60)  # no actor yet: the files are there already
        assert len(list(tmp_path.glob("*.booted"))) == 2
        seen = _seen(procs)
        assert sorted(f.name for f in tmp_path.glob("*.booted")) == sorted(
            f"{s['pid']}.booted" for s in seen
        )
        assert all(s["env"] == {"BOOTED": "yes"} and s["setup_vars"] == [] for s in seen)
    finally:
        procs.stop().get(timeout=30)


def test_an_async_bootstrap_is_awaited() -> None:
    procs = zmesh.this_host().spawn_procs(
        {"procs": 1}, bootstrap=functools.partial(boot_async, "async")
    )
    try:
        assert _seen(procs)[0]["env"] == {"BOOTED": "async"}
    finally:
        procs.stop().get(timeout=30)


def test_a_bootstrap_that_raises_fails_the_spawn_naming_the_proc_and_its_log() -> None:
    procs = zmesh.this_host().spawn_procs({"procs": 1}, bootstrap=boot_fails)
    with pytest.raises(zmesh.SpawnError) as info:
        procs.initialized.get(timeout=60)
    text = str(info.value)
    assert "bootstrap" in text and "no such device" in text, text
    assert info.value.log_path, text
    assert "[0]" in text, text


def test_bootstrap_cuda_gives_each_proc_its_gpus_coordinate() -> None:
    procs = zmesh.this_host().spawn_procs({"gpus": 2}, bootstrap="cuda")
    try:
        devices = [s["env"]["CUDA_VISIBLE_DEVICES"] for s in _seen(procs)]
        assert devices == ["0", "1"]
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_proc_bind_pins_each_proc_and_its_threads() -> None:
    a, b = sorted(os.sched_getaffinity(0))[:2]
    procs = zmesh.this_host().spawn_procs(
        {"procs": 2}, proc_bind=[{"cpus": str(a)}, {"physcpubind": str(b)}]
    )
    try:
        assert [s["cpus"] for s in _seen(procs)] == [[a], [b]]
        probes = procs.spawn("threads", Probe)
        assert probes.worker_cpus.call().get(timeout=30).values() == [[a], [b]]
    finally:
        procs.stop().get(timeout=30)


def test_proc_bind_by_numa_node() -> None:
    if not os.path.exists("/sys/devices/system/node/node0/cpulist"):
        pytest.skip("no NUMA information here")
    with open("/sys/devices/system/node/node0/cpulist") as f:
        node0 = sorted(cpu_list(f.read().strip()) & os.sched_getaffinity(0))
    procs = zmesh.this_host().spawn_procs({"procs": 1}, proc_bind=[{"cpunodebind": "0"}])
    try:
        assert _seen(procs)[0]["cpus"] == node0
    finally:
        procs.stop().get(timeout=30)


def test_a_proc_bind_this_host_cannot_do_fails_the_spawn() -> None:
    procs = zmesh.this_host().spawn_procs({"procs": 1}, proc_bind=[{"cpus": "4000"}])
    with pytest.raises(zmesh.SpawnError) as info:
        procs.initialized.get(timeout=60)
    assert "proc_bind" in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"proc_bind": [{"cpus": "0"}]}, ValueError, "proc_bind length (1) must equal"),
        ({"proc_bind": [{"cpu": "0"}, {"cpus": "1"}]}, ValueError, "unknown key 'cpu'"),
        ({"proc_bind": [{"cpus": "1-0"}, {"cpus": "x"}]}, ValueError, "not a list like"),
        ({"proc_bind": {"cpus": "0"}}, TypeError, "a list of dicts"),
        ({"bootstrap": "cuda"}, ValueError, "no 'gpus' dim"),
        ({"bootstrap": "rocm"}, ValueError, "a callable, or one of"),
        ({"bootstrap": 3}, TypeError, "must be callable"),
        ({"env": {"A": 1}}, TypeError, "str to str"),
        ({"env": {"A=B": "1"}}, ValueError, "not a valid environment variable"),
    ],
)
def test_bad_setups_fail_at_once(kwargs: dict[str, Any], error: type, words: str) -> None:
    with pytest.raises(error) as info:
        zmesh.this_host().spawn_procs({"procs": 2}, **kwargs)
    assert words in str(info.value)


def test_bad_options_env_fails_at_once() -> None:
    with pytest.raises(TypeError, match="str to str"):
        Probe.options(env={"A": 1})  # type: ignore[dict-item]


def test_a_services_replicas_get_env_and_cwd(tmp_path: Path) -> None:
    svc = Probe.options(replicas=2, env={"MY_SERVICE": "s"}, cwd=str(tmp_path)).as_service()
    service = svc.get(timeout=60)
    try:
        for _ in range(4):  # round robin: both replicas
            s = service.seen.call_one().get(timeout=30)
            assert s["env"] == {"MY_SERVICE": "s"} and s["cwd"] == str(tmp_path)
    finally:
        service.stop().get(timeout=30)


def test_a_cwd_missing_on_the_host_fails_the_spawn_saying_so(tmp_path: Path) -> None:
    missing = str(tmp_path / "not-here")
    procs = zmesh.this_host().spawn_procs({"procs": 1}, cwd=missing)
    with pytest.raises(zmesh.SpawnError) as info:
        procs.initialized.get(timeout=60)
    text = str(info.value)
    assert "the cwd of proc" in text and missing in text, text
