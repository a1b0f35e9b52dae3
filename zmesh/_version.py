"""``zmesh.__version__``: from the installed package's metadata, or the source tree's."""

from __future__ import annotations

import re
from pathlib import Path


def version() -> str:
    """The version of the zmesh that is imported.

    A source tree (``pyproject.toml`` beside the package, as in a checkout on
    ``PYTHONPATH``) says its own version, even where another zmesh is
    installed; otherwise the installed distribution's metadata does.
    ``"0+unknown"`` when neither can be read.
    """
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        text = pyproject.read_text()
    except OSError:
        text = ""
    if re.search(r'^name\s*=\s*"zmesh"', text, re.M):
        m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
        if m:
            return m.group(1)
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("zmesh")
    except PackageNotFoundError:
        return "0+unknown"
