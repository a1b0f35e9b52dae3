"""Write docs/api.md, the API reference, from the docstrings of zmesh's public names.

One section per name of ``zmesh.__all__``, ``zmesh.routing.__all__``,
``zmesh.testing.__all__`` and ``zmesh.http.__all__``, in that order: its
signature, its docstring as written, and for a class its public methods and
properties with the summary line of each.
``python tools/apiref.py`` rewrites the page; ``--check`` exits 1 when it has
drifted from the code (tests/test_api_reference.py runs that check), so the
reference says what the code says.
"""

from __future__ import annotations

import argparse
import inspect
import pathlib
import re
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "api.md"
HEAD = """# API reference

Written by `tools/apiref.py` from the docstrings (edit those, not this
page). The guide explains how the pieces fit: [guide.md](guide.md).
"""
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # a default's repr must not change between runs


def modules() -> list[tuple[str, Any]]:
    """The public modules, as (name, module)."""
    sys.path.insert(0, str(ROOT))
    import zmesh
    import zmesh.http
    import zmesh.routing
    import zmesh.testing

    return [
        ("zmesh", zmesh),
        ("zmesh.routing", zmesh.routing),
        ("zmesh.testing", zmesh.testing),
        ("zmesh.http", zmesh.http),
    ]


def signature(obj: Any) -> str:
    """``obj``'s call signature (a class: its constructor's), ``""`` if it has none."""
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return _ADDRESS.sub("", sig)


def summary(obj: Any) -> str:
    """The first paragraph of ``obj``'s docstring, on one line."""
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())


def members(cls: type) -> list[tuple[str, str]]:
    """A class's own public methods and properties: (``name(args)``, summary)."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            out.append((name, summary(value)))
        elif isinstance(value, (staticmethod, classmethod)):  # bound: no cls in the signature
            out.append((f"{name}{signature(getattr(cls, name))}", summary(value.__func__)))
        elif inspect.isfunction(value):
            out.append((f"{name}{signature(value)}", summary(value)))
    return out


def section(module: str, name: str, obj: Any) -> str:
    """The reference of one public name."""
    kind = "exception" if isinstance(obj, type) and issubclass(obj, BaseException) else (
        "class" if isinstance(obj, type) else "function" if callable(obj) else "value"
    )  # fmt: skip
    lines = [f"### `{module}.{name}`", "", f"*{kind}*", ""]
    sig = signature(obj) if kind in ("class", "function") else ""
    if sig:
        lines += ["```text", f"{name}{sig}", "```", ""]
    doc = inspect.getdoc(obj) if kind != "value" else ""
    if doc:
        lines += ["```text", doc, "```", ""]
    if kind == "class":
        rows = members(obj)
        if rows:
            lines += ["| member | |", "|---|---|"]
            lines += [f"| `{_cell(m)}` | {_cell(s)} |" for m, s in rows]
            lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a table cell ends at a bare |


def page() -> str:
    """The whole reference page."""
    parts = [HEAD]
    for module_name, module in modules():
        parts.append(f"## `{module_name}`\n")
        for name in module.__all__:
            parts.append(section(module_name, name, getattr(module, name)))
    return "\n".join(parts).rstrip("\n") + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page has drifted")
    args = parser.parse_args()
    new = page()
    if args.check:
        if not DOC.exists() or DOC.read_text(encoding="utf-8") != new:
            print("docs/api.md has drifted from the docstrings: run tools/apiref.py")
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
