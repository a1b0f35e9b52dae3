"""A hostile local user's ZeroMQ client, in the standard library only.

Run as another uid (``runuser -u nobody -- python3 zmtp_attacker.py PLAN``),
from a world-readable directory: it must not need anything the victim's
files could give it. ``PLAN`` is a JSON file of targets::

    [{"name": "control", "addr": "tcp://127.0.0.1:5555" | "ipc:///path",
      "type": "DEALER" | "SUB", "frames": ["<hex>", ...]}, ...]

For each target it speaks ZMTP 3.0 with the NULL mechanism (what a keyless
zmesh socket accepts), sends the frames as one message (a SUB subscribes to
everything instead), waits a moment for anything back, and prints one JSON
line: ``{"name": ..., "result": "refused" | "closed" | "sent" | "answered", ...}``.
"""

from __future__ import annotations

import json
import socket
import struct
import sys


def _connect(addr: str) -> socket.socket:
    if addr.startswith("ipc://"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2.0)
        s.connect(addr[len("ipc://") :])
        return s
    host, port = addr[len("tcp://") :].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=2.0)


def _recv_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed by the peer")
        data += chunk
    return data


def _frame(body: bytes, more: bool = False, command: bool = False) -> bytes:
    flags = (0x01 if more else 0) | (0x04 if command else 0)
    if len(body) > 255:
        return struct.pack(">BQ", flags | 0x02, len(body)) + body
    return struct.pack(">BB", flags, len(body)) + body


def _read_frame(s: socket.socket) -> tuple[int, bytes]:
    flags = _recv_exact(s, 1)[0]
    size = struct.unpack(">Q", _recv_exact(s, 8))[0] if flags & 0x02 else _recv_exact(s, 1)[0]
    return flags, _recv_exact(s, size)


def _handshake(s: socket.socket, sock_type: str) -> None:
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0")
    s.sendall(greeting + b"\0" + b"\0" * 31)
    peer = _recv_exact(s, 64)
    if peer[0] != 0xFF or peer[9] != 0x7F:
        raise ConnectionError("not a ZMTP peer")
    prop = b"\x0bSocket-Type" + struct.pack(">I", len(sock_type)) + sock_type.encode()
    s.sendall(_frame(b"\x05READY" + prop, command=True))
    flags, body = _read_frame(s)  # the peer's READY (or ERROR) command
    if not flags & 0x04 or not body.startswith(b"\x05READY"):
        raise ConnectionError(f"handshake refused: {body[:40]!r}")


def attack(target: dict[str, object]) -> dict[str, object]:
    name = target["name"]
    try:
        s = _connect(str(target["addr"]))
    except OSError as exc:
        return {"name": name, "result": "refused", "error": f"{type(exc).__name__}: {exc}"}
    try:
        _handshake(s, str(target["type"]))
        if target["type"] == "SUB":
            s.sendall(_frame(b"\x01"))  # subscribe to everything (ZMTP 3.0)
        else:
            frames = [bytes.fromhex(str(h)) for h in target["frames"]]  # type: ignore[attr-defined]
            for i, f in enumerate(frames):
                s.sendall(_frame(f, more=i < len(frames) - 1))
        s.settimeout(3.0)
        try:
            _, body = _read_frame(s)
        except TimeoutError:
            return {"name": name, "result": "sent"}
        return {"name": name, "result": "answered", "reply": body[:200].hex()}
    except (OSError, ConnectionError) as exc:
        return {"name": name, "result": "closed", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        s.close()


def main() -> None:
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    for target in plan:
        print(json.dumps(attack(target)), flush=True)


if __name__ == "__main__":
    main()
