"""Lint and type-check in the suite, so the bar holds without anyone remembering it."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_is_clean() -> None:
    dirs = [d for d in ("zmesh", "tests", "tools", "examples") if (ROOT / d).is_dir()]
    done = _run(sys.executable, "-m", "ruff", "check", *dirs)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean() -> None:
    dirs = [d for d in ("zmesh", "tests", "tools", "examples") if (ROOT / d).is_dir()]
    done = _run(sys.executable, "-m", "ruff", "format", "--check", *dirs)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow  # ~30 s of a core on a fresh clone (no cache): started early
def test_mypy_is_clean() -> None:
    done = _run(sys.executable, "-m", "mypy")
    assert done.returncode == 0, done.stdout + done.stderr
