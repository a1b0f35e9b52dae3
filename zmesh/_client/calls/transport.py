"""Transports: what carries a call, built once as a ``CallSpec``, to its actors.

One seam with two verbs, as httpx's ``BaseTransport.handle_request`` is one
seam that several transports plug into:

* ``submit(target, spec)``: one call to one actor, from the caller's
  thread; the ``Future`` of its answer.
* ``fan_out(targets, spec, deliver)``: one message to every actor of
  ``targets``, encoded once; each target's answer goes to
  ``deliver(i, ok, value)`` (``None``: one-way, no answers).

========================================  ==================  ============================
transport                                 submit              fan_out
========================================  ==================  ============================
the runtime (``Runtime``), on its loop    its socket to the   one message per proc
                                          proc
a thread's lane (``Lane``), no loop       its own socket, or  —
                                          the I/O thread
the tree (``Tree``), a wide mesh          —                   one ``Relay`` per host
the in-process mesh (``LocalRanks``)      the mesh's loop     each rank
========================================  ==================  ============================

Which one a call of an endpoint takes is decided in one place, the
endpoint reference's dispatch (``EndpointRef._send``); the other exits a
call can take there are not transports of a built call: the gate of a mesh
still spawning, a response port, a generator's stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

if TYPE_CHECKING:
    from zmesh._client.calls.future import Future
    from zmesh._client.calls.inflight import CallSpec

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

# Where a fan-out's answers go: ``deliver(index, ok, value)``, once per target.
Deliver: TypeAlias = Callable[[int, bool, Any], None]


class Submits(Protocol[T_contra]):
    """A transport of calls to one actor (``T_contra``: how it names the actor)."""

    def submit(self, target: T_contra, spec: CallSpec) -> Future[Any]:
        """Send ``spec`` to ``target``'s actor; the future of its answer.

        Raises:
            EncodeError: the message cannot be sent (over the size limit).
        """
        ...


class FansOut(Protocol[T]):
    """A transport of one message to several actors (``T``: how it names an actor)."""

    def fan_out(self, targets: list[T], spec: CallSpec, deliver: Deliver | None) -> None:
        """Send ``spec`` to every actor of ``targets``, encoded once; each answer
        to ``deliver`` (``None``: a one-way message, no answers)."""
        ...


class Transport(Submits[T], FansOut[T], Protocol[T]):
    """Both verbs: the runtime and the in-process mesh."""
