"""The parameters and types of a service's endpoints, packed to travel in its handle.

A process that attaches to a detached service (``zmesh.lookup``) gets its
handle, not its actor class: it may not even be able to import it. What a
caller from outside Python needs to check arguments and describe the
endpoints (``zmesh http``: 422 for arguments that do not fit, JSON schemas)
travels in each ``EndpointInfo.signature``, packed with cloudpickle where
the class is defined, because type hints resolve only there (a class sent
by value carries only the globals its code uses, not those its
annotations name).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import typing
from dataclasses import dataclass
from typing import Any

import cloudpickle

from zmesh._actor import Endpoint, EndpointInfo

# The origins of a generator endpoint's return hint whose first argument is its item type.
_ITERATORS = {
    collections.abc.AsyncIterator, collections.abc.AsyncIterable, collections.abc.AsyncGenerator,
    collections.abc.Iterator, collections.abc.Iterable, collections.abc.Generator,
}  # fmt: skip


@dataclass(frozen=True)
class Param:
    """One parameter: its name, ``inspect.Parameter`` kind, whether it has a default, its type."""

    name: str
    kind: inspect._ParameterKind
    has_default: bool
    hint: Any = Any


@dataclass(frozen=True)
class Signature:
    """An endpoint's parameters (``self`` and a response port left out) and result type
    (a generator endpoint's: the type of one item)."""

    params: tuple[Param, ...]
    returns: Any = Any


def pack(cls: type) -> dict[str, bytes]:
    """Each endpoint of ``cls``'s signature, packed (``b""`` where it cannot be)."""
    out: dict[str, bytes] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, Endpoint):
                out[name] = _pack_one(value)
    return out


def sign(endpoints: dict[str, EndpointInfo], packed: dict[str, bytes]) -> dict[str, EndpointInfo]:
    """``endpoints`` with their packed signatures."""
    return {
        name: dataclasses.replace(info, signature=packed.get(name, b""))
        for name, info in endpoints.items()
    }


def unpack(blob: bytes) -> Signature | None:
    """The ``Signature`` packed in ``blob``; ``None`` when there is none or it cannot be
    read here (a type from a module this process cannot import)."""
    if not blob:
        return None
    try:
        sig = cloudpickle.loads(blob)
    except Exception:  # a type this process cannot rebuild: no checks, no schema
        return None
    return sig if isinstance(sig, Signature) else None


def _pack_one(ep: Endpoint[Any, Any]) -> bytes:
    try:
        return cloudpickle.dumps(_signature(ep))
    except Exception:  # a hint that cannot travel: the endpoint is served unchecked
        return b""


def _signature(ep: Endpoint[Any, Any]) -> Signature:
    fn = ep.fn
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a hint that names what is not importable here: unchecked, as Any
        hints = {}
    params = list(inspect.signature(fn).parameters.values())[1:]  # self
    if ep.info.port:
        params = params[1:]  # the response port zmesh passes
    returns = hints.get("return", Any)
    if ep.info.stream:
        args = typing.get_args(returns)
        origin = typing.get_origin(returns)
        returns = args[0] if origin in _ITERATORS and args else Any
    return Signature(
        tuple(
            Param(p.name, p.kind, p.default is not p.empty, hints.get(p.name, Any)) for p in params
        ),
        returns,
    )
