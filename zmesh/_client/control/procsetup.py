"""What each proc of a mesh starts with: environment, working directory, setup, CPUs.

``HostMesh.spawn_procs(per_host, env=..., cwd=..., bootstrap=fn,
proc_bind=[...])`` and ``Cls.options(env=..., cwd=...)`` describe it as a
``ProcSetup``, checked at once in the caller. It travels in the mesh's spec
to every agent, as environment variables of the procs (the agent needs no
new message for it): ``env`` as it is, and the working directory, the
bootstrap (pickled by value when it comes from ``__main__``) and the
bindings in ``ZMESH_`` variables the proc takes out of its environment
before anything else runs (``zmesh._host.proc.procsetup``), so that nothing the
proc starts inherits them.

``bootstrap="cuda"`` is the one-word default for GPU hosts: each proc gets
``CUDA_VISIBLE_DEVICES`` from its coordinate in its mesh's ``gpus`` dim.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from zmesh._shared.procbind import (
    BIND_KEYS,
    BOOTSTRAP_VAR,
    BUILTIN_BOOTSTRAPS,
    CWD_VAR,
    PROC_BIND_VAR,
    cpu_list,
)


@dataclass(frozen=True)
class ProcSetup:
    """How each proc of a mesh is set up before any actor runs in it.

    Args:
        env: variables added to each proc's environment, on every host.
        cwd: each proc's working directory (default: the caller's); it
            must exist on every host.
        bootstrap: a callable run in each proc before any actor (sync, or
            ``async def``), or ``"cuda"``: ``CUDA_VISIBLE_DEVICES`` from the
            proc's ``gpus`` coordinate.
        proc_bind: one dict per proc of a host (``per_host``'s product), in
            rank order: ``{"cpus": "0-3"}`` (or ``physcpubind``) pins the
            proc to those CPUs, ``{"cpunodebind": "1"}`` to NUMA node 1's.
    """

    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    bootstrap: Callable[[], Any] | str | None = None
    proc_bind: list[dict[str, str]] | None = None

    def check(self, per_host: Mapping[str, int]) -> None:
        """Raise at once for what cannot work, in the caller's terms.

        Raises:
            TypeError: ``env`` is not a mapping of str to str, ``bootstrap``
                neither callable nor a known word, ``proc_bind`` not a list
                of dicts.
            ValueError: ``proc_bind`` of the wrong length or with an unknown
                key or a bad CPU list; ``bootstrap="cuda"`` without a
                ``gpus`` dim; an empty ``cwd``.
        """
        if not isinstance(self.env, Mapping):
            raise TypeError(f"env must be a dict of str to str, not {type(self.env).__name__}")
        for k, v in self.env.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"env must map str to str: {k!r}: {v!r}")
            if not k or "=" in k or "\0" in k or "\0" in v:
                raise ValueError(f"env: {k!r} is not a valid environment variable")
        cwd = self.cwd
        if cwd is not None and (not isinstance(cwd, str) or not cwd or "\0" in cwd):
            raise ValueError(f"cwd must be a directory path, not {self.cwd!r}")
        boot = self.bootstrap
        if isinstance(boot, str):
            if boot not in BUILTIN_BOOTSTRAPS:
                raise ValueError(f"bootstrap={boot!r}: a callable, or one of {BUILTIN_BOOTSTRAPS}")
            if boot == "cuda" and "gpus" not in per_host:
                raise ValueError(
                    f"bootstrap='cuda' gives each proc the GPU of its 'gpus' coordinate, "
                    f"but per_host has no 'gpus' dim: {dict(per_host)}"
                )
        elif boot is not None and not callable(boot):
            raise TypeError(f"bootstrap must be callable (or 'cuda'), not {type(boot).__name__}")
        if self.proc_bind is not None:
            _check_bind(self.proc_bind, per_host)

    def to_env(self) -> dict[str, str]:
        """The variables that carry this setup to each proc (``env`` included)."""
        out = dict(self.env)
        boot = self.bootstrap
        if isinstance(boot, str):  # a built-in, by its word
            out[BOOTSTRAP_VAR] = boot
        elif boot is not None:  # by value when it comes from __main__ (cloudpickle)
            out[BOOTSTRAP_VAR] = "pickle:" + base64.b64encode(cloudpickle.dumps(boot)).decode()
        if self.proc_bind is not None:
            out[PROC_BIND_VAR] = json.dumps(self.proc_bind)
        if self.cwd is not None:  # entered by the proc, which says so if it cannot
            out[CWD_VAR] = os.path.abspath(self.cwd)
        return out


def _check_bind(bind: Any, per_host: Mapping[str, int]) -> None:
    n = 1
    for size in per_host.values():
        n *= size
    if not isinstance(bind, list) or not all(isinstance(b, dict) for b in bind):
        raise TypeError(f"proc_bind must be a list of dicts, one per proc of a host, not {bind!r}")
    if len(bind) != n:
        raise ValueError(f"proc_bind length ({len(bind)}) must equal procs per host ({n})")
    for i, entry in enumerate(bind):
        for key, value in entry.items():
            if key not in BIND_KEYS:
                keys = ", ".join(BIND_KEYS)
                raise ValueError(f"proc_bind[{i}]: unknown key {key!r} (keys: {keys})")
            try:
                cpu_list(str(value))
            except ValueError:
                raise ValueError(
                    f"proc_bind[{i}][{key!r}] = {value!r}: not a list like '0-3,8'"
                ) from None
