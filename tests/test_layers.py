"""The package's layers: each part imports only the parts below it.

Counted from the source (imports under ``if TYPE_CHECKING`` aside, since
they never run), imports inside functions included: an import written
inside a function is still an arrow between parts, only a later one.

From the bottom up (docs/architecture.md says what each part is):

- ``_errors``: the exceptions every part raises;
- ``_shared``: what every process needs (paths, states, statistics, workers);
- ``_wire``: what crosses a socket (messages, codec, sockets, CURVE);
- ``_actor``: what a class declares (endpoints, and who is running now);
- ``_client``: the caller's runtime (handles, calls, ports, control);
- ``_host``: a host's processes (the agent and its forkserver, the procs),
  whose actors are callers too;
- ``_service``: replicated services, built of actor meshes;
- the face: ``zmesh/__init__.py`` and the modules it lends names from
  (``_options``, ``_context``, ``_lookup``, ``_this_proc``, ``_singletons``,
  ``_typing``), and its submodules ``routing`` and ``testing``;
- ``http``, the HTTP gateway (``zmesh[http]``), a client of services as any script is;
- ``top``, then ``cli``.

Imports inside functions are also few, and each one says why it is late.
And the rooms stay small: no module over 500 lines, no class over 300.
"""

from __future__ import annotations

import ast
import functools
import pathlib
from collections import defaultdict

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "zmesh"

LAYERS = [
    "_errors", "_shared", "_wire", "_actor", "_client", "_host", "_service", "face", "http", "top",
    "cli",
]  # fmt: skip
FACE = {
    "__init__", "__version__", "_context", "_lookup", "_options", "_singletons", "_this_proc",
    "_typing", "_version", "routing", "testing",
}  # fmt: skip

# The most imports of zmesh code inside functions there may be, each with
# its reason where it is (docs/architecture.md lists them): the
# forkserver's warm-up, the face's (``import zmesh`` loads only what a
# script uses), the dashboard's, and ProcMesh.spawn's.
MAX_INNER_IMPORTS = 15


def _part(module: str) -> str:
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else "__init__"
    if head == "__main__":
        return "cli"
    return "face" if head in FACE else head


@functools.cache
def _scan() -> tuple[list[str], dict[tuple[str, str], list[str]]]:
    """The imports inside functions, and every arrow between parts (with where it is)."""
    inner: list[str] = []
    arrows: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
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
                base = node.module or ""
                names = [f"zmesh.{a.name}" for a in node.names] if base == "zmesh" else [base]
            else:
                names = [a.name for a in node.names]
            names = [n for n in names if n == "zmesh" or n.startswith("zmesh.")]
            if not names:
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            if id(node) in in_function:
                inner.append(where)
            for name in names:
                a, b = _part(module), _part(name)
                if a != b:
                    arrows[(a, b)].append(where)
    return inner, arrows


def test_every_part_is_a_layer() -> None:
    found = {_part(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts))
             for p in PACKAGE.rglob("*.py")}  # fmt: skip
    assert found <= set(LAYERS), f"a part with no place in LAYERS: {sorted(found - set(LAYERS))}"


def test_parts_import_only_the_layers_below() -> None:
    _, arrows = _scan()
    up = {
        f"{a} -> {b}: {', '.join(where)}"
        for (a, b), where in arrows.items()
        if LAYERS.index(b) > LAYERS.index(a)
    }
    assert not up, "imports that run up the layers (move the code to its layer):\n" + "\n".join(
        sorted(up)
    )


def test_imports_inside_functions_do_not_grow() -> None:
    inner, _ = _scan()
    assert len(inner) <= MAX_INNER_IMPORTS, (
        f"{len(inner)} imports of zmesh code inside functions (at most {MAX_INNER_IMPORTS}): "
        "import at the top of the module, or move the code to the layer it belongs to"
    )


# Modules you can hold in your head: no module over 500 lines, no class
# over 300. Over the limit only what is being split now, by name, with its
# size then, so the list can only shrink (empty: everything is within).
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300
OVER_THE_LIMIT: dict[str, int] = {}


def _sizes() -> dict[str, int]:
    """Lines of every module, and of every class (``path:Class``), in the package."""
    sizes: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent).as_posix()
        source = path.read_text(encoding="utf-8")
        sizes[name] = len(source.splitlines())
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                sizes[f"{name}:{node.name}"] = node.end_lineno - node.lineno + 1
    return sizes


def test_modules_and_classes_keep_to_their_size() -> None:
    sizes = _sizes()
    over = [
        f"{name}: {lines} lines (at most {limit})"
        for name, lines in sizes.items()
        for limit in [MAX_CLASS_LINES if ":" in name else MAX_MODULE_LINES]
        if lines > max(limit, OVER_THE_LIMIT.get(name, 0))
    ]
    assert not over, "split by job into small modules with one job each:\n" + "\n".join(over)


def test_the_size_allow_list_only_shrinks() -> None:
    sizes = _sizes()
    stale = [
        f"{name}: {sizes.get(name, 0)} lines now, allowed {allowed}"
        for name, allowed in OVER_THE_LIMIT.items()
        for limit in [MAX_CLASS_LINES if ":" in name else MAX_MODULE_LINES]
        if sizes.get(name, 0) <= limit
    ]
    assert not stale, "back within the limit: take it off OVER_THE_LIMIT:\n" + "\n".join(stale)


# Rooms inside a part, by role: the path says which process runs a line.
# In ``_host`` the proc never imports the agent's room (the agent starts
# and preloads procs; a proc knows nothing of its agent's code). In
# ``_client`` the call path is the core: it imports neither the handles
# the user holds nor ports and streams, which are built on it (type
# hints aside, as for the parts).
ROOMS = {
    "_host": {"agent", "proc"},
    "_client": {"calls", "control", "handles", "ports"},
}
ROOMS_BELOW = {
    ("_host", "proc"): {"agent"},
    ("_client", "calls"): {"handles", "ports"},
}


def _room(module: str) -> tuple[str, str] | None:
    parts = module.split(".")
    if len(parts) >= 4 and parts[1] in ROOMS:
        return parts[1], parts[2]
    return None


def test_every_module_of_a_roomed_part_is_in_a_room() -> None:
    loose = [
        str(p.relative_to(PACKAGE.parent))
        for part in ROOMS
        for p in (PACKAGE / part).glob("*.py")
        if p.name != "__init__.py"
    ]
    rooms = {
        (part, p.name) for part in ROOMS for p in (PACKAGE / part).iterdir() if p.is_dir()
        if p.name != "__pycache__"
    }  # fmt: skip
    assert not loose, f"modules outside the rooms of their part: {loose}"
    assert rooms == {(part, r) for part, rs in ROOMS.items() for r in rs}


def test_rooms_keep_their_order() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        room = _room(module)
        if room is None or room not in ROOMS_BELOW:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and id(node) not in skip:
                target = _room(node.module + ".x")
                if target and target[0] == room[0] and target[1] in ROOMS_BELOW[room]:
                    wrong.append(f"{module}:{node.lineno} imports {node.module}")
    assert not wrong, "a room imports one built on it:\n" + "\n".join(wrong)
