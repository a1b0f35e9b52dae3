"""Running one endpoint call: what a proc does, and the in-process transport too.

* ``invoke(fn, instance, args, kwargs)`` calls the endpoint; a ``TypeError``
  raised by the call itself (no frame inside the endpoint) is
  ``BadArguments``, the arguments did not fit its signature, not an error of
  the user's code;
* ``invoke_sync`` does the same in a worker thread, carrying a
  ``BaseException`` that is no ``Exception`` back as a ``Raised`` value (through
  a future, ``GeneratorExit`` would be thrown into the awaiting task as a
  close, and asyncio treats ``SystemExit`` and ``KeyboardInterrupt`` as its own);
* ``returned(result, ...)`` and ``raised(exc, ...)`` say how one call of an
  endpoint ended (an ``Outcome``), by the rules every runner keeps (the
  proc's mailbox, its group fast path, the in-process mesh): what counts as
  bad arguments, a caller's cancel, the actor's own stop, ``SystemExit`` or
  an error, and what each does to the endpoint's counters. What an outcome
  then becomes (a ``Reply``, a ``Failure``, the proc's exit, an exception
  raised in the caller's process) is each runner's.

Each runner awaits the endpoint in its own frame and hands what came out to
these two: a coroutine between them would be one more frame on every call,
and it would change what a ``GeneratorExit`` thrown into the call does
(Python closes the frames it passes through, so only the outermost one can
still answer the call).
"""

from __future__ import annotations

import asyncio
import enum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from zmesh._shared.stats import EndpointCounters


class BadArguments(Exception):
    """The arguments did not fit the endpoint's signature (``__cause__`` says how)."""


class Raised:
    """A ``BaseException`` a sync endpoint raised, carried back as a value."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Sent:
    """A sync call's result when the thread that ran it has answered its caller itself."""

    __slots__ = ("at",)

    def __init__(self, at: int) -> None:
        self.at = at  # when (``zmesh._shared.stats`` clock): the call's end, for its latency


def invoke(fn: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``fn(instance, *args, **kwargs)``; ``BadArguments`` if the call did not fit."""
    try:
        return fn(instance, *args, **kwargs)
    except TypeError as exc:
        # No frame below this one: the call never entered the endpoint.
        tb = exc.__traceback__
        if tb is not None and tb.tb_next is None:
            raise BadArguments() from exc
        raise


def invoke_sync(fn: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``invoke`` for a worker thread: a non-``Exception`` comes back as ``Raised``."""
    try:
        return invoke(fn, instance, args, kwargs)
    except Exception:
        raise
    except BaseException as exc:
        return Raised(exc)


def cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is a real cancellation of the running task (the actor stops).

    A ``CancelledError`` an endpoint raises while its own task is not being
    cancelled (a task of the user's was) is the endpoint's error, not ours.
    """
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return cancelling is None or cancelling() > 0


class Ended(enum.IntEnum):
    """How a call of an endpoint ended (``Outcome.kind``)."""

    RETURNED = 0  # a result (``Outcome.value``; a ``Sent`` if it is answered already)
    BAD_ARGUMENTS = 1  # the arguments did not fit (value: the ``BadArguments``)
    RAISED = 2  # the endpoint raised (value: the exception)
    EXITED = 3  # the endpoint raised ``SystemExit`` (value: it): its proc exits
    STOPPED = 4  # its task was cancelled: the actor stops (value: the cancellation, to re-raise)
    CANCELLED = 5  # its caller cancelled it: not an error; its result, if any, goes nowhere
    ANSWERED = 6  # its thread answered it, then the actor stopped (value: the cancellation)


RETURNED, BAD_ARGUMENTS, RAISED, EXITED, STOPPED, CANCELLED, ANSWERED = Ended


class Outcome:
    """How one call of an endpoint ended (``kind``), and its result or exception (``value``)."""

    __slots__ = ("kind", "value")

    def __init__(self, kind: Ended, value: Any) -> None:
        self.kind = kind
        self.value = value

    @property
    def why(self) -> str:
        """What a ``BAD_ARGUMENTS`` outcome's caller is told."""
        return f"bad arguments: {self.value.__cause__}"

    def __repr__(self) -> str:
        return f"<Outcome {self.kind.name} {self.value!r}>"


class Running(Protocol):
    """A call its caller may cancel (``zmesh._host.proc.cancelling.Running``)."""

    cancelled: bool

    def claim(self) -> bool: ...


class Owner(Protocol):
    """Whoever runs the actor: ``stopped`` once it is being stopped."""

    stopped: bool


def returned(
    result: Any, counters: EndpointCounters | None = None, t0: int = 0, run: Running | None = None
) -> Outcome:
    """How a call that started at ``t0`` (``counters.begin()``) ended when its
    endpoint returned ``result`` (or the worker thread running it gave it back)."""
    if type(result) is Sent:  # answered from the actor's thread, at its own time
        if counters is not None:
            counters.end(t0, 0, result.at)
        return Outcome(RETURNED, result)
    if counters is not None:
        counters.end(t0, 0)
    if run is not None and run.cancelled:  # it ran to its end all the same: its result goes nowhere
        return Outcome(CANCELLED, result)
    return Outcome(RETURNED, result)


def raised(
    exc: BaseException, counters: EndpointCounters | None = None, t0: int = 0,
    run: Running | None = None, owner: Owner | None = None, in_task: bool = True,
) -> Outcome:  # fmt: skip
    """How a call that started at ``t0`` ended when ``exc`` came out of its endpoint.

    ``run``, if given, is how its caller cancels it: a call cancelled while
    its ``owner`` is not stopping ends ``CANCELLED``, and one whose thread
    answered it before the owner stopped, ``ANSWERED``. ``in_task``: ``exc``
    reached the task the endpoint ran in, so a cancellation may be that
    task's own (the actor stops); otherwise (a worker thread's, read in a
    callback) a ``CancelledError`` is the endpoint's error like any other.
    """
    if isinstance(exc, BadArguments):
        out = Outcome(BAD_ARGUMENTS, exc)
    elif run is not None and not run.claim():  # its actor's thread answered; then it stopped
        out = Outcome(ANSWERED, exc)
    elif run is not None and run.cancelled and not (owner is not None and owner.stopped):
        out = Outcome(CANCELLED, exc)  # its caller cancelled it: not an error
    elif in_task and cancelled(exc):
        out = Outcome(STOPPED, exc)
    elif isinstance(exc, SystemExit):
        out = Outcome(EXITED, exc)
    else:
        out = Outcome(RAISED, exc)
    if counters is not None:
        count(counters, out.kind, t0)
    return out


def count(counters: EndpointCounters, kind: Ended, t0: int) -> None:
    """Count a call that started at ``t0`` (``counters.begin()``) and ended ``kind``.

    An actor's stop takes the call out of flight without counting it; a
    caller's cancel counts as a call, not an error.
    """
    if kind is STOPPED:
        counters.in_flight -= 1
    else:
        counters.end(t0, 1 if BAD_ARGUMENTS <= kind <= EXITED else 0)
