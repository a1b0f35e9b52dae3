"""An endpoint's exception, pickled so that it comes back whole.

``pickle`` rebuilds an exception by calling its class with ``exc.args``: an
exception whose ``__init__`` takes other arguments than it passes to
``Exception.__init__`` (``MyError(code, detail)`` calling
``super().__init__(f"{code}: {detail}")``) then fails to load, and the
caller would get only text; and ``__cause__`` is dropped on the way. So
``dumps`` pickles each exception of the chain as its class, ``args``,
``__dict__`` and ``__cause__``, and ``_rebuild`` makes it again without
calling ``__init__`` (as ``BaseException.__new__`` allows): the caller gets
an instance of the real class, attributes and cause included.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from zmesh._wire import pickling


def dumps(exc: BaseException) -> bytes | None:
    """``exc`` (and its ``__cause__`` chain) pickled so that it loads again, or
    ``None`` if it cannot be (then it is sent as text only)."""
    for dump in (_dumps_whole, _dumps_by_value):
        try:
            blob = dump(exc)
            pickle.loads(blob)
            return blob
        except Exception:  # an attribute that does not pickle, say: try the next way
            continue
    return None


def _dumps_by_value(exc: BaseException) -> bytes:
    # An exception class of the client's ``__main__`` travels by value.
    return pickling.dumps(exc, lambda buf: True)[0]


def _dumps_whole(exc: BaseException) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf).dump(exc)
    return buf.getvalue()


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, BaseException):
            state = dict(getattr(obj, "__dict__", {}))
            return (_rebuild, (type(obj), obj.args, state, obj.__cause__))
        return NotImplemented


def _rebuild(
    cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any], cause: Any
) -> BaseException:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    exc.__cause__ = cause
    return exc
