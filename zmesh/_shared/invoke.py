"""Running one endpoint call: what a proc does, and the in-process transport too.

* ``invoke(fn, instance, args, kwargs)`` calls the endpoint; a ``TypeError``
  raised by the call itself (no frame inside the endpoint) is
  ``BadArguments``, the arguments did not fit its signature, not an error of
  the user's code;
* ``invoke_sync`` does the same in a worker thread, carrying a
  ``BaseException`` that is no ``Exception`` back as a ``Raised`` value (through
  a future, ``GeneratorExit`` would be thrown into the awaiting task as a
  close, and asyncio treats ``SystemExit`` and ``KeyboardInterrupt`` as its own).
"""

from __future__ import annotations

from typing import Any


class BadArguments(Exception):
    """The arguments did not fit the endpoint's signature (``__cause__`` says how)."""


class Raised:
    """A ``BaseException`` a sync endpoint raised, carried back as a value."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def invoke(fn: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``fn(instance, *args, **kwargs)``; ``BadArguments`` if the call did not fit."""
    try:
        return fn(instance, *args, **kwargs)
    except TypeError as exc:
        # No frame below this one: the call never entered the endpoint.
        tb = exc.__traceback__
        if tb is not None and tb.tb_next is None:
            raise BadArguments() from exc
        raise


def invoke_sync(fn: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``invoke`` for a worker thread: a non-``Exception`` comes back as ``Raised``."""
    try:
        return invoke(fn, instance, args, kwargs)
    except Exception:
        raise
    except BaseException as exc:
        return Raised(exc)
