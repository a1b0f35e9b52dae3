"""Clear messages for the mistakes people make, said where they make them.

* An endpoint named like an attribute of the handle (``state``, ``stop``,
  ``slice``, ...) would be shadowed on ``mesh.state``: refused when the class
  is defined (``check_endpoint_names``, from ``Actor.__init_subclass__``).
* ``Cls.options(procs="2")`` or ``options(procz=2)``: said in the terms of
  ``options`` (``check_options``), not as a comparison of ``str`` and ``int``
  or an unexpected argument of ``ServiceConfig.__init__``.
* ``mesh = Cls.options().as_actor()`` without ``await``/``.get()``, then
  ``mesh.incr``: the future says what it is (``future_attribute_error``).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

# What a handle has of its own: the public attributes of ActorMesh and of
# Service (tests/unit/test_mistakes.py checks that none is missing), for a
# class defined before those are imported. A script's first class must not
# import the service machinery (~50 ms of a cold start) to be checked.
_HANDLE_ATTRS = {
    "actor", "cls_name", "endpoints", "extent", "flatten", "full_dims", "initialized",
    "proc_mesh", "points", "replica", "session", "size", "sizes", "slice", "state",
    "statistics", "stop", "supervision_events",
}  # fmt: skip
# ``get`` is not refused, as Monarch does not refuse it: an endpoint named
# ``get`` wins over the handle's ``as_actor().get(timeout)`` (which waits for
# the mesh; ``mesh.initialized.get(timeout)`` still does).
_SIZES = ("procs", "hosts", "replicas")


def reserved_names() -> set[str]:
    """Names an endpoint may not have: every public attribute of the handles."""
    import sys

    names = set(_HANDLE_ATTRS)
    for module, cls_name in (
        ("zmesh._client.mesh", "ActorMesh"),
        ("zmesh._service.service", "Service"),
    ):
        cls = getattr(sys.modules.get(module), cls_name, None)  # only if imported already
        if cls is not None:
            names.update(n for n in dir(cls) if not n.startswith("_"))
    return names


def check_endpoint_names(cls: type) -> None:
    """Refuse endpoints that a handle's own attribute would hide.

    Raises:
        TypeError: naming the endpoint, what shadows it and the fix.
    """
    from zmesh._actor import Endpoint

    endpoints = [n for n, v in vars(cls).items() if isinstance(v, Endpoint)]
    if not endpoints:
        return
    clash = sorted(set(endpoints) & reserved_names())
    if clash:
        name = clash[0]
        other = "value" if name == "get" else f"get_{name}"
        raise TypeError(
            f"{cls.__name__}.{name}: an endpoint may not be named {name!r}: on a mesh or "
            f"service handle, .{name} is the handle's own, so calls would never reach the "
            f"endpoint. Rename it (e.g. {name}_ or {other}). Reserved names: "
            f"{', '.join(sorted(reserved_names()))}"
        )


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
    from zmesh._service.routing import ServiceConfig

    settings = [f.name for f in dataclasses.fields(ServiceConfig)]
    for key in service_config:
        if key not in settings:
            known = [*_SIZES, "name", "detached", "config", "actors_per_proc", *settings]
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(
                f"{where} got an unknown setting {key!r}{hint}; it takes procs, hosts, "
                "name, detached, for as_actor(): actors_per_proc, and for as_service(): "
                f"replicas, config, {', '.join(settings)}"
            )
    try:
        ServiceConfig(**service_config)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from exc


def future_attribute_error(name: str) -> AttributeError:
    """``fut.incr`` on a future: the value is not there yet; say how to get it."""
    return AttributeError(
        f"'Future' object has no attribute {name!r}: this is a future, not its value. "
        f"Did you forget 'await' or '.get()'? e.g. mesh = await Cls.options().as_actor() "
        f"or mesh = Cls.options().as_actor().get(), then mesh.{name}"
    )
