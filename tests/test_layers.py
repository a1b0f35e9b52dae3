"""The package's layers, held where they are until the one-house restructure.

Two ratchets, counted from the source (imports under ``if TYPE_CHECKING``
aside): the imports of zmesh code written inside functions (each one hides
an import circle or defers a start-up cost), and the imports between the
package's parts (``_wire``, ``_shared``, ``_client``, ``_host``, ``_service``,
``top``, ``cli``, the face). Neither may grow: a new function-level import
or a new edge between parts fails here, and a change that removes some
lowers the numbers below with it.
"""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "zmesh"

# The most imports of zmesh code inside functions there may be (the forkserver's
# deferred imports are among them, on purpose: see zmesh/_host/forkserver.py).
MAX_INNER_IMPORTS = 104

# Which part imports which today (``face`` is zmesh/__init__.py and the
# top-level modules: _actor, _context, _options, _errors, _typing, testing).
ALLOWED: dict[str, set[str]] = {
    "_wire": {"_errors", "_shared"},
    "_shared": {"_errors", "_wire"},
    "_client": {"face", "_errors", "_host", "_service", "_shared", "_wire"},
    "_host": {"face", "_client", "_errors", "_shared", "_wire"},
    "_service": {"face", "_client", "_errors", "_shared", "_wire"},
    "top": {"_client", "_errors", "_service", "_shared", "_wire"},
    "cli": {"face", "_client", "_errors", "_host", "_shared", "_wire", "top", "http"},
    # The HTTP gateway (zmesh[http]) calls services as any client does.
    "http": {"face", "_client", "_errors", "_service"},
    "face": {"_client", "_errors", "_service", "_shared", "_wire", "cli"},
}
FACE = {"__init__", "__main__", "_actor", "_context", "_options", "_typing", "_version", "testing"}


def _part(module: str) -> str:
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else "__init__"
    return "face" if head in FACE else head


def _scan() -> tuple[int, dict[str, set[str]]]:
    inner = 0
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
        in_function = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                names = [a.name for a in node.names]
            for name in names:
                if name == "zmesh" or name.startswith("zmesh."):
                    inner += id(node) in in_function
                    a, b = _part(module), _part(name)
                    if a != b:
                        edges[a].add(b)
    return inner, edges


def test_imports_inside_functions_do_not_grow() -> None:
    inner, _ = _scan()
    assert inner <= MAX_INNER_IMPORTS, (
        f"{inner} imports of zmesh code inside functions (at most {MAX_INNER_IMPORTS}): "
        "import at the top of the module, or move the code to the layer it belongs to"
    )


def test_no_new_imports_between_parts() -> None:
    _, edges = _scan()
    new = {a: sorted(b - ALLOWED.get(a, set())) for a, b in edges.items()}
    assert {a: b for a, b in new.items() if b} == {}
