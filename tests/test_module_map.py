"""docs/architecture.md's module map is the code's: every module, with its docstring's summary."""

from __future__ import annotations

import pathlib

import modmap


def test_every_module_says_what_it_holds() -> None:
    silent = [p for p in sorted(modmap.PACKAGE.rglob("*.py")) if not modmap.first_line(p)]
    assert silent == [], "modules without a docstring"


def test_the_map_in_the_docs_has_not_drifted() -> None:
    doc = modmap.DOC.read_text(encoding="utf-8")
    assert modmap.written(doc) == doc, "run: python tools/modmap.py"


def test_the_map_names_every_module() -> None:
    doc = modmap.DOC.read_text(encoding="utf-8")
    for path in modmap.PACKAGE.rglob("*.py"):
        rel = path.relative_to(modmap.PACKAGE).as_posix()
        if not (rel.endswith("__init__.py") and "/" in rel):
            assert f"| `{rel}` |" in doc, rel
    assert pathlib.Path(modmap.__file__).parent.name == "tools"
