"""The gateway's pure parts: statuses of zmesh's errors, arguments bound and
checked against packed type hints, the token file, the bind address."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

import zmesh
from zmesh._actor import endpoints_of
from zmesh._errors import (
    ActorError,
    ActorStoppedError,
    AgentError,
    AgentTimeoutError,
    CallTimeoutError,
    EncodeError,
    EndpointError,
    NameNotFoundError,
    SecurityError,
    ServiceError,
    ServiceOverloadedError,
    SupervisionError,
)
from zmesh._service import signatures
from zmesh.http import errors, server, tokens
from zmesh.http.binding import Binder
from zmesh.http.schemas import Schemas


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (NameNotFoundError("no such name"), 404),
        (EndpointError("bad arguments"), 422),
        (ServiceError("no replica became healthy"), 503),
        (ServiceOverloadedError("every queue full"), 503),
        (ActorStoppedError("stopped"), 503),
        (SupervisionError("replica died"), 503),
        (AgentError("unreachable"), 503),
        (CallTimeoutError("timed out"), 504),
        (AgentTimeoutError("agent slow"), 504),
        (EncodeError("cannot send"), 500),
        (RuntimeError("bug"), 500),
    ],
)
def test_each_error_has_its_status(exc: Exception, status: int) -> None:
    got, kind, message = errors.describe(exc)
    assert (got, kind) == (status, type(exc).__name__)
    assert message == str(exc)
    assert errors.headers_for(got) == ([(b"retry-after", b"1")] if status == 503 else [])


def test_an_endpoints_exception_keeps_its_remote_type() -> None:
    exc = ActorError("mod.Oops", "it broke", "Traceback ...", endpoint="run")
    assert errors.describe(exc) == (500, "mod.Oops", "it broke")
    assert msgspec.json.decode(errors.body("mod.Oops", "it broke")) == {
        "error": {"type": "mod.Oops", "message": "it broke"}
    }


@dataclasses.dataclass
class Box:
    w: int
    h: int = 1


class Shapes(zmesh.Actor):
    @zmesh.endpoint
    async def area(self, box: Box, *, scale: float = 1.0) -> float:
        return box.w * box.h * scale

    @zmesh.endpoint
    async def total(self, *xs: int, **named: str) -> int:
        return sum(xs)

    @zmesh.endpoint
    async def count(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i


def _binder(name: str) -> Binder:
    infos = signatures.sign(endpoints_of(Shapes), signatures.pack(Shapes))
    return Binder("shapes", infos[name])


def test_arguments_are_bound_and_built_from_their_hints() -> None:
    args, kwargs = _binder("area").bind([{"w": 2, "h": 3}], {"scale": 2})
    assert args == (Box(2, 3),) and kwargs == {"scale": 2.0}
    assert _binder("area").bind([], {"box": {"w": 2}}) == ((Box(2, 1),), {})
    assert _binder("total").bind([1, 2], {"a": "x"}) == ((1, 2), {"a": "x"})


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "why"),
    [
        ("area", [], {}, "missing a required argument: 'box'"),
        ("area", [{"w": "2"}], {}, "Expected `int`, got `str` - at `$.w`"),
        ("area", [{"w": 1}, 2.0], {}, "too many positional arguments"),
        ("area", [{"w": 1}], {"zoom": 2}, "unexpected keyword argument 'zoom'"),
        ("total", [1, "2"], {}, "argument 'xs': Expected `int`, got `str`"),
        ("total", [], {"a": 1}, "argument 'a': Expected `str`, got `int`"),
        ("count", [True], {}, "Expected `int`, got `bool`"),
    ],
)
def test_arguments_that_do_not_fit_raise_endpoint_error(
    name: str, args: list[object], kwargs: dict[str, object], why: str
) -> None:
    with pytest.raises(EndpointError, match=r"arguments do not fit shapes\.") as info:
        _binder(name).bind(args, kwargs)
    assert why in str(info.value)


def test_an_endpoint_without_a_signature_takes_anything() -> None:
    binder = Binder("shapes", endpoints_of(Shapes)["area"])  # nothing packed
    assert binder.signature is None
    assert binder.bind(["anything"], {"at": "all"}) == (("anything",), {"at": "all"})
    assert signatures.unpack(b"not a pickle") is None


def test_schemas_come_from_the_hints() -> None:
    found = Schemas()
    area = found.endpoint(_binder("area"))
    assert area["params"][0] == {
        "name": "box", "kind": "positional_or_keyword", "required": True,
        "schema": {"$ref": "#/$defs/Box"},
    }  # fmt: skip
    assert area["params"][1]["kind"] == "keyword" and not area["params"][1]["required"]
    assert area["returns"] == {"type": "number"}
    assert found.defs["Box"]["required"] == ["w"]
    count = found.endpoint(_binder("count"))
    assert count["stream"] and count["returns"] == {"type": "integer"}  # one item's


def test_a_missing_token_file_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "token"
    token = tokens.read_or_create(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert tokens.read_or_create(str(path)) == token  # read back, not made again
    assert tokens.authorized(f"Bearer {token}".encode(), token)
    assert tokens.authorized(f"bearer {token}".encode(), token)
    assert not tokens.authorized(b"Bearer nope", token)
    assert not tokens.authorized(token.encode(), token)
    assert not tokens.authorized(None, token)


def test_a_token_file_others_may_read_or_an_empty_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("t\n")
    path.chmod(0o640)
    with pytest.raises(SecurityError, match="open to other users"):
        tokens.read_or_create(str(path))
    path.chmod(0o600)
    path.write_text("\n")
    with pytest.raises(SecurityError, match="empty"):
        tokens.read_or_create(str(path))
    with pytest.raises(SecurityError, match="cannot create"):
        tokens.read_or_create(str(tmp_path / "no" / "such" / "dir" / "token"))


@pytest.mark.parametrize(
    ("bind", "parsed"),
    [
        ("127.0.0.1:8000", ("127.0.0.1", 8000)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:9000", ("::1", 9000)),
        ("0.0.0.0", ("0.0.0.0", 0)),
    ],
)
def test_bind_addresses(bind: str, parsed: tuple[str, int]) -> None:
    assert server.parse_bind(bind) == parsed


@pytest.mark.parametrize("bind", ["", ":80", "host:http", "host:70000"])
def test_bad_bind_addresses(bind: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        server.parse_bind(bind)


def test_loopback() -> None:
    assert server.is_loopback("127.0.0.1") and server.is_loopback("::1")
    assert server.is_loopback("localhost")
    assert not server.is_loopback("0.0.0.0") and not server.is_loopback("example.org")
