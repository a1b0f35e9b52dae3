"""``zmesh http``: detached services over HTTP/JSON and SSE, through a real
agent, a service whose creator has exited, and the standard library's client."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import stat
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _helpers import connected, run_python, wait_for
from integration._gateway import (
    Gateway,
    child_env,
    services_behind_gateway,
    start_gateway,
    stop_gateway,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with services_behind_gateway(tmp_path_factory.mktemp("http")) as gateway:
        yield gateway


def _events(resp: http.client.HTTPResponse) -> Iterator[tuple[str, str]]:
    """``(event, data)`` of each Server-Sent Event, as they come."""
    kind, data = "message", ""
    while True:
        line = resp.readline().decode()
        if not line:
            return
        line = line.rstrip("\n")
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
        elif line == "":
            yield kind, data
            kind, data = "message", ""


def _stream(gw: Gateway, endpoint: str, *args: object) -> list[tuple[str, str]]:
    c = gw.connection()
    try:
        c.request("POST", f"/v1/model/{endpoint}", body=json.dumps({"args": list(args)}),
                  headers={"Authorization": f"Bearer {gw.token}",
                           "Accept": "text/event-stream"})  # fmt: skip
        resp = c.getresponse()
        assert resp.status == 200, resp.read()
        assert resp.getheader("content-type") == "text/event-stream"
        return list(_events(resp))
    finally:
        c.close()


# ---------------------------------------------------------------- auth


def test_healthz_needs_no_token_and_everything_else_does(gw: Gateway) -> None:
    assert gw.request("GET", "/healthz", token=None)[:3:2] == (200, {"ok": True})
    status, headers, doc = gw.request("POST", "/v1/model/add", {"args": [1]}, token=None)
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert doc["error"]["type"] == "Unauthorized"
    assert gw.request("POST", "/v1/model/add", {"args": [1]}, token="wrong")[0] == 401
    assert gw.request("GET", "/v1/services", token=None)[0] == 401
    assert gw.request("POST", "/v1/model/add", {"args": [1]})[0] == 200


def test_the_token_file_is_made_private(gw: Gateway) -> None:
    mode = stat.S_IMODE(os.stat(gw.token_file).st_mode)
    assert mode == 0o600
    assert len(gw.token) >= 32


# ---------------------------------------------------------------- calls


def test_a_call_returns_its_result_as_json(gw: Gateway) -> None:
    assert gw.call("model", "add", 2, 3) == 5
    assert gw.call("model", "add", 2) == 3  # the default
    assert gw.call("model", "add", a=2, b=5) == 7
    assert gw.call("model", "area", {"w": 2, "h": 3}, scale=0.5) == 3.0  # a dataclass, built
    status, _, doc = gw.request("POST", "/v1/model/pid", b"")  # no body: no arguments
    assert status == 200 and isinstance(doc["result"], int)


def test_keep_alive_serves_many_requests_on_one_connection(gw: Gateway) -> None:
    conn = gw.connection()
    try:
        for i in range(50):
            assert gw.request("POST", "/v1/model/add", {"args": [i, i]}, conn=conn)[2] == {
                "result": 2 * i
            }
    finally:
        conn.close()


def test_keep_alive_requests_do_not_wait_for_delayed_acks(gw: Gateway) -> None:
    # Headers and body are two writes: without TCP_NODELAY each request on a
    # kept-alive connection waits ~40 ms for the client's delayed ACK.
    conn = gw.connection()
    samples = []
    try:
        for _ in range(21):
            t = time.perf_counter()
            assert gw.request("GET", "/healthz", conn=conn)[0] == 200
            samples.append(time.perf_counter() - t)
    finally:
        conn.close()
    assert statistics.median(samples) < 0.025, samples


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"args": ["two"]}, "argument 'a': Expected `int`, got `str`"),
        ({"args": []}, "missing a required argument: 'a'"),
        ({"args": [1, 2, 3]}, "too many positional arguments"),
        ({"kwargs": {"a": 1, "c": 2}}, "unexpected keyword argument 'c'"),
        ({"args": [1], "extra": 1}, "unknown keys: extra"),
        ({"args": {"a": 1}}, '{"args": [...], "kwargs": {...}}'),
        (b"{not json", "not a JSON object"),
        (b"[1, 2]", "not a JSON object"),
    ],
)
def test_arguments_that_do_not_fit_are_422(gw: Gateway, body: object, why: str) -> None:
    status, _, doc = gw.request("POST", "/v1/model/add", body)
    assert status == 422, doc
    assert doc["error"]["type"] == "EndpointError"
    assert why in doc["error"]["message"]


def test_a_nested_type_is_checked_too(gw: Gateway) -> None:
    status, _, doc = gw.request("POST", "/v1/model/area", {"args": [{"w": 2}]})
    assert status == 422 and "missing required field `h`" in doc["error"]["message"], doc


def test_unknown_services_and_endpoints_are_404(gw: Gateway) -> None:
    status, _, doc = gw.request("POST", "/v1/nope/add", {})
    assert status == 404 and doc["error"]["type"] == "NameNotFoundError"
    assert "model" in doc["error"]["message"]  # the names there are listed
    for bad in ("/v1/no%20such!/add", "/v1//add"):  # no valid name
        status, _, doc = gw.request("POST", bad, {})
        assert status == 404 and doc["error"]["type"] == "NameNotFoundError", doc
    status, _, doc = gw.request("POST", "/v1/plain/nap", {"args": [0]})
    assert status == 404 and doc["error"]["type"] == "HandleTypeError"  # a detached mesh
    status, _, doc = gw.request("POST", "/v1/model/nope", {})
    assert status == 404 and doc["error"]["type"] == "EndpointError"
    assert "add" in doc["error"]["message"]  # the endpoints are listed
    assert gw.request("GET", "/v2/anything")[0] == 404
    assert gw.request("GET", "/v1/model/add")[0] == 405


def test_an_endpoint_that_raises_is_500_with_the_remote_type(gw: Gateway) -> None:
    status, _, doc = gw.request("POST", "/v1/model/fail", {"args": ["no good"]})
    assert status == 500
    assert doc == {"error": {"type": "ValueError", "message": "no good"}}
    assert gw.call("model", "add", 1, 1) == 2  # the replica serves on


def test_a_result_json_cannot_carry_is_500_naming_its_type(gw: Gateway) -> None:
    status, _, doc = gw.request("POST", "/v1/model/opaque", {})
    assert status == 500 and doc["error"]["type"] == "EncodeError"
    assert "range" in doc["error"]["message"]


def test_a_request_past_its_timeout_is_504(gw: Gateway) -> None:
    status, _, doc = gw.request("POST", "/v1/model/nap", {"args": [3]}, {"X-Zmesh-Timeout": "0.3"})
    assert status == 504 and doc["error"]["type"] == "CallTimeoutError", doc
    bad = gw.request("POST", "/v1/model/nap", {"args": [0]}, {"X-Zmesh-Timeout": "soon"})
    assert bad[0] == 422


def test_overload_is_503_with_retry_after(gw: Gateway) -> None:
    # tiny: one replica, one request at a time, no queue.
    done: list[int] = []

    def hold() -> None:  # until it holds the replica (a probe below may hold it a moment)
        deadline = time.monotonic() + 20
        while not done or (done[-1] == 503 and time.monotonic() < deadline):
            done.append(gw.request("POST", "/v1/tiny/nap", {"args": [3]})[0])

    busy = threading.Thread(target=hold)
    busy.start()
    try:

        def refused() -> tuple[int, dict[str, str], dict[str, Any]] | None:
            got = gw.request("POST", "/v1/tiny/nap", {"args": [0]})
            return got if got[0] == 503 else None  # until the first request holds the replica

        _, headers, doc = wait_for(refused, 10, "a 503 while the replica is full")
        assert headers["retry-after"] == "1"
        assert doc["error"]["type"] == "ServiceOverloadedError"
    finally:
        busy.join(30)
    assert done[-1] == 200 and set(done) <= {200, 503}, done


def test_a_session_keeps_calls_on_one_replica(gw: Gateway) -> None:
    pids = {gw.call("model", "pid") for _ in range(6)}
    assert len(pids) == 2  # round robin over both replicas
    for sid in ("alice", "bob"):
        one = {
            gw.request("POST", "/v1/model/pid", {}, {"X-Zmesh-Session": sid})[2]["result"]
            for _ in range(6)
        }
        assert len(one) == 1, one


# ---------------------------------------------------------------- listing


def test_services_are_listed_with_json_schemas(gw: Gateway) -> None:
    status, _, doc = gw.request("GET", "/v1/services")
    assert status == 200
    by_name = {s["name"]: s for s in doc["services"]}
    assert set(by_name) == {"model", "tiny"}  # not "plain", a detached mesh
    model = by_name["model"]
    assert model["class"] == "Model" and model["replicas"] == 2
    eps = {e["name"]: e for e in model["endpoints"]}
    assert eps["add"]["params"] == [
        {"name": "a", "kind": "positional_or_keyword", "required": True,
         "schema": {"type": "integer"}},
        {"name": "b", "kind": "positional_or_keyword", "required": False,
         "schema": {"type": "integer"}},
    ]  # fmt: skip
    assert eps["add"]["returns"] == {"type": "integer"}
    assert eps["tokens"]["stream"] is True and eps["tokens"]["returns"] == {"type": "string"}
    assert eps["area"]["params"][0]["schema"] == {"$ref": "#/$defs/Shape"}
    assert doc["$defs"]["Shape"]["required"] == ["w", "h"]


def test_openapi_document(gw: Gateway) -> None:
    status, _, doc = gw.request("GET", "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    add = doc["paths"]["/v1/model/add"]["post"]
    assert {"200", "401", "404", "422", "500", "503", "504"} <= set(add["responses"])
    assert "Shape" in doc["components"]["schemas"]
    assert (
        "text/event-stream"
        in doc["paths"]["/v1/model/tokens"]["post"]["responses"]["200"]["content"]
    )


# ---------------------------------------------------------------- streams


def test_a_generator_endpoint_streams_events_then_an_end(gw: Gateway) -> None:
    events = _stream(gw, "tokens", "hi", 5)
    assert events == [
        *(("message", json.dumps(f"hi-{i}")) for i in range(5)),
        ("end", '{"items": 5}'),
    ]
    assert _stream(gw, "tokens", "none", 0) == [("end", '{"items": 0}')]


def test_a_stream_error_after_items_ends_with_an_error_event(gw: Gateway) -> None:
    events = _stream(gw, "broken", 3)
    assert events[:3] == [("message", "0"), ("message", "1"), ("message", "2")]
    kind, data = events[3]
    assert kind == "error" and len(events) == 4
    assert json.loads(data) == {"error": {"type": "RuntimeError", "message": "broke after 3"}}


def test_a_stream_error_before_items_is_a_status(gw: Gateway) -> None:
    status, _, doc = gw.request(
        "POST", "/v1/model/tokens", {"args": ["x"]}, {"Accept": "text/event-stream"}
    )
    assert status == 422 and "'n'" in doc["error"]["message"]
    status, _, doc = gw.request("POST", "/v1/model/tokens", {"args": ["x", 2]})
    assert status == 406 and "text/event-stream" in doc["error"]["message"]


# ---------------------------------------------------------------- the command


def test_help_is_clear() -> None:
    done = run_python(["-m", "zmesh", "http", "--help"], 60)
    assert done.returncode == 0
    for words in ("--bind", "--token-file", "X-Zmesh-Session", "Retry-After", "zmesh[http]"):
        assert words in done.stdout


def test_no_token_beyond_loopback_is_refused_unless_insecure(tmp_path: Path) -> None:
    done = run_python(
        ["-m", "zmesh", "http", "--no-token", "--bind", "0.0.0.0:0", "--agents", "ipc:///nowhere"],
        60,
    )
    assert done.returncode == 2
    assert "--insecure" in done.stderr and "Traceback" not in done.stderr


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    token.chmod(0o644)
    done = run_python(
        ["-m", "zmesh", "http", "--token-file", str(token), "--agents", "ipc:///nowhere"], 60
    )
    assert done.returncode == 2
    assert "open to other users" in done.stderr and "Traceback" not in done.stderr


def test_ctrl_c_stops_it_cleanly_with_a_stream_open(gw: Gateway, tmp_path: Path) -> None:
    other = start_gateway(gw.agent, tmp_path, "model")
    marker = tmp_path / "closed"
    conn = other.connection()
    try:
        assert other.call("model", "add", 1, 1) == 2
        # It serves only what it was told to.
        assert other.request("POST", "/v1/tiny/nap", {"args": [0]})[0] == 404
        conn.request("POST", "/v1/model/forever", body=json.dumps({"args": [str(marker)]}),
                     headers={"Authorization": f"Bearer {other.token}",
                              "Accept": "text/event-stream"})  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
    finally:
        code = stop_gateway(other, signal.SIGINT)
        conn.close()
    assert code == 0
    wait_for(marker.exists, 20, "the open stream closed in the replica")


def test_import_zmesh_loads_no_web_framework() -> None:
    code = (
        "import sys, zmesh, zmesh.http; "
        "print(sorted(m for m in ('uvicorn', 'starlette', 'h11') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr


def test_the_gateway_mounts_in_a_starlette_app(gw: Gateway) -> None:
    uvicorn = pytest.importorskip("uvicorn")
    starlette = pytest.importorskip("starlette.applications")
    routing = pytest.importorskip("starlette.routing")
    import urllib.error
    import urllib.request

    import zmesh.http

    def home(request: object) -> object:
        from starlette.responses import PlainTextResponse

        return PlainTextResponse("home")

    with connected([gw.agent.control]):
        gateway = zmesh.http.app(["model"], token="t0ken", max_body=1000, max_sessions=3)
        site = starlette.Starlette(
            routes=[routing.Route("/", home), routing.Mount("/zmesh", app=gateway)]
        )
        sock = socket.create_server(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(site, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
        thread.start()
        try:
            wait_for(lambda: server.started, 30, "uvicorn started")
            base = f"http://127.0.0.1:{sock.getsockname()[1]}"

            def post(
                path: str, body: dict[str, object], token: str, session: str = ""
            ) -> tuple[int, object]:
                headers = {"Authorization": f"Bearer {token}"}
                if session:
                    headers["X-Zmesh-Session"] = session
                req = urllib.request.Request(
                    base + path, data=json.dumps(body).encode(), method="POST", headers=headers
                )
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        return resp.status, json.loads(resp.read())
                except urllib.error.HTTPError as err:
                    return err.code, json.loads(err.read())

            assert post("/zmesh/v1/model/add", {"args": [20, 22]}, "t0ken") == (200, {"result": 42})
            assert post("/zmesh/v1/model/add", {"args": [1]}, "nope")[0] == 401
            assert post("/zmesh/v1/tiny/nap", {"args": [0]}, "t0ken")[0] == 404
            status, doc = post("/zmesh/v1/model/add", {"args": ["x" * 2000]}, "t0ken")
            assert status == 413 and doc["error"]["type"] == "BodyTooLarge"  # type: ignore[index]
            with urllib.request.urlopen(base + "/", timeout=30) as resp:
                assert resp.read() == b"home"
            # Sessions clients invent are kept to a bound (the least recently used go).
            for i in range(5):
                assert post("/zmesh/v1/model/add", {"args": [i]}, "t0ken", f"s{i}")[0] == 200
            assert gateway.catalog.statistics() == {"services": 1, "sessions": 3}
        finally:
            server.should_exit = True
            thread.join(30)
            sock.close()
