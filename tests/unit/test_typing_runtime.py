"""The typed endpoints are for checkers only: at run time nothing changes.

The claims a checker sees are in tests/typing/ (checked by mypy).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import zmesh
from zmesh._actor import Endpoint


class Typed(zmesh.Actor):
    @zmesh.endpoint
    def incr(self, by: int) -> int:
        return by + 1

    @zmesh.endpoint(batch=4)
    def embed(self, xs: list[int]) -> list[int]:
        return xs

    @zmesh.concurrent_endpoint(retry=False)
    def tokens(self, n: int) -> Iterator[str]:
        yield from "ab"[:n]


def test_actor_has_no_handle_base_at_run_time() -> None:
    # The handle's methods are declared on Actor for checkers only: at run
    # time its one base is ActorBase (what zmesh's own code checks).
    from zmesh._actor import ActorBase

    assert zmesh.Actor.__mro__ == (zmesh.Actor, ActorBase, object)
    assert not hasattr(zmesh.Actor, "slice") and not hasattr(zmesh.Actor, "call_one")


def test_the_public_names_are_the_handle_classes() -> None:
    from zmesh._client.handles.mesh import ActorMesh
    from zmesh._service.service import Service

    assert zmesh.ActorMesh is ActorMesh and zmesh.Service is Service


def test_decorators_with_and_without_arguments_make_endpoints() -> None:
    for name in ("incr", "embed", "tokens"):
        assert isinstance(vars(Typed)[name], Endpoint)
    assert Typed.embed.info.batch == 4
    assert Typed.tokens.info.stream and Typed.tokens.info.concurrent
    assert not Typed.tokens.info.retry
    assert Typed().incr(1) == 2  # in the actor, the plain method


def test_importing_zmesh_does_not_import_the_typing_module() -> None:
    code = (
        "import sys, zmesh\n"
        "class C(zmesh.Actor):\n"
        "    @zmesh.endpoint\n"
        "    def f(self, x: int) -> int: return x\n"
        "zmesh.ActorMesh, zmesh.Service, C.options()\n"
        "print('zmesh._typing' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
