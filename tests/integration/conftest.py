"""Fixtures shared by the integration tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import zmesh
from zmesh._client import local as _local
from zmesh._client.local import await_ready
from zmesh._wire import security as _security


@pytest.fixture
def keyed_agent(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """An agent on loopback TCP that admits only the keys it made: (control, keys directory)."""
    keys = str(tmp_path / "keys")
    _security.keygen(keys)
    logs = tmp_path / "logs"
    logs.mkdir()
    with open(logs / "agent.log", "ab") as err:
        popen = subprocess.Popen(
            [sys.executable, "-m", "zmesh", "agent", "--bind", "tcp://127.0.0.1:0",
             "--keys", keys, "--label", "keyed", "--log-dir", str(logs)],
            stdout=subprocess.PIPE, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        info = await_ready(popen, str(logs / "agent.log"))
        yield info.control, keys
    finally:
        zmesh.shutdown()
        _local.configure(None)
        _security.use(None)
        popen.terminate()
        popen.wait(timeout=10)
