"""Write the module map of docs/architecture.md from each module's docstring summary.

The map is the table between the ``modmap`` markers in docs/architecture.md:
one row per module of ``zmesh/``, grouped by package, each saying what the
first paragraph of the module's docstring says. ``python tools/modmap.py`` rewrites
it; ``--check`` exits 1 when the doc has drifted from the code (and
tests/test_module_map.py runs that check), so the map stays true as modules
come and go.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "zmesh"
DOC = ROOT / "docs" / "architecture.md"
START = "<!-- modmap:start (written by tools/modmap.py: edit the docstrings, not this table) -->"
END = "<!-- modmap:end -->"


def first_line(path: pathlib.Path) -> str:
    """The summary of a module's docstring (its first paragraph), or "" when it has none."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    summary = " ".join(doc.strip().split("\n\n")[0].split())
    return summary.removesuffix(":").removesuffix(":")


def table() -> str:
    """The module map as a markdown table, packages in path order."""
    rows = ["| module | what it holds |", "|---|---|"]
    for package in sorted({p.parent for p in PACKAGE.rglob("*.py")}):
        rel = package.relative_to(PACKAGE)
        prefix = "" if rel == pathlib.Path(".") else f"{rel.as_posix()}/"
        if prefix:
            rows.append(f"| **`{prefix}`** | **{first_line(package / '__init__.py')}** |")
        for module in sorted(package.glob("*.py")):
            if prefix and module.name == "__init__.py":
                continue
            rows.append(f"| `{prefix}{module.name}` | {first_line(module).replace('|', '/')} |")
    return "\n".join(rows)


def written(doc: str) -> str:
    """``doc`` with the table between the markers made anew."""
    head, sep, rest = doc.partition(START)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise SystemExit(f"{DOC}: the modmap markers are missing")
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the doc has drifted")
    args = parser.parse_args()
    doc = DOC.read_text(encoding="utf-8")
    new = written(doc)
    if args.check:
        if new != doc:
            print("docs/architecture.md's module map has drifted: run tools/modmap.py")
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
