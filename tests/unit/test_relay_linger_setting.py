"""``ZMESH_RELAY_LINGER``: seconds from 0 to 10; anything else is the default, said once."""

from __future__ import annotations

import logging

import pytest

from zmesh._host.proc import relayback


@pytest.mark.parametrize(
    ("text", "want"),
    [("", relayback.ACK_LINGER), ("0.05", 0.05), ("0", 0.0), ("20ms", relayback.ACK_LINGER),
     ("nan", relayback.ACK_LINGER), ("-1", relayback.ACK_LINGER), ("1e9", relayback.ACK_LINGER)],
)  # fmt: skip
def test_a_bad_linger_falls_back_to_the_default_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, text: str, want: float
) -> None:
    monkeypatch.setenv("ZMESH_RELAY_LINGER", text)
    with caplog.at_level(logging.WARNING, logger="zmesh.relay"):
        assert relayback._linger() == want
    bad = want == relayback.ACK_LINGER and text not in ("", str(relayback.ACK_LINGER))
    assert ("ZMESH_RELAY_LINGER" in caplog.text) == bad
