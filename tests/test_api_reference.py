"""docs/api.md is the code's: every public name, with what its docstring says now."""

from __future__ import annotations

import apiref


def test_every_public_name_has_a_docstring() -> None:
    silent = [
        f"{module}.{name}"
        for module, mod in apiref.modules()
        for name in mod.__all__
        if callable(getattr(mod, name)) and not apiref.summary(getattr(mod, name))
    ]
    assert silent == [], "public names without a docstring"


def test_the_reference_has_not_drifted() -> None:
    assert apiref.DOC.read_text(encoding="utf-8") == apiref.page(), "run: python tools/apiref.py"


def test_the_reference_names_every_public_name() -> None:
    doc = apiref.DOC.read_text(encoding="utf-8")
    for module, mod in apiref.modules():
        for name in mod.__all__:
            assert f"### `{module}.{name}`" in doc, name
