"""How to spawn an actor class: ``Cls.options(...)`` and ``@zmesh.service``.

``Options`` holds the shape (procs, hosts, actors per proc), the name and
the service settings, checked at once; ``.as_actor()``, ``.as_service()``
and ``.spawn()`` start what it describes.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from zmesh._actor import ActorBase
from zmesh._client.control.procsetup import ProcSetup
from zmesh._service.routing import ServiceConfig
from zmesh._shared.points import check_per_proc
from zmesh._wire.names import check_name

if TYPE_CHECKING:
    from zmesh._client.calls.future import Future
    from zmesh._typing import Spawned

A = TypeVar("A", bound=ActorBase)


_SIZES = ("procs", "hosts", "replicas")


def check_options(cls: type, sizes: dict[str, Any], service_config: dict[str, Any]) -> None:
    """``Cls.options(...)``'s arguments, checked in its own terms.

    Raises:
        TypeError: a size that is not an int, or an unknown setting.
        ValueError: a size below 1.
    """
    where = f"{cls.__name__}.options()"
    for key in _SIZES:
        v = sizes[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{where}: {key} must be an int (at least 1), not {v!r}")
        if v < 1:
            raise ValueError(f"{where}: {key} must be at least 1, got {key}={v}")
    if not service_config:
        return
    settings = [f.name for f in dataclasses.fields(ServiceConfig)]
    for key in service_config:
        if key not in settings:
            known = [*_SIZES, "name", "detached", "config", "actors_per_proc", "env", "cwd"]
            known += settings
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(
                f"{where} got an unknown setting {key!r}{hint}; it takes procs, hosts, "
                "name, detached, env, cwd, for as_actor(): actors_per_proc, and for as_service(): "
                f"replicas, config, {', '.join(settings)}"
            )
    try:
        ServiceConfig(**service_config)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from exc


class Options(Generic[A]):
    """How to spawn an actor class: made by ``Cls.options(...)``.

    Args:
        procs: procs per host.
        hosts: hosts (agents), one host slice each.
        actors_per_proc: actors in each proc (default 1). More than one puts
            that many actors, each with its own mailbox, in every proc, on
            one more dim, ``actors``: ``{hosts, procs, actors}``.
        replicas: how many replicas of a service (each ``hosts x procs``);
            given (here or by ``@zmesh.service``), ``spawn()`` makes a service.
        name: the mesh name (default: the class name in lower case): 1-108
            letters, digits, ``_``, ``.`` or ``-``, without ``..`` (zmesh
            appends a suffix, and it names the procs' log files).
        config: a whole ``zmesh.ServiceConfig``; settings given one by one
            override its fields.
        env: variables added to the environment of every proc, on every host
            (only ``ZMESH_*`` variables reach agents started elsewhere).
        cwd: the working directory of every proc (default: this process's);
            it must exist on every host.
        detached: keep the service or mesh running after this script exits,
            under ``name``, until ``zmesh stop NAME`` or ``stop()``; other
            scripts attach with ``zmesh.lookup(name)``. Needs an external
            agent (``ZMESH_AGENTS``): on the embedded one, ``DetachError``.
        service_config: service settings: see ``zmesh.ServiceConfig``.

    A class decorated with ``@zmesh.service(...)`` gives the defaults of all
    of these; what ``.options()`` says wins.

    Raises:
        ValueError: a size below 1, a name that is not valid, or a service
            setting that is unknown or bad.
        TypeError: an ``env`` that does not map str to str.
    """

    def __init__(
        self,
        cls: type[A],
        *,
        procs: int | None = None,
        hosts: int | None = None,
        replicas: int | None = None,
        name: str | None = None,
        config: ServiceConfig | None = None,
        detached: bool | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        **service_config: Any,
    ) -> None:
        defaults: dict[str, Any] = dict(getattr(cls, "__zmesh_service__", {}))
        env = env if env is not None else defaults.pop("env", None)
        cwd = cwd if cwd is not None else defaults.pop("cwd", None)
        defaults.pop("env", None)
        defaults.pop("cwd", None)
        # The procs' environment and working directory (zmesh._client.control.procsetup).
        self.setup: ProcSetup | None = None
        if env or cwd is not None:
            self.setup = ProcSetup(env=env or {}, cwd=cwd)
            self.setup.check({})
        detached = detached if detached is not None else defaults.pop("detached", False)
        # Actors per proc (as_actor only): a keyword of options(), not a service setting.
        per_proc = service_config.pop("actors_per_proc", None)
        per_proc = per_proc if per_proc is not None else defaults.pop("actors_per_proc", 1)
        defaults.pop("actors_per_proc", None)
        procs = procs if procs is not None else defaults.pop("procs", 1)
        hosts = hosts if hosts is not None else defaults.pop("hosts", 1)
        if replicas is None:
            replicas = defaults.pop("replicas", None)
        name = name if name is not None else defaults.pop("name", None)
        config = config if config is not None else defaults.pop("config", None)
        for key in ("procs", "hosts", "replicas", "name", "config", "detached"):
            defaults.pop(key, None)
        settings = defaults
        if config is not None:
            settings.update({f.name: getattr(config, f.name) for f in dataclasses.fields(config)})
        settings.update(service_config)
        # Said in options' terms: a size that is no int, an unknown setting.
        sizes = {"procs": procs, "hosts": hosts, "replicas": 1 if replicas is None else replicas}
        check_options(cls, sizes, settings)
        if procs < 1 or hosts < 1 or (replicas is not None and replicas < 1):
            raise ValueError(
                "procs, hosts and replicas must be at least 1, "
                f"got procs={procs} hosts={hosts} replicas={replicas}"
            )
        self.cls = cls
        self.procs = procs
        self.hosts = hosts
        # Several actors in each proc: the mesh's dims are {hosts, procs, actors}.
        self.actors_per_proc = check_per_proc(per_proc)
        # Whether this is a service: replicas given, or service settings.
        self.is_service = replicas is not None or bool(settings)
        if self.is_service and self.actors_per_proc > 1:
            raise ValueError("actors_per_proc is for as_actor(): a service's replicas are procs")
        self.replicas = replicas if replicas is not None else 1
        if name is None:  # a class name may hold any letter: keep the safe ones
            name = re.sub(r"[^A-Za-z0-9_.-]+|\.\.+", "_", cls.__name__.lower())[:100] or "actor"
        # A service's replicas and every mesh add a suffix: leave room for it.
        self.name = check_name(name, "mesh name", reserve=20)
        self.detached = bool(detached)
        self.service_config = settings  # checked by check_options, at once

    def spawn(self, *args: Any, **kwargs: Any) -> Spawned[A]:
        """Spawn it: a future of a ``Service`` when ``replicas`` (or a service
        setting) was given, else the ``ActorMesh`` at once (see ``as_actor``).
        Both are awaitable and have ``.get(timeout)``.

        Raises (from ``await``/``.get()``):
            SpawnError: a proc, actor or replica failed to start; nothing is
                left running.
        """
        if self.is_service:
            return self.as_service(*args, **kwargs)
        # A mesh is a Spawned[A]; mypy cannot see it through the TypeVar.
        return self.as_actor(*args, **kwargs)  # type: ignore[return-value]

    def as_actor(self, *args: Any, **kwargs: Any) -> A:
        """Spawn ``hosts x procs`` actors; their ``ActorMesh``, at once.

        The procs and actors start in the background: calls made meanwhile
        wait and go out in order, and ``await mesh`` (or
        ``mesh.initialized.get()``) waits until every ``__init__`` returned.

        Raises (from ``await mesh``, ``mesh.initialized`` and every call):
            SpawnError: a proc failed to start or ``__init__`` raised; nothing
                is left running.
        """
        # Late: `import zmesh` (every proc's first line) loads no client machinery.
        from zmesh._client.control.spawning import spawn_actor_mesh

        if self.is_service:
            raise ValueError("replicas= and service settings are for as_service() or spawn()")
        # Typed as the class: the handle has its endpoints (zmesh._typing).
        return spawn_actor_mesh(self, args, kwargs)  # type: ignore[return-value]

    def as_service(self, *args: Any, **kwargs: Any) -> Future[A]:
        """Spawn ``replicas`` actor meshes as one self-healing ``Service``.

        Raises (from the future):
            SpawnError: a replica could not be started; nothing is left running.
        """
        # Late: the service machinery is ~50 ms of a cold start; most scripts never use it.
        from zmesh._service.spawn import spawn_service

        return spawn_service(self, args, kwargs)


AA = TypeVar("AA", bound="Actor")


class Actor(ActorBase):
    """Base class of actors. Subclass it and mark methods with ``@zmesh.endpoint``.

    An actor handles one message at a time, in send order per sender, unless
    an endpoint opts into ``concurrent=True``.

    Optional hooks: ``__supervise__(self, failure)`` (sync or async) gets each
    failure of a mesh this actor spawned (a truthy return handles it), and
    ``__cleanup__(self, exc)`` (sync or async) runs once when the actor stops.

    Attributes:
        survive_errors: ``False`` (the default), as in Monarch: an exception
            with no caller to go to (a ``broadcast``, an explicit response
            port's endpoint) or any ``BaseException`` kills the actor alone;
            its calls then raise ``SupervisionError`` and its spawner is told.
            ``True``: zmesh's older rule, the actor never dies of an error (a
            broadcast's is logged, a ``BaseException`` fails its call alone).
    """

    @classmethod
    def options(
        cls: type[AA],
        *,
        procs: int | None = None,
        hosts: int | None = None,
        replicas: int | None = None,
        name: str | None = None,
        config: ServiceConfig | None = None,
        detached: bool | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        **service_config: Any,
    ) -> Options[AA]:
        """Say how to spawn this class; then ``.spawn(...)`` (or ``.as_actor``,
        ``.as_service``). Defaults come from ``@zmesh.service`` on the class.
        ``env`` and ``cwd``: every proc's added variables and working directory."""
        return Options(
            cls, procs=procs, hosts=hosts, replicas=replicas, name=name, config=config,
            detached=detached, env=env, cwd=cwd, **service_config,
        )  # fmt: skip


def service(
    *,
    replicas: int = 1,
    procs: int | None = None,
    hosts: int | None = None,
    name: str | None = None,
    config: ServiceConfig | None = None,
    detached: bool | None = None,
    **settings: Any,
) -> Callable[[type[A]], type[A]]:
    """Class decorator: the class is a service by default, with these defaults.

    ``Cls.options().spawn()`` (or ``Cls.options(replicas=4).spawn()``, which
    overrides) then makes a ``Service``. Settings are checked at once.

    Example::

        @zmesh.service(replicas=2, max_queue=100)
        class Embedder(zmesh.Actor): ...

        svc = await Embedder.options().spawn()
    """
    given = {
        "replicas": replicas, "procs": procs, "hosts": hosts, "name": name, "detached": detached
    }  # fmt: skip
    defaults: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if config is not None:
        defaults["config"] = config
    defaults.update(settings)

    def decorate(cls: type[A]) -> type[A]:
        if not (isinstance(cls, type) and issubclass(cls, ActorBase)):
            raise TypeError(f"@zmesh.service decorates zmesh.Actor subclasses, not {cls!r}")
        cls.__zmesh_service__ = defaults  # type: ignore[attr-defined]
        Options(cls)  # bad settings fail at the class, not at the first spawn
        return cls

    return decorate
