"""Arguments from JSON, checked against an endpoint's type hints.

``{"args": [...], "kwargs": {...}}`` is bound to the endpoint's parameters
as Python would bind them, and each value converted to its parameter's type
with msgspec (a ``list[int]`` must hold ints, a ``msgspec.Struct`` or a
dataclass is built from an object). Arguments that do not fit raise
``EndpointError`` here, before anything is sent: the gateway answers 422.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from typing import Any

import msgspec

from zmesh._actor import EndpointInfo
from zmesh._errors import EndpointError
from zmesh._service.signatures import Param, Signature, unpack


class Binder:
    """Binds and converts the JSON arguments of one endpoint.

    An endpoint whose signature did not travel (a hint that cannot be
    rebuilt here) takes any arguments: the replica checks them.
    """

    def __init__(self, service: str, info: EndpointInfo) -> None:
        self.service = service
        self.endpoint = info.name
        self.stream = info.stream
        self.signature: Signature | None = unpack(info.signature)
        self._params: dict[str, Param] = {}
        self._inspect: inspect.Signature | None = None
        self._by_value: list[type] = []
        if self.signature is not None:
            self._params = {p.name: p for p in self.signature.params}
            self._by_value = sorted(
                {c for p in self.signature.params for c in _classes(p.hint) if _by_value(c)},
                key=id,
            )
            for cls in self._by_value:
                _repair(cls)
            self._inspect = inspect.Signature(
                [
                    inspect.Parameter(
                        p.name, p.kind, default=None if p.has_default else inspect.Parameter.empty
                    )
                    for p in self.signature.params
                ]
            )

    def bind(
        self, args: list[Any], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` to call the endpoint with.

        Raises:
            EndpointError: too many, too few or unknown arguments, or a value
                not of its parameter's type.
        """
        if self._inspect is None:
            return tuple(args), kwargs
        try:
            bound = self._inspect.bind(*args, **kwargs)
        except TypeError as exc:
            raise self._error(str(exc)) from exc
        for name, value in bound.arguments.items():
            p = self._params[name]
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                bound.arguments[name] = tuple(self._convert(name, v, p.hint) for v in value)
            elif p.kind is inspect.Parameter.VAR_KEYWORD:
                bound.arguments[name] = {k: self._convert(k, v, p.hint) for k, v in value.items()}
            else:
                bound.arguments[name] = self._convert(name, value, p.hint)
        for cls in self._by_value:
            # msgspec caches what it learnt of a class on the class; a class that
            # travels by value (defined in a script) would carry that cache, which
            # cannot be pickled, to the replica with the value.
            if "__msgspec_cache__" in cls.__dict__:
                delattr(cls, "__msgspec_cache__")
        return bound.args, bound.kwargs

    def _convert(self, name: str, value: Any, hint: Any) -> Any:
        if hint is Any:
            return value
        try:
            return msgspec.convert(value, hint)
        except msgspec.ValidationError as exc:
            raise self._error(f"argument {name!r}: {exc}") from exc
        except TypeError:  # a type msgspec cannot check (any class): the replica gets it as is
            return value

    def _error(self, why: str) -> EndpointError:
        return EndpointError(
            f"arguments do not fit {self.service}.{self.endpoint}: {why}", mesh=self.service
        )


def _classes(hint: Any) -> set[type]:
    """The classes a type hint names (``list[Shape] | None``: list, Shape, NoneType)."""
    found = {hint} if isinstance(hint, type) else set()
    for arg in typing.get_args(hint):
        found |= _classes(arg)
    return found


def _by_value(cls: type) -> bool:
    """Whether ``cls`` cannot be imported by name (cloudpickle sends it by value)."""
    module = sys.modules.get(cls.__module__)
    obj: Any = module
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is not cls or cls.__module__ == "__main__"


def _repair(cls: type) -> None:
    """Make a dataclass sent by value say again which fields have no default.

    Its fields' ``MISSING`` arrives as a copy, not ``dataclasses.MISSING``
    itself, so a field without a default would look like one with a default.
    """
    if not dataclasses.is_dataclass(cls):
        return
    for f in dataclasses.fields(cls):
        for attr in ("default", "default_factory"):
            value = getattr(f, attr)
            if value is not dataclasses.MISSING and type(value).__name__ == "_MISSING_TYPE":
                setattr(f, attr, dataclasses.MISSING)
