"""Nasty names: what a mesh, service or detached name may hold, checked on both sides.

Names end up in file names (a proc's log is ``<mesh>.<rank>.g<gen>.log``),
in ``zmesh ps`` rows and in log lines, so a name is a safe token or it is
refused: by ``check_name`` before anything is sent, and by the agent's
decoder for a peer that skips that check. A trailing newline is the one a
``$``-anchored regex lets through (``$`` matches before a final ``\\n``).
"""

from __future__ import annotations

import msgspec
import pytest

from zmesh._wire import messages as w
from zmesh._wire.codec import Codec
from zmesh._wire.names import Name, NameOrAll, check_name

NASTY = [
    "svc\n",
    "svc\r\n",
    "\n",
    "../../etc/passwd",
    "a/b",
    "..",
    "x" * 129,
    "nul\x00",
    "caf\u00e9",
    "\u202eevil",
    "",
    " lead",
]


@pytest.mark.parametrize("name", NASTY)
def test_check_name_refuses(name: str) -> None:
    with pytest.raises(ValueError, match="is not a valid name"):
        check_name(name, "service name")


@pytest.mark.parametrize("name", NASTY)
def test_the_wire_refuses_what_check_name_refuses(name: str) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(name, Name)
    # A peer that skips check_name: the agent's decoder drops the message.
    codec = Codec(w.AGENT_INBOX)
    detach = w.Detach(1, name=name, meshes=["m"], principal="p", kind="mesh", handle=b"")
    with pytest.raises(msgspec.ValidationError):
        codec.decode(codec.encode(detach))


def test_every_mesh_is_the_empty_name_only() -> None:
    assert msgspec.convert("", NameOrAll) == ""
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert("\n", NameOrAll)


def test_good_names_pass() -> None:
    for name in ("embedder", "a.b-c_d", "x" * 128, "v1.2"):
        assert check_name(name, "name") == name
        assert msgspec.convert(name, Name) == name
