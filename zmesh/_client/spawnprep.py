"""Re-create the client's ``__main__`` in a proc, as multiprocessing's spawn does.

A class defined in the user's script lives in ``__main__``; a proc is a fresh
interpreter, so it must run that script (as ``__mp_main__``, so its
``if __name__ == "__main__":`` block does not run) before it can unpickle the
class. We hand the work to ``multiprocessing.spawn.prepare``, which is what
``multiprocessing`` itself uses.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import msgspec

from zmesh._wire.messages import MainSpec


def preparation() -> MainSpec:
    """What a proc needs to rebuild this process's ``__main__``, ``sys.path`` and cwd."""
    data: dict[str, Any] = {"sys_path": list(sys.path), "dir": os.getcwd()}
    main = sys.modules.get("__main__")
    if main is not None:
        # A proc runs our script as ``__mp_main__``, so instances of its
        # classes come back pickled as ``__mp_main__.X``: let that name
        # resolve here, as ``import multiprocessing`` does in a parent.
        sys.modules.setdefault("__mp_main__", main)
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", "pytest", "pytest.__main__"):
        name = spec.name
        if name.endswith(".__main__"):
            name = name[: -len(".__main__")]
        data["init_main_from_name"] = name
    else:
        path = getattr(main, "__file__", None)
        if path and _is_script(path):
            data["init_main_from_path"] = os.path.abspath(path)
    return MainSpec(**data)


def _is_script(path: str) -> bool:
    # pytest, python -c and REPLs have no script to re-run.
    base = os.path.basename(path)
    return path.endswith(".py") and base not in ("pytest", "py.test", "__main__.py")


def prepare(data: MainSpec | dict[str, Any]) -> None:
    """Apply ``preparation()`` in a fresh proc (as a ``MainSpec`` or its JSON form).

    Raises:
        msgspec.ValidationError: ``data`` is not a ``MainSpec``.
    """
    from multiprocessing import spawn

    global preparing
    main = data if isinstance(data, MainSpec) else msgspec.convert(data, MainSpec)
    # multiprocessing's own keys; an empty value means "not given".
    todo = {k: v for k, v in msgspec.structs.asdict(main).items() if v}
    if not todo:
        return
    preparing = True
    try:
        spawn.prepare(todo)
    finally:
        preparing = False


# True while a proc re-runs the client's script: spawning then means the
# script spawns at import time, which would recurse once per proc.
preparing = False


def check_not_preparing() -> None:
    """Refuse to spawn from a script that a proc is re-running for its classes.

    Raises:
        RuntimeError: with the fix, as multiprocessing does in the same case.
    """
    if preparing:
        raise RuntimeError(
            "this script spawns zmesh meshes when it is imported; a proc re-runs the "
            "script (as __mp_main__) to find its actor classes, so it would spawn again. "
            "Put the code that spawns under  if __name__ == '__main__':"
        )
