"""Pickling user values so that code defined in ``__main__`` travels by value.

A class (or function) defined in a script, ``python -c``, a REPL or a
notebook lives in ``__main__``, which a proc does not have: plain pickle
names it ``__main__.Counter`` and the proc cannot find it. ``cloudpickle``
(what Ray, Dask and Monarch use) sends such code by value instead, and
classes from importable modules by reference, as pickle does.

Plain pickle runs in C and is several times faster, so it goes first; only
a pickle that fails, or that names ``__main__``, is redone with cloudpickle.
A class cloudpickle sent by value keeps its identity: cloudpickle tracks it
by id on both sides, so an instance a proc sends back unpickles as the
caller's own class.

cloudpickle names the file of all code it sends ``<dynamic-code>`` (its
payloads then do not depend on where they were made). Code from a file that
exists keeps that file's name here, so a remote traceback says
``File "train.py", line 12, in step`` and shows the line, as a local one does.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import types
from collections import ChainMap
from collections.abc import Callable
from typing import Any

# How ``__main__`` appears in a plain pickle (protocol 4 and 5 name a
# global's module as a short string); a false positive only costs time.
_MAIN = b"__main__"


def dumps(obj: Any, in_band: Callable[[pickle.PickleBuffer], bool]) -> tuple[bytes, list[Any]]:
    """Pickle ``obj`` (protocol 5), by value for what lives in ``__main__``.

    Args:
        obj: the value.
        in_band: whether a buffer (protocol 5 ``PickleBuffer``) stays in the
            pickle; the others are returned, to travel as frames of their own.

    Returns:
        The pickle and its out-of-band buffers, in the order it needs them.

    Raises:
        Exception: whatever cloudpickle raises for a value it cannot carry.
    """
    out: list[Any] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        if in_band(buf):
            return True
        out.append(buf)
        return False

    try:
        blob = pickle.dumps(obj, protocol=5, buffer_callback=keep)
    except Exception:  # e.g. a lambda, or a class local to a function
        blob = None
    if blob is not None and _MAIN not in blob:
        return blob, out
    out.clear()
    with io.BytesIO() as f:
        _cloud_pickler()(f, protocol=5, buffer_callback=keep).dump(obj)
        return f.getvalue(), out


@functools.cache
def _cloud_pickler() -> Any:
    """cloudpickle's pickler, keeping the file name of code whose file exists."""
    import cloudpickle  # only when needed: importing it costs milliseconds

    reduce_code = getattr(cloudpickle.cloudpickle, "_code_reduce", None)
    if reduce_code is None:  # another cloudpickle: its own names, still by value
        return cloudpickle.Pickler

    def code_with_file(code: types.CodeType) -> Any:
        fn, args = reduce_code(code)
        if not os.path.isfile(code.co_filename):  # <stdin>, a notebook cell: none to name
            return fn, args
        return fn, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)

    class Pickler(cloudpickle.Pickler):
        dispatch_table = ChainMap(
            {types.CodeType: code_with_file}, cloudpickle.Pickler.dispatch_table
        )

    return Pickler
