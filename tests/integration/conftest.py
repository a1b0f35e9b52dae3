"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import zmesh
from zmesh._client.control import local as _local
from zmesh._wire import security as _security

from _helpers import keyed_loopback_agent


@pytest.fixture
def keyed_agent(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """An agent on loopback TCP that admits only the keys it made: (control, keys directory)."""
    keys = str(tmp_path / "keys")
    _security.keygen(keys)
    with keyed_loopback_agent(keys, tmp_path / "logs", "keyed") as control:
        try:
            yield control, keys
        finally:
            zmesh.shutdown()
            _local.configure(None)
            _security.use(None)
