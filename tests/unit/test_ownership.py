"""Owner ids and mesh keys (``zmesh._shared.ownership``): what proves what.

The agents and procs that check them are tested end to end in
``tests/security/test_owner_acts.py``; here, the rules themselves, on any
input a peer can send.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zmesh._client.control import local as _local
from zmesh._shared import ownership


def test_an_owner_id_is_proven_by_its_secret_only() -> None:
    secret = os.urandom(16).hex()
    owner = ownership.owner_id("host", 42, secret)
    assert owner.startswith("host:42:")
    assert ownership.proves(owner, secret)
    assert not ownership.proves(owner, secret + "x")
    assert not ownership.proves(owner, "")
    # The token is the proof; host and pid only say where the owner runs.
    assert not ownership.proves("host:42:" + "0" * 16, secret)
    assert ownership.proves("elsewhere:7:" + ownership.token_of(secret), secret)


@given(owner=st.text(), secret=st.text())
def test_any_claim_is_answered_never_raised(owner: str, secret: str) -> None:
    # Whatever a peer sends (non-ASCII, lone surrogates, no colon), the check answers.
    proven = ownership.proves(owner, secret)
    assert proven == (bool(secret) and owner.rpartition(":")[2] == ownership.token_of(secret))


def test_a_mesh_key_is_one_mesh_s_and_one_owner_s() -> None:
    a, b = os.urandom(16).hex(), os.urandom(16).hex()
    assert ownership.mesh_key(a, "m") == ownership.mesh_key(a, "m")
    assert ownership.mesh_key(a, "m") != ownership.mesh_key(a, "n")
    assert ownership.mesh_key(a, "m") != ownership.mesh_key(b, "m")
    # The key reveals neither the secret nor the owner id's token.
    assert a not in ownership.mesh_key(a, "m")
    assert ownership.token_of(a) not in ownership.mesh_key(a, "m")


def test_this_process_s_owner_id_is_made_from_its_secret() -> None:
    assert ownership.proves(_local.owner_id(), _local.owner_secret())
    mine = _local.mesh_proof("some-mesh")
    assert mine == ownership.mesh_key(_local.owner_secret(), "some-mesh")


def test_a_held_key_is_used_for_its_mesh_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_local, "_keys", {})
    _local.hold_key("adopted", "k" * 64)
    assert _local.mesh_proof("adopted") == "k" * 64
    assert _local.mesh_proof("other") == ownership.mesh_key(_local.owner_secret(), "other")
