"""``zmesh keygen``: CURVE keys for agents, and for each client that may use them::

    zmesh keygen DIR                                  the agents' keys (a cluster's)
    zmesh keygen --client DIR2 --authorize-in DIR     a client's keys, admitted by DIR
    zmesh keygen --client DIR2 --agents-key FILE      a client's keys, for agents elsewhere

An agents' directory holds the agents' keypair and ``authorized/``, the
public keys allowed to connect. A client's directory holds the client's own
keypair and ``agents.key``, the agents' public key: like a Jupyter connection
file, it says whom to trust and proves who we are, and it never holds the
agents' secret.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import sys

from zmesh._errors import SecurityError
from zmesh._wire.security import PUBLIC_FILE, authorize, keygen, keygen_client, read_public
from zmesh.cli._common import doc_help


def configure_keygen(parser: argparse.ArgumentParser) -> None:
    """``zmesh keygen``'s options."""
    doc_help(parser, __doc__)
    parser.add_argument("dir", help="the directory to write (created if missing)")
    parser.add_argument("--client", action="store_true", help="a client's keypair")
    parser.add_argument(
        "--authorize-in",
        metavar="AGENTS_DIR",
        help="with --client: the agents' directory on this machine; the new key is "
        "added to its authorized/ and its public key becomes our agents.key",
    )
    parser.add_argument(
        "--agents-key",
        metavar="FILE",
        help="with --client: the agents' public key (their zmesh.key or agents.key)",
    )
    parser.add_argument(
        "--name",
        default=f"{getpass.getuser()}@{socket.gethostname()}",
        help="with --authorize-in: the key's file name in authorized/ (default: user@host)",
    )
    parser.add_argument(
        "--json", action="store_true", help='print {"dir", "public", "kind"} instead of prose'
    )


def run_keygen(args: argparse.Namespace) -> int:
    """Write CURVE keys (secret keys mode 0600, directories 0700)."""

    def error(text: str) -> int:
        print(f"zmesh keygen: error: {text}", file=sys.stderr)
        return 2

    def say(*lines: str) -> None:
        if not args.json:
            print("\n".join(lines))

    if os.path.exists(os.path.join(args.dir, "zmesh.key_secret")):
        return error(f"{args.dir} already holds keys; remove them first to make new ones")
    if not args.client:
        if args.authorize_in or args.agents_key:
            return error("--authorize-in and --agents-key go with --client")
        try:
            keys = keygen(args.dir)
        except SecurityError as exc:
            return error(str(exc))
        say(
            f"wrote the agents' keys to {keys.dir}: zmesh.key (public), zmesh.key_secret (0600)",
            f"clients that may connect: the public keys in {keys.authorized}/",
            f"agents: zmesh agent --bind tcp://ADDR:PORT --keys {keys.dir}",
            f"a client: zmesh keygen --client DIR2 --authorize-in {keys.dir}",
        )
        _json(args, keys.dir, "agents")
        return 0
    if bool(args.authorize_in) == bool(args.agents_key):
        return error("--client needs one of --authorize-in AGENTS_DIR or --agents-key FILE")
    try:
        agents = read_public(args.authorize_in or args.agents_key)
        keys = keygen_client(args.dir, agents)
        if args.authorize_in:
            where = authorize(args.authorize_in, keys.public, args.name)
            say(f"wrote a client's keys to {keys.dir}; authorised as {where}")
        else:
            say(
                f"wrote a client's keys to {keys.dir}",
                f"authorise it: copy {os.path.join(keys.dir, PUBLIC_FILE)} into the agents' "
                "authorized/ directory (any name ending in .key)",
            )
    except SecurityError as exc:
        return error(str(exc))
    say(f"use it: ZMESH_KEYS={keys.dir} (or zmesh.connect([...], keys='{keys.dir}'))")
    _json(args, keys.dir, "client")
    return 0


def _json(args: argparse.Namespace, directory: str, kind: str) -> None:
    if args.json:
        public = os.path.join(directory, PUBLIC_FILE)
        print(json.dumps({"dir": os.path.abspath(directory), "public": public, "kind": kind}))
