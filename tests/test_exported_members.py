"""zmesh's public face: ``__all__`` is sorted and complete, and documented.

After httpx's ``tests/test_exported_members.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import types

import pytest

import zmesh


def _public_names() -> list[str]:
    # Submodules (zmesh.testing, zmesh.cli) show up in vars(zmesh) once
    # imported; they are not names __init__.py defines. Most names load on
    # first use (PEP 562), so the lazy table counts as defined too.
    loaded = {
        name
        for name, value in vars(zmesh).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    loaded -= {"TYPE_CHECKING", "Any", "importlib"}
    return sorted(loaded | set(zmesh._LAZY))


def test_names_load_on_first_use_and_unknown_names_fail() -> None:
    assert set(zmesh._LAZY) <= set(dir(zmesh))
    with pytest.raises(AttributeError, match="no_such_name"):
        zmesh.no_such_name  # noqa: B018


def test_all_is_sorted() -> None:
    assert zmesh.__all__ == sorted(zmesh.__all__)


def test_all_imports_are_exported() -> None:
    assert zmesh.__all__ == sorted(_public_names())


def test_every_exported_name_exists() -> None:
    missing = [name for name in zmesh.__all__ if not hasattr(zmesh, name)]
    assert missing == []


def test_every_exported_name_has_a_docstring() -> None:
    undocumented = []
    for name in zmesh.__all__:
        obj = getattr(zmesh, name)
        # A class's own docstring, not one inherited (inspect.getdoc would
        # find Exception's) nor the signature dataclasses write when none.
        doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
        if dataclasses.is_dataclass(obj) and doc and doc.startswith(f"{name}("):
            doc = None
        if not (doc and inspect.cleandoc(doc).strip()):
            undocumented.append(name)
    assert undocumented == []


def test_errors_say_zmesh_in_tracebacks_and_pickles() -> None:
    import pickle

    for name in zmesh._errors.__all__:
        cls = getattr(zmesh, name)
        assert cls.__module__ == "zmesh", name
        assert pickle.loads(pickle.dumps(cls)) is cls
    err = zmesh.SupervisionError("gone")
    assert type(pickle.loads(pickle.dumps(err))) is zmesh.SupervisionError
    assert repr(zmesh.ZmeshError).startswith("<class 'zmesh.ZmeshError'")


def test_the_documented_error_tree_names_every_error() -> None:
    tree = set((zmesh._errors.__doc__ or "").split())
    assert [n for n in zmesh._errors.__all__ if n not in tree] == []


def test_every_error_class_is_exported() -> None:
    errors = {
        name
        for name, value in vars(zmesh._errors).items()
        if isinstance(value, type) and issubclass(value, zmesh.ZmeshError)
    }
    assert sorted(errors) == sorted(zmesh._errors.__all__)
