"""Generator endpoints through a service: one replica's items, routed.

``svc.gen.call_one(...)`` (or ``svc.gen(...)``, or ``choose``) on a
generator endpoint returns an ``ItemStream`` as on a plain mesh. Its one
source is a ``RoutedSource``: the request is the dispatcher's like any
other (routing, sessions, limits, timeout), and each attempt the dispatcher
sends is a ``StreamCall`` to the replica's ``return_rank`` proc. While the
stream is open its attempt holds one of the replica's slots, so an open
stream counts as load for ``least_loaded`` routing and ``choose``.

A replica that dies before the first item settles the attempt as broken
and the dispatcher sends the request on (the reader sees nothing but the
delay); after the first item the dispatcher ends it with
``StreamInterruptedError`` instead, so no item ever repeats. Closing the
stream (``break``, ``close()``, dropping it) cancels the generator in the
replica and gives the slot back.

Everything here runs on the runtime's loop, except ``open_service_stream``,
which only makes the stream and hands the start to the loop.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from zmesh._client.calls import runtime as _runtime
from zmesh._client.calls.runtime import Runtime
from zmesh._client.handles.mesh import ActorMesh
from zmesh._client.ports.streams import (
    ERROR,
    Inbox,
    ItemStream,
    Source,
    one_source_stream,
    send_stream_call,
)
from zmesh._errors import ActorStoppedError, SupervisionError, encode_error
from zmesh._service.dispatch import Attempt, Outcome, Request
from zmesh._service.routing import Session
from zmesh._wire import messages as w
from zmesh._wire.codec import Codec

if TYPE_CHECKING:
    from zmesh._service.client import ServiceClient
    from zmesh._service.service import Service


class RoutedSource(Source):
    """The source of a service stream; its attempts are the dispatcher's.

    It is the service client's part for one stream: it carries out the
    dispatcher's ``Send`` and ``Settle`` of its request (``start``,
    ``finish``) and reports what its replica does through the client.
    """

    __slots__ = ("attempt", "client", "req", "window")

    def __init__(self, rt: Runtime, inbox: Inbox, window: int) -> None:
        super().__init__(rt, inbox, 0)
        self.window = window
        self.client: ServiceClient | None = None
        self.req: Request | None = None
        self.attempt: Attempt | None = None  # the attempt whose StreamCall is out

    # ------------------------------------------------------------ the dispatcher's decisions

    def start(self, attempt: Attempt, mesh: ActorMesh[Any], return_rank: int) -> None:
        """Send ``attempt`` to ``mesh`` (a replica): its ``return_rank`` proc streams."""
        req = attempt.request
        if self.ended:  # closed before the dispatcher got to it
            self.attempt = None
            assert self.client is not None
            self.client.settled(attempt, Outcome.OK, None)
            return
        self.attempt = attempt
        refs = mesh._refs
        ref = refs[min(return_rank, len(refs) - 1)]
        payload, buffers = req.args
        deadline = time.monotonic() + (req.deadline - self.rt.loop.time())
        send_stream_call(
            self.rt, self, ref, mesh.actor, req.endpoint, payload, buffers, deadline,
            self.window, True,
        )  # fmt: skip

    def finish(self, error: BaseException | None) -> None:
        """The dispatcher ended the request; with ``error``, the reader gets it.

        A call still open (a timeout before the first item) is closed over
        there; the dispatcher gave its slot back as it decided this.
        """
        if error is None or self.ended:
            return
        self.attempt = None
        Source.cancel(self)
        Source._end(self, ERROR, error)

    # ------------------------------------------------------------ the runtime's side

    def set_exception(self, exc: BaseException) -> None:
        if self.ended:
            return
        attempt, self.attempt = self.attempt, None
        self.conn = None
        if attempt is None or self.client is None:
            Source._end(self, ERROR, exc)
            return
        broken = isinstance(exc, SupervisionError | ActorStoppedError)
        # The dispatcher re-sends it (``start`` again) or ends it (``finish``).
        self.client.settled(attempt, Outcome.BROKEN if broken else Outcome.ERROR, exc)

    def on_message(self, conn: Any, req: Any, msg: Any, frames: list[Any]) -> None:
        before = self.items
        super().on_message(conn, req, msg, frames)
        attempt = self.attempt
        if attempt is None or self.client is None:
            return
        if self.items != before:
            self.client.dispatcher.item(attempt)
        elif type(msg) is w.StreamAlive:
            # The producer waits for our credit: the replica is alive, the
            # silence is this reader's (it is not reading).
            self.client.dispatcher.alive(attempt)

    def _end(self, kind: int, value: Any) -> None:
        # The stream's own end (``StreamEnd``, a plain reply, an undecodable item).
        super()._end(kind, value)
        attempt, self.attempt = self.attempt, None
        if attempt is not None and self.client is not None:
            outcome = Outcome.ERROR if kind == ERROR else Outcome.OK
            self.client.settled(attempt, outcome, value if kind == ERROR else None)

    # ------------------------------------------------------------ the reader's side

    def cancel(self) -> None:
        if self.ended:
            return
        super().cancel()  # the generator closes over there
        self.attempt = None
        if self.req is not None and self.client is not None:
            self.client.cancel(self.req)


def open_service_stream(
    svc: Service,
    endpoint: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    timeout: float | None,
    session: Session | None,
    least_loaded: bool,
    window: int | None,
) -> ItemStream[Any]:
    """``svc.endpoint.call_one(...)`` on a generator endpoint: its stream of items.

    ``timeout`` bounds the wait for the first item (default: the service's
    ``request_timeout``) and then for each next one.

    Raises:
        EncodeError: at once, when an argument cannot be sent.
    """
    try:
        packed = Codec.pack(args, kwargs)
    except Exception as exc:
        raise encode_error(
            f"arguments of {endpoint!r} cannot be sent: {type(exc).__name__}: {exc}",
            exc,
            mesh=svc.name,
        ) from exc
    info = svc.endpoints[endpoint]
    win = window or info.window
    rt, home = _runtime.current()
    stream, src = one_source_stream(
        rt, home, win, timeout, lambda inbox: RoutedSource(rt, inbox, win), {"mesh": svc.name}
    )
    req_id = f"{svc._req_tag}-{next(svc._ids)}"

    def begin() -> None:
        assert isinstance(src, RoutedSource)
        if src.ended:  # closed before it started
            return
        try:
            client = svc._client_for(rt)
        except Exception as exc:  # a runtime that is closing: the stream says so
            Source._end(src, ERROR, exc)
            return
        submit_stream(
            client, src, endpoint, packed, timeout, session, info.retry, least_loaded, req_id
        )

    rt.dispatch(begin, here=home)
    return stream


def submit_stream(
    client: ServiceClient,
    src: RoutedSource,
    endpoint: str,
    packed: tuple[Any, list[Any]],
    timeout: float | None,
    session: Session | None,
    retry: bool,
    least_loaded: bool,
    req_id: str,
) -> None:
    """Make ``src``'s request and route it (on the client's loop)."""
    limit = timeout if timeout is not None else client.dispatcher.config.request_timeout
    now = client.rt.loop.time()
    req = Request(
        req_id, endpoint, now + limit, retry=retry, session=session,
        least_loaded=least_loaded, args=packed, sink=[src, None], start=now, stream=True,
    )  # fmt: skip
    src.client, src.req = client, req
    client.start(req)
