"""Tree fan-out: a call or broadcast to a wide mesh sends one message per host.

The direct path sends a fan-out to every proc itself: N messages and N
connections for N procs. On a wide mesh (``wide``) ``send`` instead groups
the targets by host; each host has a *relay*, one proc of the mesh there
(``zmesh._host.proc.relay``), which sends the request on to its host's targets
and gathers their answers. Hosts are grouped again under about sqrt(hosts)
*top* relays (``ZMESH_TREE_BRANCH`` hosts each; 1: one level), so the
client sends one ``Relay`` per top: 4 for 16 hosts, 32 for 1,000. A top
relay sends its own host's part and one ``Relay`` to each of its other
hosts' relays. The request is encoded once, as for the direct path, and
every relay forwards it unchanged.

A mesh with several actors per proc takes the same path: each proc's part
is its ``GroupCall`` (``zmesh._client.calls.grouping``), relayed as any request,
and its ``Gathered`` answer comes back through the relay undecoded.

Which path: ``ZMESH_FANOUT`` (``auto``, ``tree`` or ``direct``; or set
``MODE``); in ``auto`` a mesh takes the tree when it spans at least two
hosts and ``ZMESH_TREE_MIN`` (32) procs or more. The choice is by the size of
the whole mesh, so every fan-out to it (a slice too) goes the same way.

The direct path's guarantees hold:

* **Failures.** Each host's part is a request on the relay's connection
  (``Carrier``), so a relay that dies, drops or times out fails its
  targets' calls (``ConnectionLostError``: they may or may not have run;
  the relay's own rank gets its ``SupervisionError``). A target that dies
  fails at once from supervision (``broken``), as on the direct path.
* **Order per sender and actor.** A later direct message to a proc (a
  ``call_one`` after a broadcast) waits until the relay has acknowledged
  forwarding the earlier ones (``defer``, fed by the runtime's ``held``);
  a fan-out target with direct calls still unanswered gets its part
  directly rather than through the relay.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from zmesh._client.calls import grouping as _grouping
from zmesh._client.calls.connections import (
    BIG,
    MAX_IN_FLIGHT,
    expire_one,
    frames_size,
    over,
    wait,
)
from zmesh._client.calls.inflight import Sink, resolve
from zmesh._client.calls.treeanswers import Answers, Carrier, RelayRequest, count, direct_in_flight
from zmesh._errors import ConnectionLostError, EncodeError
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._client.calls.inflight import CallSpec
    from zmesh._client.calls.runtime import ProcRef, Runtime
    from zmesh._client.handles.mesh import ActorMesh

log = logging.getLogger("zmesh.tree")

MODE = os.environ.get("ZMESH_FANOUT", "auto")
MIN_PROCS = int(os.environ.get("ZMESH_TREE_MIN", "32"))
# Hosts per top relay (0: about the square root of the mesh's hosts; 1: one level).
BRANCH = int(os.environ.get("ZMESH_TREE_BRANCH", "0"))

Deliver = Callable[[int, bool, Any], None]
Reduce = tuple[bytes, Callable[[bool, Any], None]]


def wide(mesh: ActorMesh[Any]) -> bool:
    """Whether fan-outs to ``mesh`` take the tree path (see the module docstring)."""
    dims = mesh.full_dims
    if MODE == "direct":
        return False
    if MODE == "tree":
        return True
    procs = math.prod(n for d, n in dims.items() if d != "actors")
    return dims.get("hosts", 1) >= 2 and procs >= MIN_PROCS


class TreeStatistics(msgspec.Struct, frozen=True):
    """What this runtime's tree fan-outs did.

    Attributes:
        fanouts: fan-outs sent on the tree path.
        relay_messages: ``Relay`` messages sent (one per host per fan-out).
        relayed: targets reached through a relay.
        direct: targets of tree fan-outs sent directly (they had direct calls in flight).
        deferred: direct messages that waited for a relay's acknowledgement.
        answers: targets' answers that came back through relays, one by one.
        folded: values relays folded (a reducing fan-out), each standing for
            several targets' answers.
    """

    fanouts: int
    relay_messages: int
    relayed: int
    direct: int
    deferred: int
    answers: int = 0
    folded: int = 0


def send(
    rt: Runtime,
    refs: list[ProcRef],
    msg_for: Callable[[int], Any],
    buffers: list[Any],
    deliver: Deliver | None,
    timeout: float | None = None,
    block: bool = True,
    reduce: Reduce | None = None,
) -> None:
    """``Runtime.send`` on the tree path: one ``Relay`` per host. On ``rt``'s loop.

    ``reduce``: ``(pickled combine, folder)``: the relays fold their targets'
    values (``zmesh._host.proc.relayfold``); each folded value goes to
    ``folder(ok, value)`` and its targets to ``deliver`` as ``FOLDED``.
    """
    tree = of(rt)
    if tree.queue:  # direct messages wait for acknowledgements: keep the order
        again = functools.partial(
            tree.send, refs, msg_for, buffers, deliver, timeout, block, reduce
        )
        tree.queue_thunk([r.addr for r in refs], again)
        return
    tree.send(refs, msg_for, buffers, deliver, timeout, block, reduce)


def of(rt: Runtime) -> Tree:
    """``rt``'s tree path, made on first use. On ``rt``'s loop."""
    tree = rt.tree
    if tree is None:
        tree = rt.tree = Tree(rt)
    return tree


class Tree(Answers):
    """The tree path's state in one runtime: relays, parts in flight, held procs."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.relays: dict[tuple[str, str], ProcRef] = {}  # (mesh, agent) -> its relay
        # Two levels: (mesh, agent) -> the host (agent) whose relay its parts go through,
        # and per mesh, each top's count of hosts.
        self.top_of: dict[tuple[str, str], str] = {}
        self.tops: dict[str, dict[str, int]] = {}
        self.by_addr: dict[str, set[Carrier]] = {}  # target address -> parts not settled
        # Direct messages waiting (in order) for relays to acknowledge:
        # (addresses, send, the future a failure of the send settles).
        self.queue: deque[tuple[list[str], Callable[[], Any], Sink | None]] = deque()
        self.unacked: dict[str, int] = {}  # address -> relay messages not acknowledged
        self.bypass = False
        # Per proc, made once: its wire form, and that supervision follows it.
        self.targets: dict[ProcRef, w.RelayTarget] = {}
        self.watched: set[ProcRef] = set()
        self._fanouts = self._relay_messages = self._relayed = self._direct = self._deferred = 0
        self._answers = self._folded = 0

    def statistics(self) -> TreeStatistics:
        """Counters of this runtime's tree fan-outs, as a frozen record."""
        return TreeStatistics(
            self._fanouts, self._relay_messages, self._relayed, self._direct, self._deferred,
            self._answers, self._folded,
        )  # fmt: skip

    # ------------------------------------------------------------ order

    def defer(self, addrs: list[str], thunk: Callable[[], Any], fut: Sink | None = None) -> bool:
        """Queue a direct message to ``addrs`` behind unacknowledged relay messages.

        The runtime's ``held`` names the addresses that have them (or have
        messages queued here). ``False``: it need not wait (this is the
        queue sending it now); the runtime sends it at once.
        """
        if self.bypass:
            return False
        self._deferred += 1
        self.queue_thunk(addrs, thunk, fut)
        return True

    def queue_thunk(
        self, addrs: list[str], thunk: Callable[[], Any], fut: Sink | None = None
    ) -> None:
        count(self.rt.held, addrs, 1)
        self.queue.append((addrs, thunk, fut))

    def _run_queue(self) -> None:
        queue = self.queue
        while queue and not self.bypass:
            addrs, thunk, fut = queue[0]
            if any(a in self.unacked for a in addrs):
                return  # its turn comes with an acknowledgement
            queue.popleft()
            count(self.rt.held, addrs, -1)
            self.bypass = True
            try:
                thunk()
            except Exception as exc:  # it fails alone; the queue goes on
                if fut is not None:
                    resolve(fut, False, exc)
                else:
                    log.error("a deferred message could not be sent", exc_info=exc)
            finally:
                self.bypass = False

    # ------------------------------------------------------------ sending

    def fan_out(self, refs: list[ProcRef], spec: CallSpec, deliver: Deliver | None) -> None:
        """The transport's ``fan_out`` (``zmesh._client.calls.transport``): ``spec``'s
        ``Call`` to every actor of ``refs``, one ``Relay`` per host. On the runtime's loop."""
        msg = spec.message_for(oneway=deliver is None)
        send(self.rt, refs, msg, spec.buffers, deliver, spec.timeout, spec.block)

    def send(
        self, refs: list[ProcRef], msg_for: Callable[[int], Any], buffers: list[Any],
        deliver: Deliver | None, timeout: float | None, block: bool,
        reduce: Reduce | None = None,
    ) -> None:  # fmt: skip
        if refs and refs[0].index >= 0:
            # Several actors per proc: one GroupCall per proc (zmesh._client.calls.grouping),
            # and those go one Relay per host; each proc's Gathered comes back
            # through its relay and is read into its actors' answers.
            via = functools.partial(self.send_procs, reduce=reduce)
            _grouping.send(self.rt, refs, msg_for, buffers, deliver, timeout, block, via=via)
            return
        self.send_procs(refs, msg_for, buffers, deliver, timeout, block, reduce)

    def send_procs(
        self, refs: list[ProcRef], msg_for: Callable[[int], Any], buffers: list[Any],
        deliver: Deliver | None, timeout: float | None, block: bool,
        reduce: Reduce | None = None,
    ) -> None:  # fmt: skip
        """``send`` to procs (``refs``: one per proc)."""
        rt = self.rt
        req_id = rt.next_id()
        try:
            frames = rt.codec.encode(msg_for(req_id), buffers)
        except EncodeError as exc:
            err = EncodeError(f"the message cannot be sent: {exc.message}", mesh=refs[0].mesh)
            if deliver is None:
                raise err from exc
            for i in range(len(refs)):
                deliver(i, False, err)
            return
        self._fanouts += 1
        groups: dict[str, list[int]] = {}
        direct: list[int] = []
        for i, r in enumerate(refs):
            c = rt.conns.get(r.addr)
            if c is not None and c.mesh == r.mesh and (c.broken or direct_in_flight(c)):
                direct.append(i)  # keep its order after the direct calls on it
                continue
            gone = rt.controller.gone(r)
            if gone is not None:
                if deliver is not None:
                    deliver(i, False, gone)
                continue
            groups.setdefault(r.agent, []).append(i)
        if direct:
            self._direct += len(direct)
            drefs = [refs[i] for i in direct]
            sub = None if deliver is None else (lambda j, ok, v: deliver(direct[j], ok, v))
            self.bypass = True
            try:
                rt.send(drefs, msg_for, buffers, sub, timeout, block)
            finally:
                self.bypass = False
        oneway = deliver is None
        for top, parts in self._plan(refs[0].mesh, groups).items():
            self._send_part(
                req_id, refs, top, parts, frames, oneway, deliver, timeout, block, reduce
            )

    def _plan(
        self, mesh: str, groups: dict[str, list[int]]
    ) -> dict[str, list[tuple[str, list[int]]]]:
        """Which hosts' parts go through which host's relay: ``{top: [hosts]}``.

        A host joins a top relay once, for good (so its messages always take
        the same way, in order): about sqrt(hosts) tops of about sqrt(hosts)
        hosts each, so the client sends about sqrt(hosts) messages.
        """
        width = BRANCH or math.isqrt(max(len(groups), 1) - 1) + 1
        plan: dict[str, list[str]] = {}
        for agent in groups:
            top = self.top_of.get((mesh, agent))
            if top is None:
                tops = self.tops.setdefault(mesh, {})
                top = next((t for t, n in tops.items() if n < width), agent)
                tops[top] = tops.get(top, 0) + 1
                self.top_of[(mesh, agent)] = top
            plan.setdefault(top, []).append(agent)
        return {top: [(a, groups[a]) for a in agents] for top, agents in plan.items()}

    def _send_part(
        self, req_id: int, refs: list[ProcRef], top: str, parts: list[tuple[str, list[int]]],
        frames: list[Any], oneway: bool, deliver: Deliver | None, timeout: float | None,
        block: bool, reduce: Reduce | None = None,
    ) -> None:  # fmt: skip
        rt = self.rt
        mesh = refs[parts[0][1][0]].mesh
        own = next((idx for a, idx in parts if a == top), [])
        relay, c = self._relay_for([refs[i] for i in own], top, mesh)
        if relay is None or c is None:
            for a, idx in parts:  # the top host has no relay: each host on its own
                if a != top:
                    self._send_part(
                        req_id, refs, a, [(a, idx)], frames, oneway, deliver, timeout, block,
                        reduce,
                    )  # fmt: skip
            for i in own:  # every candidate there is broken
                if deliver is not None:
                    r = refs[i]
                    err = rt.conn(r).broken or ConnectionLostError("no relay", mesh=r.mesh)
                    deliver(i, False, err)
            return
        idx = list(own)
        down = []
        for a, part in parts:
            if a == top:
                continue
            sub = self._sub_relay(mesh, a, [refs[i] for i in part])
            hop = [self._target(refs[i]) for i in part]
            down.append(w.RelayHop(self._target(sub), hop))
            idx.extend(part)
        targets = [refs[i] for i in idx]
        for r in targets:
            if r not in self.watched:  # its failure must reach us: it has no connection here
                rt.controller.watch(r)
                self.watched.add(r)
        carrier = Carrier(self, relay, targets, idx, deliver, timeout)
        where = [self._target(refs[i]) for i in own]
        blob = b""
        if reduce is not None and not oneway:
            blob, carrier.folder = reduce
        # The same id as the request in it: the relay matches answers by it.
        msg = w.Relay(req_id, relay.mesh, where, bytes(frames[0]), oneway, down, blob)
        try:
            out = rt.codec.encode(msg, frames[1:])
        except EncodeError as exc:
            err = EncodeError(f"the message cannot be sent: {exc.message}", mesh=relay.mesh)
            for k in range(len(targets)):
                if deliver is not None:
                    deliver(idx[k], False, err)
            return
        size = frames_size(out) if len(out) > 1 or len(out[0]) >= BIG else 0
        req = RelayRequest(msg.id, c, carrier, size)  # type: ignore[arg-type]
        carrier.req = req
        if timeout is not None:
            req.timer = rt.loop.call_later(timeout, expire_one, req, timeout)
        addrs = [r.addr for r in targets]
        count(self.unacked, addrs, 1)
        count(rt.held, addrs, 1)  # later direct messages to them wait (see defer)
        for r in targets:
            self.by_addr.setdefault(r.addr, set()).add(carrier)
        self._relay_messages += 1
        self._relayed += len(targets)
        if c.waiting or len(c.pending) >= MAX_IN_FLIGHT or (size and over(c, size)):
            wait(c, out, req, 0, block)
            return
        c.sock.send(out)
        c.pending[req.id] = req
        c.bytes += size

    def forget(self, mesh: str) -> None:
        """``mesh`` is over (released): drop what was kept for it."""
        for ref in [r for r in self.targets if r.mesh == mesh]:
            del self.targets[ref]
        self.watched = {r for r in self.watched if r.mesh != mesh}
        for d in (self.relays, self.top_of):
            for key in [k for k in d if k[0] == mesh]:
                del d[key]
        self.tops.pop(mesh, None)

    def _target(self, ref: ProcRef) -> w.RelayTarget:
        t = self.targets.get(ref)
        if t is None:
            t = self.targets[ref] = w.RelayTarget(ref.rank, ref.generation, ref.addr)
        return t

    def _sub_relay(self, mesh: str, agent: str, targets: list[ProcRef]) -> ProcRef:
        """The relay of ``agent``'s host below a top relay (no connection from here)."""
        rt = self.rt
        key = (mesh, agent)
        relay = self.relays.get(key)
        for r in ([relay] if relay is not None else []) + targets:
            c = rt.conns.get(r.addr)
            if rt.controller.gone(r) is None and (c is None or c.broken is None):
                self.relays[key] = r
                return r
        return targets[0]  # all broken: the top relay reports them lost

    def _relay_for(
        self, targets: list[ProcRef], agent: str, mesh: str
    ) -> tuple[ProcRef | None, Any]:
        """The relay for ``targets`` (on one host) and the connection to it."""
        rt = self.rt
        key = (mesh, agent)
        relay = self.relays.get(key)
        candidates = ([relay] if relay is not None else []) + targets
        for r in candidates:
            if rt.controller.gone(r) is not None:
                continue
            c = rt.conn(r)
            if c.broken is None:
                self.relays[key] = r
                return r, c
        return None, None

    # ------------------------------------------------------------ answers
