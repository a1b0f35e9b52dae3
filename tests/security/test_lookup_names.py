"""``zmesh.lookup`` with nasty names: a clear ``ValueError`` at once, as spawning would give.

Only a valid name can be filed (``Detach`` carries a ``Name``), so a name
that is none is refused before anything is sent. Before, the agent's
decoder refused the ``Lookup`` (a NUL, over 4096 characters, not a string)
and the client, reading that answer as a ``LookupReply``, failed with an
``AttributeError``; a lone surrogate failed with ``UnicodeEncodeError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import zmesh
from zmesh._wire import security as _security

from _helpers import connected, keyed_loopback_agent

NASTY: list[Any] = ["x" * 5000, "a\x00b", "\udcff", "svc\n", "../../etc/passwd", "", 5, None]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("lookup-names")
    keys = str(root / "keys")
    _security.keygen(keys)
    with keyed_loopback_agent(keys, root / "logs", "names") as control:
        with connected([control], keys=keys):
            yield control


@pytest.mark.parametrize("name", NASTY, ids=lambda v: repr(v)[:24])
def test_a_name_that_is_none_is_a_value_error_at_once(agent: str, name: Any) -> None:
    with pytest.raises(ValueError, match="is not a valid name"):
        zmesh.lookup(name)


def test_a_valid_unknown_name_is_name_not_found(agent: str) -> None:
    with pytest.raises(zmesh.NameNotFoundError, match="x" * 100):
        zmesh.lookup("x" * 128).get(timeout=30)
