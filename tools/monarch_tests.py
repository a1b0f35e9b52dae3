"""Run Monarch's own actor tests against zmesh, with their imports rewritten.

Usage::

    python tools/monarch_tests.py PATH [-k EXPR] [--timeout S] [--keep] [-- PYTEST ARGS]

PATH is a Monarch checkout or its bare git directory (read with
``git archive``). The actor tests of its ``python/tests/`` (``FILES`` below)
and the helper modules beside them are copied to a temporary directory,
nothing of Monarch is kept, and each ``monarch...`` import is rewritten:
``monarch.actor`` becomes ``zmesh`` (as a Monarch program is ported, see
docs/monarch.md), and a name imported from Monarch's private modules
(``monarch._src...``, ``monarch._rust_bindings...``, ``monarch.config``) is
zmesh's public name of the same spelling when zmesh has one. A name zmesh
does not provide is bound to a stand-in that raises ``NotProvided`` when it is
used, so the tests that need it fail and say which name, and the rest of the
module still runs. pytest then runs the copy (async tests with
``asyncio.run``, as Monarch's ``asyncio_mode = "auto"`` does) and this prints
how many passed, failed and were skipped, and the list.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

# Monarch's tests of its Python actor API; the rest of python/tests/ test its Rust
# bindings, tensor engine, RDMA, jobs and tools, which zmesh does not have.
FILES = ("test_python_actors.py", "test_actor_error.py", "test_supervision_hierarchy.py")

COMPAT = '''"""Stand-ins for the names a Monarch test imports that zmesh does not provide."""

import zmesh


class NotProvided(RuntimeError):
    """A Monarch name zmesh does not provide was used."""


class Missing:
    """Raises NotProvided, naming the Monarch name, on any use."""

    def __init__(self, name):
        self._name = name

    def _fail(self, *args, **kwargs):
        raise NotProvided(f"{self._name} is not provided by zmesh")

    __call__ = _fail
    __enter__ = _fail
    __iter__ = _fail

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self._name}.{attr}")

    def __mro_entries__(self, bases):
        # A test class deriving from a missing one is defined; making one fails.
        return (type(self._name.rsplit(".", 1)[-1], (), {"__init__": self._fail}),)


def get_runtime_config():
    # isolate_in_subprocess copies Monarch's runtime config into its child; zmesh has none.
    return {}


def configure(**settings):
    # ... and sets it there again: nothing to set is fine, anything else is not provided.
    if settings:
        raise NotProvided(f"monarch.config.configure({', '.join(settings)}) is not provided")
'''

CONFTEST = '''"""Runs async tests with asyncio.run, as Monarch's asyncio_mode = "auto" does."""

import asyncio
import inspect

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in names}
        asyncio.run(pyfuncitem.obj(**kwargs))
        return True
    return None
'''

PYTEST_INI = """[pytest]
markers =
    oss_skip: marks tests to skip in OSS CI
timeout = {timeout}
"""

COMPAT_NAMES = {"get_runtime_config", "configure"}


def _zmesh_names() -> set[str]:
    import zmesh

    return set(dir(zmesh))


def _rewrite_import(node: ast.ImportFrom, have: set[str]) -> str:
    """One Monarch ``from ... import`` as zmesh imports and stand-ins."""
    lines = []
    for alias in node.names:
        bound = alias.asname or alias.name
        if alias.name in have:
            lines.append(f"from zmesh import {alias.name} as {bound}")
        elif alias.name in COMPAT_NAMES:
            lines.append(f"from _monarch_compat import {alias.name} as {bound}")
        else:
            full = f"{node.module}.{alias.name}"
            lines.append(f"{bound} = __import__('_monarch_compat').Missing({full!r})")
    return "; ".join(lines)


def rewrite(source: str, have: set[str]) -> str:
    """Rewrite a Monarch test module's ``monarch`` imports to zmesh."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "monarch":
            text = _rewrite_import(node, have)
        elif isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "monarch" for a in node.names
        ):
            text = "import zmesh"
        else:
            continue
        assert node.end_lineno is not None
        edits.append((node.lineno, node.col_offset, node.end_lineno, text))
    for start, col, end, text in sorted(edits, reverse=True):
        indent = lines[start - 1][:col]
        lines[start - 1 : end] = [indent + text + "\n"]
    out = "".join(lines)
    # `import monarch.actor` above became `import zmesh`; its uses follow (also in the
    # scripts some tests hand to a subprocess as a string).
    return re.sub(r"\bmonarch\.actor\b", "zmesh", out)


def _fetch(src: Path, dest: Path) -> Path:
    """Copy python/tests/ of a checkout or bare git dir into dest; return the copy."""
    dest.mkdir(parents=True)
    if (src / "python" / "tests").is_dir():
        shutil.copytree(src / "python" / "tests", dest / "python" / "tests")
    else:
        archive = subprocess.run(
            ["git", "--git-dir", str(src), "archive", "HEAD", "python/tests"],
            check=True, capture_output=True,
        ).stdout  # fmt: skip
        subprocess.run(["tar", "x", "-C", str(dest)], input=archive, check=True)
    return dest / "python" / "tests"


def prepare(src: Path, work: Path, timeout: int) -> list[str]:
    """Write the rewritten tests, helpers and config into work; return the test files."""
    tests = _fetch(src, work / "monarch")
    have = _zmesh_names()
    for path in sorted(tests.glob("*.py")):
        if path.name.startswith("test_") and path.name not in FILES:
            continue
        if path.name in ("conftest.py", "crash_recovery_plugin.py"):
            continue
        (work / path.name).write_text(rewrite(path.read_text(), have))
    shutil.rmtree(work / "monarch")
    (work / "_monarch_compat.py").write_text(COMPAT)
    (work / "conftest.py").write_text(CONFTEST)
    (work / "pytest.ini").write_text(PYTEST_INI.format(timeout=timeout))
    return [name for name in FILES if (work / name).exists()]


def _results(xml: Path) -> dict[str, tuple[str, str]]:
    """Test id -> (outcome, first line of its failure) from pytest's junit XML."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(xml).iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}.py::{case.get('name')}"
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                why = (el.get("message") or "").splitlines()[0][:160] if el.get("message") else ""
                break
        out[name] = (outcome, why)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the rewritten tests and print the counts and the list."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="a Monarch checkout or its bare git dir")
    parser.add_argument("-k", default=None, help="pytest -k expression")
    parser.add_argument("--timeout", type=int, default=60, help="per-test timeout (s)")
    parser.add_argument("--keep", action="store_true", help="keep and print the temp dir")
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: len(argv) - len(extra) - (1 if extra else 0)])
    work = Path(tempfile.mkdtemp(prefix="monarch-tests-"))
    try:
        files = prepare(args.path.resolve(), work, args.timeout)
        cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider",
               "-o", "addopts=", "--continue-on-collection-errors",
               f"--junitxml={work / 'results.xml'}", *extra]  # fmt: skip
        if args.k:
            cmd += ["-k", args.k]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(work), env.get("PYTHONPATH", "")) if p)
        subprocess.run(cmd, cwd=work, env=env, check=False)
        results = _results(work / "results.xml")
        counts: dict[str, int] = {}
        for name, (outcome, why) in sorted(results.items()):
            counts[outcome] = counts.get(outcome, 0) + 1
            print(f"{outcome:7} {name}" + (f"  -- {why}" if why and outcome != "passed" else ""))
        total = len(results)
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        print(f"\n{counts.get('passed', 0)} of {total} passed ({summary})")
        if args.keep:
            print(f"kept in {work}")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
