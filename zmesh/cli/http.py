"""``zmesh http``: serve detached services over HTTP/JSON and Server-Sent Events.

  POST /v1/SERVICE/ENDPOINT   {"args": [...], "kwargs": {...}} -> {"result": ...}
                              a generator endpoint streams events with
                              'Accept: text/event-stream'
  GET  /v1/services           services, endpoints and their JSON schemas
  GET  /openapi.json          the same, as an OpenAPI document
  GET  /healthz               no token needed

Every other request needs 'Authorization: Bearer TOKEN', the token in
--token-file (made, mode 0600, with a random token if missing). Headers:
X-Zmesh-Session: ID keeps a client's calls on one replica; X-Zmesh-Timeout:
SECONDS bounds one request. Errors are JSON {"error": {"type", "message"}}:
401 no token, 404 unknown service or endpoint, 422 arguments that do not
fit, 500 the endpoint raised, 503 (with Retry-After) no healthy replica or
overloaded, 504 timed out.

Needs uvicorn: pip install 'zmesh[http]'.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import zmesh
from zmesh._errors import SecurityError
from zmesh._shared import paths
from zmesh.cli._common import agent_addresses, agent_args, doc_help
from zmesh.http import app, server, tokens

DEFAULT_BIND = "127.0.0.1:8000"


def configure_http(parser: argparse.ArgumentParser) -> None:
    """``zmesh http [SERVICE ...] [--bind HOST:PORT] [--token-file PATH] [--json]``."""
    doc_help(parser, __doc__)
    parser.add_argument(
        "services", nargs="*", metavar="SERVICE",
        help="serve only these detached services (default: every one of yours)",
    )  # fmt: skip
    parser.add_argument(
        "--bind", default=DEFAULT_BIND,
        help=f"HOST:PORT to listen on (default {DEFAULT_BIND}; port 0 picks a free one)",
    )  # fmt: skip
    parser.add_argument(
        "--token-file", default=None,
        help="the bearer token's file, made (0600) with a random token if missing "
        "(default: http.token in zmesh's private runtime directory)",
    )  # fmt: skip
    parser.add_argument(
        "--no-token", action="store_true",
        help="serve without a token: anyone who reaches the port may call every service",
    )  # fmt: skip
    parser.add_argument(
        "--insecure", action="store_true",
        help="allow --no-token on an address other than loopback",
    )  # fmt: skip
    parser.add_argument(
        "--request-timeout", type=float, default=None, metavar="SECONDS",
        help="a request's timeout (default: each service's request_timeout)",
    )  # fmt: skip
    parser.add_argument(
        "--json", action="store_true",
        help='print one ready line {"url": ..., "token_file": ...} as JSON',
    )  # fmt: skip
    agent_args(parser)


def run_http(args: argparse.Namespace) -> int:
    """Serve until Ctrl+C or SIGTERM (exit 0)."""
    try:
        host, port = server.parse_bind(args.bind)
    except ValueError as exc:
        print(f"zmesh http: error: {exc}", file=sys.stderr)
        return 2
    if args.no_token and not server.is_loopback(host) and not args.insecure:
        raise SecurityError(
            f"--no-token on {host}, which other machines may reach, would let anyone call "
            "every service: keep the token, bind 127.0.0.1, or say --insecure"
        )
    agents = agent_addresses(args)  # a bad address ends here, before a token file is made
    token_file = None
    token = None
    if not args.no_token:
        token_file = os.path.abspath(
            args.token_file or os.path.join(paths.runtime_dir(), "http.token")
        )
        token = tokens.read_or_create(token_file)
    zmesh.connect(agents, forward_logs=False)
    gateway = app(args.services or None, token=token, timeout=args.request_timeout)

    def ready(url: str) -> None:
        if args.json:
            print(json.dumps({"url": url, "token_file": token_file}), flush=True)
        else:
            where = f"token in {token_file}" if token_file else "no token: anyone may call"
            print(f"zmesh http: serving on {url} ({where}); Ctrl+C stops", flush=True)
        if args.no_token:
            print("zmesh http: warning: serving without a token", file=sys.stderr)

    try:
        server.serve(gateway, host, port, ready)
    finally:
        zmesh.shutdown()
    return 0
