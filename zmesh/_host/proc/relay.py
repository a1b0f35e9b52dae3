"""A proc as its host's relay: one tree fan-out message in, one message per local proc out.

A client's fan-out to a wide mesh sends one ``Relay`` per host to one proc
of the mesh there (``zmesh._client.calls.tree``). That proc sends the request in
it, unchanged (its envelope and buffer frames as the direct path would have
sent them), to each target, and gathers their answers into ``RelayReply``
messages (``zmesh._host.proc.relayback``): every answer that arrived in one turn
of the loop goes back as one message, so a dead or slow target does not
hold the others' answers. The
answers are not decoded here: each goes back as the bytes its proc sent
(``msgspec.Raw``), with its buffer frames, for the sender to decode. That
carries a fan-out to several actors per proc (a ``GroupCall`` in, one
``Gathered`` per proc out) as it carries a plain ``Call``.

Two levels: a *top* relay is also given relays of other hosts (``down``);
it sends each one a ``Relay`` of its targets (with no ``down``: no deeper)
and merges what comes back into its own answers, re-indexed.

Security. A relay accepts ``Relay`` on the proc's own ROUTER (the same CURVE
keys and ZAP allow-list as every call), and forwards the request only to
procs of its own mesh on its own host, as its agent knows them (rank,
generation and address, from ``GetState``); any peer allowed to send it a
``Relay`` may call those procs directly anyway. A target that is not such a
proc gets a ``Failure`` and nothing is sent to it. The one address a relay
sends to unchecked is a hop's relay (its agent knows no other host): what
it sends there is a ``Relay`` of this mesh, which a relay of another mesh
refuses and which checks its own targets the same way; and whoever may
reach a proc already runs code with the host's keys (``pickle.loads``), so
that gives no one a reach they did not have.

Order. Each sender gets its own connection to each target (a *link*), so
messages from one sender to one actor stay in the order the sender sent
them, whether they come through the relay or not: the client only sends a
message directly to a proc once the relay has acknowledged (``forwarded``)
the earlier ones, and a link acknowledges only after it has proved itself
connected (one round trip when it is made).

The relay's own proc is no link's target: its part is run in this process
(``zmesh._host.proc.relayown``), in its mailbox before the sender's next message
is read, its answer gathered with the others'.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from zmesh._client.control.agents import AgentClient
from zmesh._host.proc import relayown as _own
from zmesh._host.proc.relayback import Answers, Forward, failed
from zmesh._host.proc.relayfold import Fold, combine_of
from zmesh._wire import messages as w
from zmesh._wire.codec import BATCH_MARK, Codec
from zmesh._wire.security import secure_client
from zmesh._wire.zsock import AsyncSocket, configure

if TYPE_CHECKING:
    from zmesh._client.control.agents import AgentClient
    from zmesh._host.proc.procserver import ProcServer

log = logging.getLogger("zmesh.relay")

# The probe a new link sends first: a call of an actor no proc has, which
# every proc answers at once with a Failure, proving the link connected.
_PROBE_ACTOR = "\x00relay-probe"
# A link with nothing in flight, unused for this long (s), is closed when a
# new link is made. Senders come and go (each client, each reconnection is a
# new identity here), each link holds a socket and its fds, and a detached
# mesh's relays serve many scripts: without this their links pile up.
LINK_IDLE = float(os.environ.get("ZMESH_RELAY_LINK_IDLE", "10"))


class _Head(msgspec.Struct, array_like=True):
    """The first two fields of any message (a msgpack array ``[kind, id, ...]``)."""

    msg: str
    id: int


_HEAD = msgspec.msgpack.Decoder(_Head)
_RAWS = msgspec.msgpack.Decoder(list[msgspec.Raw])  # a batch, split into its envelopes
_REPLY = msgspec.msgpack.Decoder(w.RelayReply)


class Hop:
    """A ``Relay`` this relay sent on to a relay of another host."""

    __slots__ = ("acked", "fwd", "n", "offset", "remaining")

    def __init__(self, fwd: Forward, offset: int, n: int, oneway: bool) -> None:
        self.fwd = fwd
        self.n = n
        self.offset = offset  # where its targets' indexes start in ``fwd``'s
        self.remaining: set[int] = set() if oneway else set(range(n))
        self.acked = False


class Link:
    """One sender's DEALER to one local proc, and what waits for answers on it."""

    __slots__ = ("addr", "hops", "pending", "proven", "sock", "used", "waiting_proof")

    def __init__(self, addr: str, sock: AsyncSocket, now: float) -> None:
        self.addr = addr
        self.sock = sock
        self.used = now  # when a request last went on it (loop time)
        self.pending: dict[int, tuple[Forward, int]] = {}  # request id -> (forward, target index)
        self.hops: dict[int, Hop] = {}  # request id -> a Relay sent on (to another relay)
        self.proven = False
        self.waiting_proof: list[Forward] = []


class RelayServer:
    """The relay part of a ``ProcServer``, made on its first ``Relay``."""

    def __init__(self, server: ProcServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.links: dict[tuple[bytes, str], Link] = {}
        self.known: dict[int, tuple[int, str]] = {}  # rank -> (generation, addr), this host
        self._agent: AgentClient | None = None
        self._ids = itertools.count(1)
        self._held: deque[tuple[bytes, w.Relay, list[Any]]] = deque()  # while the agent is asked
        self._asking = False
        self.back = Answers(server, self.loop)  # the way back (zmesh._host.proc.relayback)
        self._reply_codec: Codec | None = None  # decodes answers to fold (reducing Relays)
        self.relayed = 0
        self.forwarded = 0

    # ------------------------------------------------------------ inbound

    def handle(self, ident: bytes, msg: w.Relay, frames: list[Any]) -> None:
        """A ``Relay`` from ``ident`` (``frames``: its envelope then buffers)."""
        self.relayed += 1
        if self._held or (msg.mesh == self.server.mesh and not self._all_known(msg)):
            # Keep the sender's order: what comes after waits too.
            self._held.append((ident, msg, frames))
            if not self._asking:
                self._asking = True
                self.loop.create_task(self._refresh())
            return
        self._forward(ident, msg, frames)

    def _all_known(self, msg: w.Relay) -> bool:
        known = self.known
        return all(known.get(t.rank) == (t.generation, t.addr) for t in msg.targets)

    async def _refresh(self) -> None:
        """Ask our agent which procs of our mesh it runs here, then serve what waited."""
        try:
            if self._agent is None:
                self._agent = AgentClient(zmq.Context.instance(), self.server.spec.agent, self.loop)
            reply = await self._agent.request(lambda i: w.GetState(i, self.server.mesh), 5.0)
            known: dict[int, tuple[int, str]] = {}
            for report in getattr(reply, "meshes", []):
                if report.name == self.server.mesh:
                    for r in report.ranks:
                        if r.addr:
                            known[r.rank] = (r.generation, r.addr)
            self.known = known
        except Exception as exc:  # the agent did not answer: unknown targets fail below
            log.warning("cannot ask the agent which procs run here: %r", exc)
        finally:
            # Served outside this task: a relay's own part starts its actor's
            # call at once, as the actor's task, which cannot be entered from
            # inside another task (``Mailbox.step``). (Not once the proc's
            # loop is closed: this task was cancelled as the proc ended.)
            if not self.loop.is_closed():
                self.loop.call_soon(self._serve_held)

    def _serve_held(self) -> None:
        self._asking = False
        held, self._held = self._held, deque()
        for ident, msg, frames in held:
            self._forward(ident, msg, frames)

    def _forward(self, ident: bytes, msg: w.Relay, frames: list[Any]) -> None:
        total = len(msg.targets) + sum(len(h.targets) for h in msg.down)
        fwd = Forward(ident, msg.id, 0 if msg.oneway else total)
        fwd.local = len(msg.targets)
        if msg.reduce and not msg.oneway:
            fwd.fold = self._fold(msg.reduce)
        out = [msg.body, *frames[1:]]
        me = (self.server.rank, self.server.generation)
        for k, t in enumerate(msg.targets):
            if msg.mesh != self.server.mesh or self.known.get(t.rank) != (t.generation, t.addr):
                if not msg.oneway:
                    why = f"rank {t.rank} (generation {t.generation}) of {msg.mesh} is not a proc "
                    why += f"this relay may reach (it serves {self.server.mesh} on its host)"
                    self.back.answer(fwd, k, w.Failure(msg.id, "stopped", "RelayRefused", why), [])
                continue
            if (t.rank, t.generation) == me and _own.dispatch(self, fwd, k, out, msg.oneway):
                self.forwarded += 1  # this proc's own part, run here (zmesh._host.proc.relayown)
                continue
            link = self._link(ident, t.addr)
            link.used = self.loop.time()
            link.sock.send(out)
            self.forwarded += 1
            if not msg.oneway:
                link.pending[msg.id] = (fwd, k)
            if not link.proven:
                fwd.unproven += 1
                link.waiting_proof.append(fwd)
        offset = len(msg.targets)
        for hop in msg.down:  # the next level: its relay checks its own targets
            if msg.mesh != self.server.mesh:
                break  # (every target was refused above; these are refused below)
            link = self._link(ident, hop.relay.addr)
            link.used = self.loop.time()
            nested = w.Relay(msg.id, msg.mesh, hop.targets, msg.body, msg.oneway, reduce=msg.reduce)
            link.sock.send(self.server.codec.encode(nested, frames[1:]))
            self.forwarded += 1
            link.hops[msg.id] = Hop(fwd, offset, len(hop.targets), msg.oneway)
            fwd.hops += 1
            offset += len(hop.targets)
        if msg.mesh != self.server.mesh:
            fwd.acks.extend(range(len(msg.targets), total))  # nothing sent there
            for k in range(len(msg.targets), total):
                why = f"this relay serves {self.server.mesh}, not {msg.mesh}"
                if not msg.oneway:
                    self.back.answer(fwd, k, w.Failure(msg.id, "stopped", "RelayRefused", why), [])
        if not fwd.unproven:
            self._local_acked(fwd)

    # ------------------------------------------------------------ links

    def _link(self, ident: bytes, addr: str) -> Link:
        link = self.links.get((ident, addr))
        if link is None:
            self._close_idle()
            sock = secure_client(configure(zmq.Context.instance().socket(zmq.DEALER), data=True),
                                 addr=addr)  # fmt: skip
            sock.connect(addr)
            a = AsyncSocket(sock, self.loop, None, batch=True)
            link = Link(addr, a, self.loop.time())
            a.on_message = self._on_answer_of(link)
            a.watch_disconnects(lambda: self._lost(link))
            self.links[(ident, addr)] = link
            probe = w.Call(-next(self._ids), _PROBE_ACTOR, "", w.Payload())
            a.send(self.server.codec.encode(probe))
        return link

    def _close_idle(self) -> None:
        """Close the links with nothing in flight that were not used for ``LINK_IDLE`` s."""
        now = self.loop.time()
        for key, link in list(self.links.items()):
            if link.proven and not link.pending and not link.hops and now - link.used >= LINK_IDLE:
                del self.links[key]
                link.sock.close()  # (the default linger: what it still holds goes out)

    def _on_answer_of(self, link: Link) -> Callable[[list[Any]], int | None]:
        head_of = _HEAD.decode
        raws_of = _RAWS.decode
        reply_of = _REPLY.decode

        def on_answer(frames: list[Any]) -> int | None:
            # Answers pass through undecoded: only each one's kind and id are
            # read (a batch is split into its envelopes, not decoded).
            env = frames[0]
            try:
                if env and env[0] == BATCH_MARK:
                    raws, bufs = raws_of(memoryview(env)[1:]), []
                else:
                    raws, bufs = [msgspec.Raw(env)], frames[1:]
                heads = [head_of(r) for r in raws]
            except Exception:  # garbled: its call fails by timeout or supervision
                return None
            for raw, head in zip(raws, heads, strict=True):
                if head.id < 0:  # the answer to our probe: the link is connected
                    self._proven(link)
                    continue
                if head.msg == "RelayReply":
                    try:
                        m = reply_of(raw)
                    except Exception:
                        continue
                    self._from_hop(link, m, bufs)
                    continue
                entry = link.pending.pop(head.id, None)
                if entry is not None:
                    self.back.answer(entry[0], entry[1], raw, list(bufs))
            return len(raws)

        return on_answer

    def _from_hop(self, link: Link, m: w.RelayReply, bufs: list[Any]) -> None:
        """What a relay below sent back: its answers join ours, re-indexed."""
        hop = link.hops.get(m.id)
        if hop is None:
            return
        fwd = hop.fwd
        pos = 0
        for k, answer, nbuf in zip(m.index, m.answers, m.nbufs, strict=False):
            if k == -1 and m.reduced:  # its targets' values, folded there
                self._from_hop_folded(hop, m.reduced, answer, list(bufs[pos : pos + nbuf]))
            elif k in hop.remaining:
                hop.remaining.discard(k)
                fwd.open -= 1
                fwd.out.append((hop.offset + k, answer, list(bufs[pos : pos + nbuf])))
                if failed(answer):  # its caller fails at once: no linger here either
                    fwd.urgent = True
            pos += nbuf
        for k in m.lost:
            if k in hop.remaining:
                hop.remaining.discard(k)
                fwd.open -= 1
                fwd.out.append((hop.offset + k, None, []))
                fwd.urgent = True
        if m.forwarded:
            self._hop_acked(hop)
        if m.done:
            del link.hops[m.id]
        self.back.schedule(fwd)

    def _from_hop_folded(self, hop: Hop, reduced: list[int], raw: Any, bufs: list[Any]) -> None:
        fwd = hop.fwd
        ks = [j for j in reduced if j in hop.remaining]
        hop.remaining.difference_update(ks)
        fwd.open -= len(ks)
        mine = [hop.offset + j for j in ks]
        if fwd.fold is None or not fwd.fold.take_folded(mine, raw, bufs):
            fwd.out.extend((k, None, []) for k in mine)  # unreadable: lost, for the caller

    def _fold(self, blob: bytes) -> Fold:
        if self._reply_codec is None:
            self._reply_codec = Codec(w.CLIENT_INBOX)
        try:
            return Fold(combine_of(blob), self._reply_codec)
        except Exception as exc:  # it does not unpickle here: the caller hears why
            fold = Fold(None, self._reply_codec)
            fold.error = exc
            return fold

    def _local_acked(self, fwd: Forward) -> None:
        """Our own host's part is on proven links: say so now (a hop may take longer)."""
        fwd.acks.extend(range(fwd.local))
        if not fwd.hops:
            self.back.acknowledge(fwd)
        else:
            self.back.schedule(fwd)

    def _hop_acked(self, hop: Hop) -> None:
        if not hop.acked:
            hop.acked = True
            fwd = hop.fwd
            fwd.hops -= 1
            fwd.acks.extend(range(hop.offset, hop.offset + hop.n))
            if not fwd.hops and not fwd.unproven and not fwd.forwarded:
                self.back.acknowledge(fwd)
            else:
                self.back.schedule(fwd)

    def _proven(self, link: Link) -> None:
        link.proven = True
        for fwd in link.waiting_proof:
            fwd.unproven -= 1
            if not fwd.unproven and not fwd.forwarded:
                self._local_acked(fwd)
        link.waiting_proof.clear()

    def _lost(self, link: Link) -> None:
        """The link's connection dropped: what was on it may or may not have run."""
        pending, link.pending = link.pending, {}
        for fwd, k in pending.values():
            fwd.open -= 1
            fwd.out.append((k, None, []))
            fwd.urgent = True
            self.back.schedule(fwd)
        hops, link.hops = link.hops, {}
        for hop in hops.values():
            for k in sorted(hop.remaining):
                hop.fwd.open -= 1
                hop.fwd.out.append((hop.offset + k, None, []))
                hop.fwd.urgent = True
            hop.remaining.clear()
            self._hop_acked(hop)
            self.back.schedule(hop.fwd)
        # Replaced: a new connection, proved again before anything is acknowledged.
        for key, value in list(self.links.items()):
            if value is link:
                del self.links[key]
        link.sock.close(linger=0)
        self._proven(link)  # nothing waits for this one any more

    # ------------------------------------------------------------ answers

    def own_answer(self, fwd: Forward, k: int, answer: msgspec.Raw, bufs: list[Any]) -> None:
        """This proc's answer to its own part (``zmesh._host.proc.relayown``)."""
        self.back.answer(fwd, k, answer, bufs)

    def counts(self) -> dict[str, int]:
        """This relay's counters, as ``ProcStatistics`` fields."""
        return {"relayed": self.relayed, "forwarded": self.forwarded}

    def close(self) -> None:
        """Close every link (the proc is ending)."""
        for link in self.links.values():
            link.sock.close(linger=0)
        self.links.clear()
        if self._agent is not None:
            self._agent.close()
