"""The mistakes people make get messages that say what is wrong and how to fix it."""

from __future__ import annotations

import concurrent.futures
import pickle

import pytest

import zmesh
from zmesh._client.calls.future import Future
from zmesh._wire import excpickle


@pytest.mark.parametrize("name", ["state", "stop", "slice", "sizes", "endpoints"])
def test_an_endpoint_named_like_a_handle_attribute_is_refused_at_class_definition(
    name: str,
) -> None:
    with pytest.raises(TypeError, match=rf"Bad\.{name}: an endpoint may not be named '{name}'"):
        type("Bad", (zmesh.Actor,), {name: zmesh.endpoint(lambda self: 1)})


def test_other_endpoint_names_are_fine() -> None:
    class Fine(zmesh.Actor):
        @zmesh.endpoint
        def get_state(self) -> int:
            return 1

    assert Fine.options().name == "fine"


def test_an_endpoint_may_be_named_get_as_in_monarch() -> None:
    class Store(zmesh.Actor):
        @zmesh.endpoint  # (to a checker it overrides the handle's .get: docs/monarch.md)
        def get(self, key: str) -> str:  # type: ignore[override]
            return key

    assert isinstance(vars(Store)["get"], zmesh.Endpoint)  # defined, not refused


def test_options_say_what_is_wrong_in_their_own_terms() -> None:
    class Counter(zmesh.Actor):
        pass

    with pytest.raises(TypeError, match=r"Counter\.options\(\): procs must be an int .*'2'"):
        Counter.options(procs="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Counter\.options\(\): hosts must be at least 1"):
        Counter.options(hosts=0)
    with pytest.raises(TypeError, match=r"unknown setting 'procz' \(did you mean 'procs'\?\)"):
        Counter.options(procz=2)
    hint = r"'actor_per_proc' \(did you mean 'actors_per_proc'\?\).*as_actor\(\): actors_per_proc"
    with pytest.raises(TypeError, match=hint):
        Counter.options(actor_per_proc=2)
    with pytest.raises(ValueError, match=r"Counter\.options\(\): max_concurrent_requests"):
        Counter.options(replicas=2, max_concurrent_requests=0)


def test_a_forgotten_await_or_get_gets_a_hint() -> None:
    fut: Future[int] = Future(cfut=concurrent.futures.Future())
    with pytest.raises(AttributeError, match=r"no attribute 'incr'.*forget 'await' or '\.get\(\)'"):
        fut.incr  # type: ignore[attr-defined]  # noqa: B018  (a checker says so too)
    with pytest.raises(AttributeError):
        fut.__wrapped__  # type: ignore[attr-defined]  # noqa: B018  (a protocol's name)


class Coded(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code


def test_an_exception_with_a_multi_argument_init_comes_back_whole_with_its_cause() -> None:
    try:
        try:
            raise ValueError("the root")
        except ValueError as root:
            raise Coded(7, "bad input") from root
    except Coded as exc:
        blob = excpickle.dumps(exc)
    assert blob is not None
    back = pickle.loads(blob)
    assert type(back) is Coded and back.code == 7 and str(back) == "7: bad input"
    assert isinstance(back.__cause__, ValueError) and str(back.__cause__) == "the root"


def test_the_reserved_names_are_every_public_attribute_of_the_handles() -> None:
    """The list kept for classes defined before the handles are imported is complete."""
    from zmesh._actor import _HANDLE_ATTRS
    from zmesh._client.handles.mesh import ActorMesh
    from zmesh._service.service import Service

    public = {n for cls in (ActorMesh, Service) for n in dir(cls) if not n.startswith("_")}
    assert public <= _HANDLE_ATTRS, f"add to _HANDLE_ATTRS: {sorted(public - _HANDLE_ATTRS)}"
