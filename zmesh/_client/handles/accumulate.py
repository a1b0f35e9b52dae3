"""Reductions: fold the replies of a mesh call into one value as they arrive.

``Accumulator(mesh.endpoint, identity, combine).accumulate(*args, **kwargs)``
is Monarch's: it calls every actor of the endpoint's mesh and folds each reply
into the running value the moment it arrives, on the caller's runtime loop,
so the caller holds one value, never all N replies. The first failure fails
the future (the rest of the replies are ignored), and so does an exception
``combine`` raises (as itself: it is the caller's code).

On a wide mesh (the tree path, ``zmesh._client.calls.tree``) with
``associative=True``, the folding starts where the replies are: each relay
folds its host's values (and a top relay its hosts') into one, so the caller
receives one value per top relay instead of one per actor
(``zmesh._host.proc.relayfold``). That needs ``combine(a, b)`` to take two values
of one kind in either order (a sum, a max, a merge of counts): it is then
applied to two partial folds. The identity is applied once, at the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from zmesh._client.calls import pending as _pending
from zmesh._client.calls import tree as _tree
from zmesh._client.calls.future import Future
from zmesh._client.calls.inflight import Sink
from zmesh._client.calls.launch import on_runtime
from zmesh._client.calls.runtime import Runtime
from zmesh._client.calls.treeanswers import FOLDED
from zmesh._client.handles.adverbs import EndpointRef
from zmesh._wire import pickling

if TYPE_CHECKING:
    from zmesh._typing import Adverbs

P = ParamSpec("P")
R = TypeVar("R")
A = TypeVar("A")


class Accumulator(Generic[P, R, A]):
    """Reduce a mesh call to one value: ``combine(...combine(identity, r0)..., rN)``.

    Args:
        endpoint: ``mesh.endpoint`` (any mesh or slice).
        identity: the value before the first reply.
        combine: ``(accumulated, reply) -> accumulated``; called once per
            reply, in arrival order (so it should be associative and
            commutative, as for Monarch).
        associative: ``combine`` also folds two folded values (``A`` is ``R``:
            sums, maxes, merges), so on a wide mesh the relays fold their
            hosts' replies first and far fewer messages reach the caller.

    Example::

        total = await Accumulator(mesh.value, 0, operator.add).accumulate()
    """

    def __init__(
        self, endpoint: Adverbs[P, R], identity: A, combine: Callable[[A, R], A],
        *, associative: bool = False,
    ):  # fmt: skip
        if not isinstance(endpoint, EndpointRef):
            raise TypeError(
                f"Accumulator needs an endpoint of a mesh (mesh.name), not {endpoint!r}"
            )
        self._endpoint: EndpointRef[R] = endpoint
        self._identity = identity
        self._combine = combine
        self._associative = associative
        self._blob: bytes | None = None  # combine, pickled once for the relays

    def accumulate(self, *args: P.args, **kwargs: P.kwargs) -> Future[A]:
        """Call every actor with these arguments; a future of the folded value."""
        ep = self._endpoint
        if ep._mesh._gate is not None and not _pending.draining():
            # Still spawning: its actors are not known yet. The call waits in the
            # mesh's gate, as a call_one would, and then reads them.
            redo = lambda: self.accumulate(*args, **kwargs)  # noqa: E731
            return _pending.defer(ep._mesh, redo, "future", (ep._mesh.proc_mesh, ep._name))
        refs = ep._mesh._refs
        payload, buffers = ep._pack(args, kwargs)
        msg = ep._call_msg(payload)
        combine, name = self._combine, ep._name
        wide = bool(refs) and _tree.wide(ep._mesh)
        blob = self._pickled() if wide and self._associative else None

        def start(rt: Runtime, fut: Sink) -> None:
            acc = self._identity
            remaining = len(refs)

            def take(ok: bool, value: Any) -> bool:
                """Fold one answer in; ``False`` once the result is settled."""
                nonlocal acc
                if fut.done():
                    return False
                if not ok:
                    fut.set_exception(value)
                    return False
                try:
                    acc = combine(acc, value)
                except Exception as exc:  # the caller's own function: its error, as is
                    fut.set_exception(exc)
                    return False
                return True

            def deliver(i: int, ok: bool, value: Any) -> None:
                nonlocal remaining
                if take(ok, value):
                    remaining -= 1
                    if remaining == 0:
                        fut.set_result(acc)

            def fold(ok: bool, value: Any) -> None:  # a relay's folded value
                take(ok, value)

            def counted(i: int, ok: bool, value: Any) -> None:
                nonlocal remaining
                if ok and value is FOLDED:  # in a folded value already
                    remaining -= 1
                    if remaining == 0 and not fut.done():
                        fut.set_result(acc)
                    return
                deliver(i, ok, value)

            if not refs:
                fut.set_result(acc)
            elif wide:
                reduce = (blob, fold) if blob is not None else None
                _tree.send(rt, refs, msg, buffers, counted, ep._timeout, ep._block, reduce)
            else:
                rt.send(refs, msg, buffers, deliver, ep._timeout, ep._block)

        return on_runtime(start, (ep._mesh.proc_mesh, name))

    def _pickled(self) -> bytes | None:
        """``combine`` pickled for the relays (``None``: it does not pickle; the
        caller folds everything, as on a small mesh)."""
        if self._blob is None:
            try:
                self._blob = pickling.dumps(self._combine, lambda buf: True)[0]
            except Exception:
                self._blob = b""
        return self._blob or None
