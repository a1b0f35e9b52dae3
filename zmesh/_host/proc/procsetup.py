"""A proc's own setup, before it serves: its working directory, CPU binding, bootstrap.

The caller's ``ProcSetup`` (``zmesh._client.control.procsetup``) arrives in
variables, taken out of the environment here so that nothing the proc
starts inherits them. The proc enters its ``cwd``; ``proc_bind``'s entry
for this proc (by its index on its host) pins every thread of the proc to
those CPUs; then the bootstrap runs (``"cuda"``: ``CUDA_VISIBLE_DEVICES``
from the ``gpus`` coordinate).
All come before the proc says hello, so before any actor: its rank is
Initializing meanwhile, and a failure ends the proc (exit status 78) with
its reason on the last line of its log, which the caller's ``SpawnError``
quotes.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import os
import sys
import traceback
from typing import Any

import cloudpickle

from zmesh._shared.procbind import BOOTSTRAP_VAR, CWD_VAR, PROC_BIND_VAR, cpu_list
from zmesh._wire.boundary import ProcEnv

# The exit status of a proc whose setup failed (EX_CONFIG).
SETUP_FAILED = 78


def apply(spec: ProcEnv) -> None:
    """Bind this proc's CPUs and run its bootstrap; exit (``SETUP_FAILED``) if either fails."""
    boot = os.environ.pop(BOOTSTRAP_VAR, "")
    bind = os.environ.pop(PROC_BIND_VAR, "")
    cwd = os.environ.pop(CWD_VAR, "")
    where = f"{spec.mesh}[{spec.rank}] on {spec.host}"
    step = "cwd"
    try:
        if cwd:
            os.chdir(cwd)
        step = "proc_bind"
        if bind:
            entries = json.loads(bind)
            bind_cpus(entries[local_index(spec) % len(entries)])
        step = "bootstrap"
        if boot == "cuda":
            os.environ["CUDA_VISIBLE_DEVICES"] = str(coordinate(spec, "gpus"))
        elif boot.startswith("pickle:"):
            fn = cloudpickle.loads(base64.b64decode(boot[len("pickle:") :]))
            result = fn()
            if inspect.isawaitable(result):
                asyncio.run(_awaited(result))
    except BaseException as exc:  # whatever it is, the proc cannot serve as asked
        # On stdout, which is the log file itself: the caller's SpawnError
        # quotes the log's last lines as soon as it sees the proc exit
        # (stderr reaches the log a moment later, through the agent).
        traceback.print_exc(file=sys.stdout)
        print(
            f"[zmesh] the {step} of proc {where} raised {type(exc).__name__}: {exc}; "
            "the proc exits before any actor starts", flush=True,
        )  # fmt: skip
        os._exit(SETUP_FAILED)


async def _awaited(result: Any) -> None:
    await result


def local_index(spec: ProcEnv) -> int:
    """This proc's index among its mesh's procs on its host (row-major, hosts first)."""
    per_host = 1
    for dim, size in spec.dims.items():
        if dim != "hosts":
            per_host *= size
    return spec.rank % per_host


def coordinate(spec: ProcEnv, dim: str) -> int:
    """This proc's coordinate in ``dim`` of its mesh (ranks are row-major)."""
    r = spec.rank
    coords = {}
    for name, size in reversed(list(spec.dims.items())):
        coords[name] = r % size
        r //= size
    return coords[dim]


def bind_cpus(entry: dict[str, str]) -> None:
    """Pin every thread of this process to the CPUs ``entry`` names.

    Raises:
        ValueError: a NUMA node that does not exist.
        OSError: none of the CPUs is usable here.
    """
    cpus: set[int] = set()
    for key, value in entry.items():
        if key in ("cpus", "physcpubind"):
            cpus |= cpu_list(str(value))
        else:  # cpunodebind, membind: the CPUs of those NUMA nodes
            for node in cpu_list(str(value)):
                path = f"/sys/devices/system/node/node{node}/cpulist"
                try:
                    with open(path) as f:
                        cpus |= cpu_list(f.read().strip())
                except OSError:
                    raise ValueError(f"NUMA node {node} does not exist on this host") from None
    if not cpus:
        return
    allowed = os.sched_getaffinity(0)
    if not cpus & allowed:
        raise OSError(f"CPUs {_text(cpus)} are not among this host's usable CPUs {_text(allowed)}")
    for tid in os.listdir("/proc/self/task"):  # threads started before us too
        os.sched_setaffinity(int(tid), cpus & allowed)


def _text(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))
