"""``zmesh keygen DIR``: a CURVE keypair for agents, procs and clients."""

from __future__ import annotations

import argparse
import os

from zmesh._security import keygen


def main(argv: list[str] | None = None) -> None:
    """Write a CURVE keypair into DIR (secret key mode 0600) and authorise it."""
    parser = argparse.ArgumentParser(prog="zmesh keygen", description=main.__doc__)
    parser.add_argument("dir", help="the directory to write (created if missing)")
    args = parser.parse_args(argv)
    if os.path.exists(os.path.join(args.dir, "zmesh.key_secret")):
        parser.error(f"{args.dir} already holds keys; remove them first to make new ones")
    keys = keygen(args.dir)
    print(f"wrote {keys.dir}/zmesh.key (public) and zmesh.key_secret (0600)")
    print(f"authorised clients: the public keys in {keys.authorized}/")
    print(f"agents: zmesh agent --bind tcp://ADDR:PORT --keys {keys.dir}")
    print(f"clients: ZMESH_KEYS={keys.dir} (or zmesh.connect([...], keys='{keys.dir}'))")
