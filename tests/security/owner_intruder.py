"""Client B of ``test_owner_acts.py``: it acts on client A's handles, and under A's id.

``python owner_intruder.py HANDLES FIRST SECOND``: ``HANDLES`` is a hex pickle
of A's handles (``procs`` alone: squat A's owner id; with ``owned``,
``guest`` and ``svc``: act through the handles and on the procs' sockets),
``FIRST`` the agent A uses, ``SECOND`` one A has not used yet. Prints one
JSON line: what each attempt got. Its keys (on TCP) are its own: ``ZMESH_KEYS``.
With ``{"service": NAME}``: forge that detached service's replica table on
``FIRST`` (every replica given up), over and over until killed.
"""

from __future__ import annotations

import json
import pickle
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

import zmesh
from zmesh._client.control import local as _local
from zmesh._wire import messages as w
from zmesh._wire import pickling
from zmesh._wire import security as _security
from zmesh._wire.codec import Codec


class Intruder(zmesh.Actor):
    @zmesh.endpoint
    def hi(self) -> str:
        return "in"


def error(fn: Callable[[], Any]) -> str:
    """``done``, or the zmesh error ``fn`` raised."""
    try:
        fn()
        return "done"
    except zmesh.ZmeshError as exc:
        return f"{type(exc).__name__}: {exc}"


def ask(addr: str, msg: Any, inbox: Any, replies: Any, before: list[Any] = []) -> Any:  # noqa: B006
    """Send ``msg`` (after the one-way ``before``) straight to a socket, as a
    modified client would; its answer."""
    s = _security.secure_client(zmq.Context.instance().socket(zmq.DEALER), None, addr)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    for m in [*before, msg]:
        s.send_multipart(Codec(inbox).encode(m))
    reply = Codec(replies).decode(s.recv_multipart()) if s.poll(15_000) else None
    s.close()
    return reply


def keyed(proof: str) -> dict[str, Any]:
    """A key field for a message (a wire without the field: the message carries none)."""
    return {"proof": proof} if "proof" in w.StopActor.__struct_fields__ else {}


def squat(out: dict[str, Any], procs: Any, first: str, second: str) -> None:
    """A's owner id is public: read it, then act under it with our own secret."""
    (state,) = ask(first, w.GetState(1, procs.name), w.AGENT_INBOX, w.AGENT_REPLIES).meshes
    a = state.owner
    spec = w.ProcSpec(owner=a, ranks=[0], dims={"procs": 1})
    mine = secrets.token_hex(16)
    ours = w.ProcSpec(owner=_local.owner_id(), ranks=[0], dims={"procs": 1})
    for key, addr, msg in (
        ("squat", second, w.CreateOrUpdate(2, "squat", spec, secret=mine)),
        ("squat_first", first, w.CreateOrUpdate(3, "squat", spec, secret=mine)),
        ("raw_stop_mesh", first, w.Stop(4, procs.name, secret=mine)),
        ("owner_gone", first, w.OwnerGone(a, secret=mine)),
        # Under our own id: a mesh by the name of A's.
        ("same_name", first, w.CreateOrUpdate(5, procs.name, ours, _local.owner_secret())),
    ):
        ack = ask(addr, msg, w.AGENT_INBOX, w.AGENT_REPLIES)
        out[key] = "no reply" if ack is None else ("ok" if ack.ok else ack.error)
    out["a"] = a
    # A proc's hello, forged: it would point A's calls to rank 0 at our address.
    rank = state.ranks[0]
    evil = "ipc:///nonexistent/evil"
    forged = w.ProcHello(procs.name, rank.rank, rank.generation, evil, rank.pid, **keyed("guess"))
    get = w.GetState(6, procs.name)  # on the same connection: after the hello
    (after,) = ask(first, get, w.AGENT_INBOX, w.AGENT_REPLIES, before=[forged]).meshes
    out["addr_before"], out["addr_after"] = rank.addr, after.ranks[0].addr


def act(out: dict[str, Any], given: dict[str, Any]) -> None:
    """Through A's handles, and straight to the sockets of A's procs."""
    owned, guest, procs, svc = given["owned"], given["guest"], given["procs"], given["svc"]
    out["call"] = owned.ping.call().get(timeout=20).values()  # a capability to call: allowed
    out["stop_owned"] = error(lambda: owned.stop().get(timeout=20))
    out["stop_guest"] = error(lambda: guest.stop().get(timeout=20))
    out["spawn"] = error(lambda: procs.spawn("intruder", Intruder).get(timeout=20))
    out["stop_replica"] = error(lambda: svc.replica(0).stop().get(timeout=20))
    proc = procs._refs[0].addr
    for key, proof in (("raw_stop", "guess"), ("raw_stop_none", "")):
        f = ask(proc, w.StopActor(7, guest.actor, **keyed(proof)), w.PROC_INBOX, w.CLIENT_INBOX)
        out[key] = f"{f.kind}: {f.message}" if isinstance(f, w.Failure) else repr(f)
    blob, _ = pickling.dumps(Intruder, lambda _: True)  # by value, as a client sends it
    payload, _ = Codec.pack((), {})
    spawn = w.SpawnActor(8, "raw", blob, payload, procs.name, procs.sizes, 0, **keyed("guess"))
    f = ask(proc, spawn, w.PROC_INBOX, w.CLIENT_INBOX)
    out["raw_spawn"] = f"{f.kind}: {f.message}" if isinstance(f, w.Failure) else repr(f)


def forge_table(name: str, agent: str) -> None:
    """Report A's service's table as if from its orchestrator, every replica given up."""
    from zmesh._service.client import decode_table, encode_table

    said = False
    while True:
        stats = ask(agent, w.GetStats(1), w.AGENT_INBOX, w.AGENT_REPLIES).stats
        for summary in stats.services:
            if summary.name == name and summary.table:
                rows = decode_table(summary.table)
                rows = [msgspec.structs.replace(r, state="UNHEALTHY") for r in rows]
                forged = msgspec.structs.replace(summary, table=encode_table(rows))
                ask(agent, w.GetStats(2), w.AGENT_INBOX, w.AGENT_REPLIES,
                    before=[w.ServiceReport(forged)] * 20)  # fmt: skip
                if not said:
                    print("forging", flush=True)
                    said = True
        time.sleep(0.01)


if __name__ == "__main__":
    given = pickle.loads(bytes.fromhex(sys.argv[1]))
    out: dict[str, Any] = {}
    if "service" in given:
        forge_table(given["service"], sys.argv[2])
    if "svc" in given:
        act(out, given)
    else:
        squat(out, given["procs"], sys.argv[2], sys.argv[3])
    print(json.dumps(out), flush=True)
    zmesh.shutdown()
