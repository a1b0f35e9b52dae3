"""A proc's mesh key is not readable from its environment, however it was started.

The agent hands a proc its mesh's key (what lets it, and only it, spawn
and stop actors of its mesh). A proc forked by the forkserver gets it in
``os.environ`` after the fork, and removes it at start. A proc started as a
fresh interpreter (``ZMESH_FORKSERVER=0``, or a fork the forkserver could
not make in time) got it in the environment of ``execve``: removing it from
``os.environ`` leaves it in ``/proc/<pid>/environ`` for the proc's whole life,
where every process of the user may read it, even where it may not read
the proc's memory (Yama's ``ptrace_scope=1``, the default on Ubuntu, guards
memory, not ``environ``). Now such a proc reads its key from a pipe.
"""

from __future__ import annotations

import os

import pytest

import zmesh
from zmesh import testing
from zmesh._client.control import local as _local

pytestmark = pytest.mark.stress


class Holder(zmesh.Actor):
    @zmesh.endpoint
    def facts(self) -> dict[str, object]:
        return {
            "pid": os.getpid(),
            "keys": dict(_local._keys),  # the keys this proc holds, by mesh
            "environ": "ZMESH_MESH_KEY" in os.environ,
        }


def test_a_fresh_interpreter_proc_keeps_its_mesh_key_out_of_proc_environ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ZMESH_FORKSERVER", "0")  # read by the agent started next
    a = testing.start_agent("key-environ")
    monkeypatch.setenv("ZMESH_AGENTS", a.control)
    _local.configure(None)
    try:
        mesh = Holder.options(procs=1).as_actor().get(timeout=60)
        facts = mesh.facts.call_one().get(timeout=30)
        with open(f"/proc/{facts['pid']}/environ", "rb") as f:
            environ = f.read().split(b"\0")
        leaked = [v[:24] for v in environ if v.startswith(b"ZMESH_MESH_KEY=")]
        assert not leaked, f"the mesh key is readable in /proc/{facts['pid']}/environ: {leaked}"
        assert not facts["environ"]
        keys = facts["keys"]
        assert isinstance(keys, dict) and len(keys) == 1, keys  # the proc holds its key
        assert all(len(k) >= 32 for k in keys.values()), keys
        mesh.stop().get(timeout=30)  # its owner stops it (a message checked by the key)
    finally:
        zmesh.shutdown()
        testing.stop_agent(a)
