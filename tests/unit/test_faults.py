"""zmesh's default ``unhandled_fault_hook``: a failure nobody handled is seen.

The ``zmesh`` logger has only a ``NullHandler`` (a library's logger must not
decide where records go), so with no logging configured a logged failure
would vanish: the default hook then prints it to stderr instead.
"""

from __future__ import annotations

import logging

import pytest

from zmesh._client.control import faults
from zmesh._shared.state import Status

FAILURE = faults.MeshFailure(
    mesh="workers-1a2b3c4d", rank=2, host="local", status=Status.FAILED,
    reason="killed by SIGKILL", generation=1, log_path="/tmp/w.2.g1.log", exit_code=-9,
)  # fmt: skip


def test_a_logger_with_only_null_handlers_is_not_configured() -> None:
    root = logging.Logger("app")
    child = logging.Logger("app.zmesh")
    child.parent = root
    child.addHandler(logging.NullHandler())
    assert not faults._logging_configured(child)
    root.addHandler(logging.StreamHandler())
    assert faults._logging_configured(child)  # the application's handler, by propagation
    child.propagate = False
    assert not faults._logging_configured(child)


def test_the_default_hook_prints_to_stderr_when_logging_is_not_configured(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(faults, "_logging_configured", lambda logger: False)
    faults.unhandled_fault_hook(FAILURE)
    err = capsys.readouterr().err
    assert "zmesh: unhandled mesh failure" in err
    assert "workers-1a2b3c4d" in err and "killed by SIGKILL" in err and "/tmp/w.2.g1.log" in err


def test_the_default_hook_logs_when_logging_is_configured(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with caplog.at_level(logging.ERROR, logger="zmesh"):
        faults.unhandled_fault_hook(FAILURE)
    assert any("unhandled mesh failure" in r.getMessage() for r in caplog.records)
    assert "unhandled mesh failure" not in capsys.readouterr().err
