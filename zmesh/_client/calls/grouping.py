"""Several actors per proc, the caller's half: one message per proc, answers per actor.

A mesh spawned with ``actors_per_proc=N`` has one ``ProcRef`` per actor
whose ``index`` is the actor's place in its proc and ``point`` its rank in
the mesh. ``Runtime.send`` hands a fan-out to such refs to ``send`` here: the
refs are grouped by proc, and each proc gets one ``GroupCall`` naming its
targeted actors, encoded once for every proc with the same selection (a
slice of a mesh selects the same actors in each proc, so that is one
encoding). The proc answers with one ``Gathered`` message
(``zmesh._host.proc.actors``), read here into one answer per actor, each its own:
an actor that raised fails its own rank only. A proc that dies, a dropped
connection or a timeout fails every actor of that proc's message, each with
its own rank in the error.

``call_one`` and ``choose`` to one actor send a plain ``Call`` addressed to
that actor (``member``), as to a proc's only actor, and its answer goes
through an ``ActorSink`` (its errors carry the actor's rank).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from zmesh._client.calls.inflight import CallSpec, failure_error, outcome
from zmesh._errors import EncodeError, ZmeshError
from zmesh._shared.points import Shape
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._client.calls.runtime import ProcRef, Runtime
    from zmesh._wire.codec import Codec

SEP = "#"  # as zmesh._host.proc.actors: actor k of group g is "g#k"

Deliver = Callable[[int, bool, Any], None]


def member(actor: str, ref: ProcRef) -> str:
    """The name a message to ``ref``'s actor is addressed to."""
    return actor if ref.index < 0 else f"{actor}{SEP}{ref.index}"


def for_actor(err: Any, ref: ProcRef) -> Any:
    """``err`` as the error of ``ref``'s actor: the same, with the actor's rank."""
    if not isinstance(err, ZmeshError) or ref.point < 0 or err.rank == ref.point:
        return err
    mine = copy.copy(err)
    mine.rank = ref.point
    mine.__cause__ = err.__cause__
    return mine


def actors_shape(procs: Shape, per_proc: int) -> Shape:
    """The shape of ``per_proc`` actors in each proc of ``procs``: one more dim,
    ``actors``, when ``per_proc`` > 1 (ranks row-major, the actors of a proc together)."""

    if per_proc == 1:
        return procs
    dims = {**procs.dims, "actors": per_proc}
    return Shape(dims, [r * per_proc + k for r in procs.ranks for k in range(per_proc)])


def member_refs(procs: list[ProcRef], per_proc: int) -> list[list[ProcRef]]:
    """Each proc's actors, as refs: their place in the proc and their rank in
    the mesh (``[]`` for one actor per proc, whose ref is its proc's)."""
    if per_proc == 1:
        return []
    return [
        [msgspec.structs.replace(r, index=k, point=r.rank * per_proc + k) for k in range(per_proc)]
        for r in procs
    ]


class Parts:
    """A ``Gathered`` (or ``GatheredFrames``) answer, as received: read with ``outcomes``."""

    __slots__ = ("frames", "msg")

    def __init__(self, msg: w.Gathered | w.GatheredFrames, frames: list[Any]) -> None:
        self.msg = msg
        self.frames = frames

    def outcomes(self, codec: Codec, refs: list[ProcRef]) -> list[tuple[bool, Any]]:
        """``(ok, value)`` of each part, for the actors ``refs`` (in part order)."""
        msg = self.msg
        out: list[tuple[bool, Any]] = []
        if type(msg) is w.Gathered:
            env = [self.frames[0]]
            for part, ref in zip(msg.parts, refs, strict=False):
                if type(part) is w.Reply and part.payload.blob is None:
                    out.append((True, part.payload.args[0]))
                elif isinstance(part, w.Reply):
                    out.append(outcome(codec, part, env, ref))
                else:
                    out.append((False, for_actor(failure_error(part, ref), ref)))
        else:
            at = 1  # each part's buffer frames follow the envelope, in part order
            assert isinstance(msg, w.GatheredFrames)
            for raw, n, ref in zip(msg.parts, msg.nbufs, refs, strict=False):
                frames = [raw, *self.frames[at : at + n]]
                at += n
                try:
                    part = codec.decode(frames)
                except Exception as exc:
                    out.append((False, EncodeError(f"cannot decode reply: {exc!r}")))
                    continue
                ok, value = outcome(codec, part, frames, ref)
                out.append((ok, value if ok else for_actor(value, ref)))
        return out


class _Group:
    """The targets of a fan-out in one proc: their places in the fan-out and in the proc."""

    __slots__ = ("locals", "places", "proc", "refs")

    def __init__(self, proc: ProcRef) -> None:
        self.proc = proc  # the proc, as one ref
        self.places: list[int] = []  # each target's index in the fan-out
        self.locals: list[int] = []  # each target's index in the proc
        self.refs: list[ProcRef] = []


# Plans of recent fan-outs, by the id of their refs list (a mesh's ``_refs``,
# the same list call after call; it is held here, so its id is not reused).
_plans: dict[int, tuple[list[ProcRef], list[_Group], int]] = {}
MAX_PLANS = 256


def plan(refs: list[ProcRef]) -> list[_Group]:
    """``refs`` grouped by proc, in order of first appearance."""
    hit = _plans.get(id(refs))
    if hit is not None and hit[0] is refs and hit[2] == len(refs):
        return hit[1]
    groups = _plan(refs)
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    _plans[id(refs)] = (refs, groups, len(refs))
    return groups


def _plan(refs: list[ProcRef]) -> list[_Group]:
    groups: dict[str, _Group] = {}
    for i, ref in enumerate(refs):
        g = groups.get(ref.addr)
        if g is None:
            g = groups[ref.addr] = _Group(msgspec.structs.replace(ref, index=-1, point=-1))
        g.places.append(i)
        g.locals.append(ref.index)
        g.refs.append(ref)
    return list(groups.values())


def send(
    rt: Runtime,
    refs: list[ProcRef],
    msg_for: Callable[[int], Any],
    buffers: list[Any],
    deliver: Deliver | None,
    timeout: float | None,
    block: bool,
    via: Callable[..., Any] | None = None,
) -> int:
    """``Runtime.send`` to several actors per proc: one message per proc.

    ``via``: what sends a fan-out's per-proc messages (``Runtime.send``'s
    signature without the runtime; default ``rt.send``): the tree path's
    ``Tree.send_procs`` sends them one per host, through relays.
    """
    template = msg_for(0)
    groups = plan(refs)
    req_id = 0
    if type(template) is w.Call:
        # Procs whose selection is the same share one encoded message.
        by_sel: dict[tuple[int, ...], list[_Group]] = {}
        for g in groups:
            by_sel.setdefault(tuple(g.locals), []).append(g)
        t = template
        for sel, gs in by_sel.items():
            picks = list(sel)

            def group_call(i: int, picks: list[int] = picks) -> w.GroupCall:
                return w.GroupCall(
                    i, t.actor, t.method, t.payload, t.deadline, t.oneway, t.request, picks,
                    t.sent, t.clock,
                )  # fmt: skip

            d = _expand(rt, gs, deliver) if deliver is not None else None
            req_id = (via or rt.send)([g.proc for g in gs], group_call, buffers, d, timeout, block)
        return req_id
    # Anything else (StopActor): to each actor, by its own name.
    for g in groups:
        for place, ref in zip(g.places, g.refs, strict=True):

            def one(i: int, ref: ProcRef = ref) -> Any:
                return msgspec.structs.replace(msg_for(i), actor=member(template.actor, ref))

            d = None if deliver is None else _at(deliver, place, ref)
            req_id = rt.send([g.proc], one, buffers, d, timeout, block)
    return req_id


def _expand(rt: Runtime, gs: list[_Group], deliver: Deliver) -> Deliver:
    """A proc's answer (``deliver`` of proc ``i`` of ``gs``) as its actors' answers."""

    def proc_answered(i: int, ok: bool, value: Any) -> None:
        g = gs[i]
        places = g.places
        if ok and type(value) is Parts:
            got = value.outcomes(rt.codec, g.refs)
            for place, (part_ok, part) in zip(places, got, strict=False):
                deliver(place, part_ok, part)
            if len(got) < len(places):  # (a malformed answer: say so, never hang)
                for place, ref in list(zip(places, g.refs, strict=True))[len(got) :]:
                    err = EncodeError("the proc's answer lacks this actor's part")
                    deliver(place, False, for_actor(err, ref))
        elif ok:
            for place in places:
                deliver(place, True, value)
        else:
            for place, ref in zip(places, g.refs, strict=True):
                deliver(place, False, for_actor(value, ref))

    return proc_answered


def _at(deliver: Deliver, place: int, ref: ProcRef) -> Deliver:
    def answered(_: int, ok: bool, value: Any) -> None:
        deliver(place, ok, value if ok else for_actor(value, ref))

    return answered


class ActorSink:
    """The sink of a call to one actor of a group: its errors carry the actor's rank."""

    __slots__ = ("fut", "ref")

    def __init__(self, fut: Any, ref: ProcRef) -> None:
        self.fut = fut
        self.ref = ref

    def done(self) -> bool:
        return bool(self.fut.done())

    def set_running_or_notify_cancel(self) -> bool:
        return bool(self.fut.set_running_or_notify_cancel())

    def set_result(self, value: Any) -> None:
        self.fut.set_result(value)

    def set_exception(self, exc: BaseException) -> None:
        self.fut.set_exception(for_actor(exc, self.ref))


def call(rt: Runtime, ref: ProcRef, spec: CallSpec, fut: Any) -> None:
    """``Runtime.call`` to ``ref``'s actor, one of several in its proc (``choose``)."""
    sink: Any = ActorSink(fut, ref)
    rt.call(ref, spec.for_member(member(spec.actor, ref)), sink)
