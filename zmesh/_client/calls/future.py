"""``zmesh.Future``: awaitable in asyncio, ``.get()`` from plain code."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from zmesh._client.calls.callfailure import for_call
from zmesh._errors import CallTimeoutError
from zmesh._shared.aio import running_loop

if TYPE_CHECKING:
    from zmesh._client.calls.runtime import ProcRef

T = TypeVar("T")


class Future(Generic[T]):
    """The eventual result of a zmesh operation.

    ``await fut`` inside asyncio (any loop), or ``fut.get(timeout=...)`` from
    synchronous code. The operation is already under way when you hold it.

    A call from a thread with no loop on the thread's own lane is a
    subclass, ``zmesh._client.calls.synccall.SyncCall``, whose ``.get()`` drives the
    lane's socket itself, with no thread in between.
    """

    __slots__ = ("_about", "_afut", "_cfut", "_mesh", "_withdraw")

    def __init__(
        self,
        afut: asyncio.Future[T] | None = None,
        cfut: concurrent.futures.Future[T] | None = None,
        about: tuple[ProcRef | str, str] | None = None,
        withdraw: Callable[[], None] | None = None,
        mesh: Any = None,
    ) -> None:
        self._afut = afut
        self._cfut = cfut
        # What the result comes from, for the context of a timeout: the
        # proc (one target) or the mesh name (many), and the endpoint.
        self._about = about
        # Cancels a call to one actor whose answer goes to ``cfut`` (already
        # sent), from any thread; an ``afut``'s own cancel does that.
        self._withdraw = withdraw
        # The actor mesh of an endpoint call: a failure because its rank is
        # gone is given in Monarch's words (zmesh._client.calls.callfailure).
        self._mesh = mesh

    def __await__(self) -> Generator[Any, None, T]:
        # Not a generator itself: handing out the inner future's iterator
        # saves a generator and a delegation step on every await.
        afut = self._afut
        if afut is not None and afut.get_loop() is running_loop():
            if self._mesh is None:
                return afut.__await__()
            return self._worded(afut.__await__())
        return self._worded(asyncio.wrap_future(self._concurrent()).__await__())

    def _worded(self, waiting: Generator[Any, None, T]) -> Generator[Any, None, T]:
        try:
            return (yield from waiting)
        except Exception as exc:
            failure = self._failure(exc)
            if failure is exc:
                raise
            raise failure from None

    def _failure(self, exc: BaseException) -> BaseException:
        """``exc`` as the caller gets it: in Monarch's words for a call whose rank is gone."""
        if self._mesh is None or self._about is None:
            return exc
        return for_call(exc, self._mesh, self._about[1])

    def get(self, timeout: float | None = None) -> T:
        """Block until the result is ready and return it (or raise its error).

        Args:
            timeout: seconds to wait; ``None`` waits as long as it takes.

        Ctrl+C (``KeyboardInterrupt``) while it waits cancels the operation
        (``cancel()``) before it propagates.

        Raises:
            CallTimeoutError: the timeout passed first (the operation goes on).
            concurrent.futures.CancelledError: the operation was cancelled.
            RuntimeError: called from the thread of the loop that must
                produce the result (use ``await`` there).
        """
        if self._afut is not None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._afut.get_loop():
                # Nothing will ever wait for it: cancel it, so that a spawn
                # this refers to leaves no mesh behind.
                self._afut.cancel()
                raise RuntimeError(
                    "Future.get() would block the event loop it runs on: use 'await' inside "
                    "async code (the operation was cancelled)"
                )
        cfut = self._concurrent()
        try:
            return cfut.result(timeout)
        except concurrent.futures.TimeoutError:
            if cfut.done():  # the result is an error that is a TimeoutError
                raise
            raise self._timeout_error(timeout) from None
        except KeyboardInterrupt:  # Ctrl+C: nobody waits for it any more
            self.cancel()
            raise
        except Exception as exc:
            failure = self._failure(exc)
            if failure is exc:
                raise
            raise failure from None

    def cancel(self) -> bool:
        """Cancel the operation unless it has ended; whether it was cancelled.

        A call to one actor (``call_one``, a direct call, ``choose``) is
        cancelled in its proc too: dropped if it has not started, else an
        ``async`` endpoint gets ``CancelledError`` where it awaits, and a
        sync endpoint, which cannot be interrupted, runs to its end with its
        result dropped. Cancelling the task that awaits this future, or
        Ctrl+C in ``.get()``, does the same. Other operations (a fan-out
        ``call``, a spawn) stop being waited for; what they started goes on.

        Returns:
            ``False`` when the result (or error) was there already, or the
            operation cannot be cancelled from this thread; else ``True``,
            and ``await``/``.get()`` raise ``CancelledError``.
        """
        if self.done():
            return False
        afut = self._afut
        if afut is not None:
            loop = afut.get_loop()
            if running_loop() is loop:
                afut.cancel()
            else:
                loop.call_soon_threadsafe(afut.cancel)
            return True
        cfut = self._cfut
        if cfut is None:
            return False
        if cfut.cancel():  # not handed to the runtime's loop yet: it is never sent
            return True
        if self._withdraw is None:
            return False
        self._withdraw()
        return True

    def _timeout_error(self, timeout: float | None) -> CallTimeoutError:
        about = self._about
        if about is None:
            return CallTimeoutError(f"no result within {timeout}s")
        target, endpoint = about
        message = f"{endpoint!r}: no result within {timeout}s (the call goes on; .cancel() ends it)"
        if isinstance(target, str):
            return CallTimeoutError(message, mesh=target)
        return CallTimeoutError(
            message, mesh=target.mesh, rank=target.rank, host=target.host,
            log_path=target.log_path or None,
        )  # fmt: skip

    def done(self) -> bool:
        """Whether the result (or error) is ready."""
        f = self._afut if self._afut is not None else self._cfut
        return f is not None and f.done()

    def _concurrent(self) -> concurrent.futures.Future[T]:
        if self._cfut is None:
            afut = self._afut
            assert afut is not None
            self._cfut = asyncio.run_coroutine_threadsafe(_wait(afut), afut.get_loop())
        return self._cfut

    def __repr__(self) -> str:
        return f"<zmesh.Future {'done' if self.done() else 'pending'}>"

    if not TYPE_CHECKING:  # to a checker, `fut.incr` is the error it is

        def __getattr__(self, name: str) -> Any:
            # Only for names a Future lacks: `mesh.incr` on a forgotten await/.get().
            if name.startswith("_"):
                raise AttributeError(name)
            raise future_attribute_error(name)


async def _wait(afut: asyncio.Future[T]) -> T:
    return await afut


def future_attribute_error(name: str) -> AttributeError:
    """``fut.incr`` on a future: the value is not there yet; say how to get it."""
    return AttributeError(
        f"'Future' object has no attribute {name!r}: this is a future, not its value. "
        f"Did you forget 'await' or '.get()'? e.g. mesh = await Cls.options().as_actor() "
        f"or mesh = Cls.options().as_actor().get(), then mesh.{name}"
    )
