"""The package as a library: its version, and a logger that stays quiet unless configured."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import zmesh
from zmesh._version import version

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_source_trees() -> None:
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared is not None
    assert zmesh.__version__ == declared.group(1) == version()
    assert "__version__" in dir(zmesh)


def test_version_without_a_source_tree_comes_from_metadata(tmp_path: Path) -> None:
    # The same module, copied where no pyproject.toml stands beside it.
    (tmp_path / "pkg").mkdir()
    shutil.copy(ROOT / "zmesh" / "_version.py", tmp_path / "pkg" / "_version.py")
    code = "from pkg._version import version; print(version())"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        want = installed("zmesh")
    except PackageNotFoundError:
        want = "0+unknown"
    assert done.stdout.strip() == want


def test_the_zmesh_logger_has_a_null_handler_and_propagates() -> None:
    logger = logging.getLogger("zmesh")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    assert logger.propagate  # an application's handlers still get the records


def test_importing_zmesh_does_not_read_metadata() -> None:
    code = "import sys, zmesh; print('importlib.metadata' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
