"""Hosts: ``HostMesh``, ``this_host`` and ``connect``, where procs start.

A ``HostMesh`` is a set of agents (one per host); ``spawn_procs`` starts a
``ProcMesh`` on them (``zmesh._client.control.spawning``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zmesh._client.control import local as _local
from zmesh._client.control import logforward, spawning
from zmesh._client.control.procsetup import ProcSetup
from zmesh._client.handles.mesh import ProcMesh, check_mesh_name
from zmesh._shared.points import Extent
from zmesh._wire import names as _names
from zmesh._wire import security as _security


class HostMesh:
    """Hosts (one agent each). ``spawn_procs`` places one host slice per agent.

    Args:
        agents: agent control addresses; ``None`` uses the configured agents
            or, with none configured, the embedded local default.
        hosts: how many hosts this mesh spans.
    """

    def __init__(self, agents: list[str] | None = None, hosts: int = 1) -> None:
        self._agents = list(agents) if agents is not None else None
        self._hosts = len(agents) if agents is not None else hosts

    @property
    def sizes(self) -> dict[str, int]:
        return {"hosts": self._hosts}

    def __len__(self) -> int:
        return self._hosts

    @property
    def extent(self) -> Extent:
        """``{"hosts": n}``."""
        return Extent({"hosts": self._hosts})

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | str | None = None,
        *,
        name: str | None = None,
        proc_bind: list[dict[str, str]] | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ProcMesh:
        """Start procs: ``per_host={"procs": 4}`` starts 4 on every host.

        Returns the ``ProcMesh`` at once; the procs start in parallel in the
        background (``await procs`` waits for them).

        Without ``name``, the mesh is ``procs`` and a random suffix: every
        call starts a new mesh. With ``name``, that is the mesh's name on
        its agents, and calling again with the same name while this client's
        mesh of that name runs *updates* it in place: ``per_host={"procs": 4}``
        on a 2-proc mesh starts 2 more procs, ``{"procs": 1}`` stops the
        last one. The ``ProcMesh`` returned (and every earlier handle of the
        mesh, once the update is done) has the new shape; actor meshes keep
        the procs they were spawned on. A stopped name starts a new mesh.

        Each proc is set up before any actor runs in it, as Monarch's are:

        Args:
            per_host: the procs of each host, by dim: ``{"gpus": 8}``.
            bootstrap: a callable (sync or ``async def``) each proc runs
                first, or ``"cuda"``: each proc's ``CUDA_VISIBLE_DEVICES``
                is its coordinate in the ``gpus`` dim.
            name: the mesh's name (see above).
            proc_bind: one dict per proc of a host, in rank order:
                ``{"cpus": "0-3"}`` (or ``physcpubind``) pins the proc to
                those CPUs, ``{"cpunodebind": "1"}`` (or ``membind``) to
                NUMA node 1's CPUs.
            env: variables added to every proc's environment, on every host.
            cwd: every proc's working directory (default: the caller's).

        Raises:
            ValueError: at once, when ``name`` is not a valid name (1-119
                letters, digits, ``_``, ``.`` or ``-``, without ``..``), or a
                dim is not, or a size is below 1; a ``proc_bind`` of the
                wrong length or keys; ``bootstrap="cuda"`` without ``gpus``.
            TypeError: at once, for an ``env`` that is not str to str or a
                ``bootstrap`` that is not callable.

        Raises (from ``await procs`` / ``procs.initialized``):
            SpawnError: a proc died or did not become ready (with its log
                path): its bootstrap raised, its ``proc_bind`` CPUs are not
                on its host, its ``cwd`` does not exist there.
            AgentError: an agent cannot be reached.
        """

        per_host = dict(per_host or {"procs": 1})
        exact = name is not None
        name = check_mesh_name(name) if name is not None else "procs"
        for dim, size in per_host.items():
            _names.check_name(dim, "dim")
            if size < 1:
                raise ValueError(f"per_host sizes must be at least 1, got {per_host}")
        setup = None
        if bootstrap is not None or proc_bind is not None or env or cwd is not None:
            setup = ProcSetup(env or {}, cwd, bootstrap, proc_bind)
            setup.check(per_host)
        return spawning.start_procs(
            self._agents, self._hosts, per_host, name, exact=exact, setup=setup
        )

    def __repr__(self) -> str:
        return f"<HostMesh {{hosts: {self._hosts}}}>"


def this_host() -> HostMesh:
    """The local host: the first configured agent, or the embedded default."""
    return HostMesh(None, hosts=1)


def connect(
    addresses: list[str], *, keys: str | None = None, forward_logs: bool | None = None
) -> HostMesh:
    """Use these agents (``tcp://host:port`` each) from now on; a ``HostMesh`` of them.

    Args:
        addresses: the agents' control addresses, one per host.
        keys: a ``zmesh keygen`` directory, for agents started with ``--keys``
            (default: the ``ZMESH_KEYS`` variable, if set).
        forward_logs: print what actors print on our stdout, prefixed
            ``(mesh rank host)`` (default: on, unless ``ZMESH_FORWARD_LOGS=0``).

    Raises:
        SecurityError: ``keys`` cannot be read.
    """
    if forward_logs is not None:
        logforward.enable(forward_logs)
    if not addresses:
        raise ValueError("connect() needs at least one agent address")
    if keys is not None:
        _security.use(keys)
    _local.configure(addresses)
    return HostMesh(list(addresses))
