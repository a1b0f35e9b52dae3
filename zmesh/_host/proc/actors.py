"""Several actors in one proc: the proc's groups, and the gathering of their answers.

A mesh spawned with ``actors_per_proc=N`` puts N actors of one class in each
proc: a *group*. Actor ``k`` of group ``name`` has a mailbox of its own,
under the wire name ``name#k`` (``#`` is never in a name), so it keeps its
own queue and ordering, and a ``Call`` to ``name#k`` reaches it alone.

A fan-out sends the proc one ``GroupCall`` for every targeted actor of the
group. Each actor gets its own ``Call`` (in its mailbox, in arrival order,
as if it had been sent alone), and its answer, instead of going out, goes to
the call's ``Gather``; when the last is in, one ``Gathered`` message carries
them all, each actor's ``Reply`` or ``Failure`` apart from the others'.

The answers are caught at the router: a gathered call's "identity" is a
``Slot``, and the proc's router, once it has a group (``intercept``), hands
frames addressed to a ``Slot`` to its gather. So the code that runs a call
and answers it (``ProcServer.handle``, batching, ``fail``) is the same
whether a call came alone or in a group.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import pickle
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from zmesh._actor import Point, set_actor_name, set_current
from zmesh._errors import SpawnError
from zmesh._host.proc import groupfast as _groupfast
from zmesh._host.proc import lifecycle as _lifecycle
from zmesh._host.proc.mailbox import Mailbox
from zmesh._wire import messages as w

if TYPE_CHECKING:
    from zmesh._wire.zsock import AsyncSocket

if TYPE_CHECKING:
    from zmesh._host.proc.procserver import ProcServer

SEP = "#"  # actor k of group g is "g#k"; names never hold it (zmesh._wire.names)


def member(name: str, k: int) -> str:
    """The wire name of actor ``k`` of group ``name``."""
    return f"{name}{SEP}{k}"


def intercept(router: AsyncSocket) -> None:
    """Make ``router`` hand what is sent to a ``Slot`` to its gather.

    Done once, when a proc gets its first group, on that socket alone: a
    proc of one actor per mesh sends as it always did, with no test per reply.
    """
    if "send" in vars(router):
        return
    plain = router.send

    def send(frames: list[Any]) -> None:
        head = frames[0]
        if type(head) is Slot:
            head.answer(frames)
            return
        plain(frames)

    router.send = send  # type: ignore[method-assign]  # (instance attribute wins)


class Gathers(Protocol):
    """What gathers answers sent to a ``Slot`` (a group's, or a relay's own part)."""

    def put(self, index: int, frames: list[Any]) -> None: ...


class Slot:
    """The "identity" of one actor's part of a gathered call."""

    __slots__ = ("gather", "index")

    def __init__(self, gather: Gathers, index: int) -> None:
        self.gather = gather
        self.index = index

    def answer(self, frames: list[Any]) -> None:
        self.gather.put(self.index, frames)


class Gather:
    """The answers of one ``GroupCall``: one message once every actor answered."""

    __slots__ = ("bufs", "envs", "id", "ident", "left", "server")

    def __init__(self, server: ProcServer, ident: bytes, req_id: int, n: int) -> None:
        self.server = server
        self.ident = ident
        self.id = req_id
        self.envs: list[Any] = [None] * n
        self.bufs: list[list[Any]] | None = None  # buffer frames per part, if any has some
        self.left = n

    def put(self, index: int, frames: list[Any]) -> None:
        """Part ``index`` answered with ``frames`` (``[slot, envelope, *buffers]``)."""
        if self.envs[index] is not None:
            return  # (answered once only)
        self.envs[index] = frames[1]
        if len(frames) > 2:
            if self.bufs is None:
                self.bufs = [[] for _ in self.envs]
            self.bufs[index] = frames[2:]
        self.left -= 1
        if self.left == 0:
            self._send()

    def _send(self) -> None:
        server = self.server
        parts = [msgspec.Raw(e) for e in self.envs]
        if self.bufs is None:
            # The parts are whole Reply/Failure envelopes already: spliced in, not re-encoded.
            frames = server.codec.encode(w.Gathered(self.id, parts))  # type: ignore[arg-type]
        else:
            flat = [b for part in self.bufs for b in part]
            msg = w.GatheredFrames(self.id, parts, [len(b) for b in self.bufs])
            frames = server.codec.encode(msg, flat)
        server.router.send([self.ident, *frames])


def dispatch(server: ProcServer, ident: bytes, msg: w.GroupCall, frames: list[Any]) -> None:
    """Run ``msg``'s call on each of its actors; gather their answers."""
    boxes = server.groups.get(msg.actor)
    if boxes is None:
        if not msg.oneway:
            f = w.Failure(msg.id, "stopped", "ActorStopped", f"no actor {msg.actor!r} here",
                          endpoint=msg.method)  # fmt: skip
            server.router.send([ident, *server.codec.encode(f)])
        return
    if not msg.oneway:
        ep = _groupfast.endpoint_of(boxes, msg.method)
        if ep is not None:  # a plain async endpoint: idle actors run their part at once
            _groupfast.dispatch(server, ident, msg, frames, boxes, ep)
            return
    dispatch_mailboxes(server, ident, msg, frames, boxes)


def dispatch_mailboxes(
    server: ProcServer, ident: bytes, msg: w.GroupCall, frames: list[Any],
    boxes: list[Mailbox | None],
) -> None:  # fmt: skip
    """Put ``msg``'s call in the mailbox of each of its actors; gather their answers."""
    picks = msg.actors
    gather = None if msg.oneway else Gather(server, ident, msg.id, len(picks))
    # One Call for every actor: its answer's place comes from its Slot, not its id.
    call = w.Call(0, msg.actor, msg.method, msg.payload, msg.deadline, msg.oneway, msg.request)
    n = len(boxes)
    for j, k in enumerate(picks):
        to: Any = ident if gather is None else Slot(gather, j)
        box = boxes[k] if k < n else None
        if box is None:
            why = f"no actor {member(msg.actor, k)!r} here"
            server.fail(to, call, "stopped", "ActorStopped", why)
        else:
            box.put(to, call, frames)


def stop(server: ProcServer, name: str) -> list[asyncio.Future[Any]]:
    """Stop actor ``name``, or every actor of group ``name``; their ``__cleanup__``
    runs, and the cleanups still running are returned, to wait for."""
    box = server.actors.pop(name, None)
    ending: list[asyncio.Future[Any]] = []
    if box is not None:
        if (end := box.close()) is not None:
            ending.append(end)
        group, sep, k = name.rpartition(SEP)
        boxes = server.groups.get(group) if sep else None
        if boxes is not None and k.isdigit() and int(k) < len(boxes):
            boxes[int(k)] = None  # later calls to it fail: it stopped
            if not any(boxes):
                del server.groups[group]
        return ending
    for box in server.groups.pop(name, None) or ():
        if box is not None:
            server.actors.pop(box.name, None)
            if (end := box.close()) is not None:
                ending.append(end)
    return ending


async def spawn(server: ProcServer, ident: bytes, msg: w.SpawnActor, frames: list[Any]) -> None:
    """Build ``msg.count`` actors of ``msg``'s class; answer with one ``Gathered``.

    Actor ``k`` is at rank ``msg.rank * count + k`` of dims ``{**msg.dims,
    "actors": count}``. Each ``__init__`` runs in a worker thread with its own
    ``current_rank()``; one that raises fails its own part only (the others
    start), and the client fails the spawn naming that actor's rank.
    """
    count = msg.count
    dims = {**msg.dims, "actors": count}
    intercept(server.router)
    try:
        cls = pickle.loads(msg.cls)
    except Exception as exc:
        err = SpawnError(f"the proc cannot load the actor class: {exc!r}")
        err.__cause__ = exc
        server._send_failure(ident, msg.id, "spawn", err, "__init__")
        return
    loop = asyncio.get_running_loop()

    def build(point: Point) -> Any:
        try:
            args, kwargs = server.codec.unpack(msg.payload, frames)
        except Exception as exc:
            raise SpawnError(f"the proc cannot load the actor's arguments: {exc!r}") from exc
        instance = cls.__new__(cls)
        set_current(actor=instance)  # meshes spawned inside __init__ are this actor's
        instance.__init__(*args, **kwargs)
        return instance

    def start(k: int) -> asyncio.Future[Any]:
        point = Point(msg.rank * count + k, dims)
        ctx = contextvars.copy_context()
        ctx.run(set_current, point)
        ctx.run(set_actor_name, msg.actor)
        return loop.run_in_executor(server.pool, functools.partial(ctx.run, build, point))

    results = await asyncio.gather(*(start(k) for k in range(count)), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and _lifecycle.cancelled(r):
            raise r
    stop(server, msg.actor)  # a new group (or actor) of a name replaces the old one
    boxes: list[Mailbox | None] = []
    gather = Gather(server, ident, msg.id, count)
    for k, r in enumerate(results):
        if isinstance(r, BaseException):
            boxes.append(None)
            to: Any = Slot(gather, k)  # its Failure goes into the gathered answer
            server._send_failure(to, k, "spawn", r, "__init__")
            continue
        name = member(msg.actor, k)
        box = Mailbox(server, name, r, Point(msg.rank * count + k, dims), label=msg.actor)
        server.actors[name] = box
        boxes.append(box)
        if hasattr(r, "__cleanup__"):
            _lifecycle.on_sigterm(server)
        gather.put(k, [None, server.codec.encode(w.Reply(k, w.Payload(args=(None,))))[0]])
    server.groups[msg.actor] = boxes
