"""The asyncio client: the core's retry loop driven with awaits over
grpc.aio, with outcome batching and the breaker cache as background tasks."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from types import TracebackType
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional, ParamSpec, TypeVar, Union

import grpc
import grpc.aio

from retrypolicy.v1 import retry_policy_service_pb2 as rpb
from retrypolicy.v1 import retry_policy_service_pb2_grpc as rpb_grpc

from . import _loop
from ._dial import Address, channel_options, target
from ._core import (
    _CURRENT,
    Core,
    Metadata,
    Options,
    OutcomeQueue,
    PendingOutcome,
    Sent,
    WatchSession,
    bearer,
    drop_inherited,
    flush,
    follow_forks,
    report_request,
    settings,
    value_of,
)
from ._model import Attempt, BreakerState, Call, EventHook, Result, Stats

if TYPE_CHECKING:
    from typing_extensions import Unpack

P = ParamSpec("P")
T = TypeVar("T")

#: sleep(seconds) waits; cancelling the task interrupts it.
AsyncSleep = Callable[[float], Awaitable[None]]

# Whether an AsyncClient has run grpc.aio in this process, and whether this
# process is a child forked after one did. grpc.aio keeps one poller thread
# per process, which a child does not inherit: every grpc.aio call in such a
# child hangs, on a fresh channel too. There the client talks to policyd
# over a blocking channel instead, its calls run in worker threads
# (_ThreadedStub), and a channel the caller gave is refused.
_aio_used = False
_aio_forked = False

_FORKED_AIO = (
    "policyd_client: grpc.aio was used in this process's parent before os.fork(), and cannot run in the "
    "child, so a grpc.aio channel given to AsyncClient cannot be used here; give an address (the client "
    "then talks over a blocking channel in threads), or create it only in the child (Celery: "
    "worker_process_init)"
)


class _ThreadedStub:
    """The RetryPolicyService calls AsyncClient makes, over a blocking
    channel, each run in a worker thread so the event loop never blocks:
    for a child forked after grpc.aio ran in its parent."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = rpb_grpc.RetryPolicyServiceStub(channel)

    async def Admit(self, req: rpb.AdmitRequest, **kw: Any) -> rpb.AdmitResponse:
        return await asyncio.to_thread(self._stub.Admit, req, **kw)

    async def NextDelay(self, req: rpb.NextDelayRequest, **kw: Any) -> rpb.NextDelayResponse:
        return await asyncio.to_thread(self._stub.NextDelay, req, **kw)

    async def ClaimKey(self, req: rpb.ClaimKeyRequest, **kw: Any) -> rpb.ClaimKeyResponse:
        return await asyncio.to_thread(self._stub.ClaimKey, req, **kw)

    async def CompleteKey(self, req: rpb.CompleteKeyRequest, **kw: Any) -> rpb.CompleteKeyResponse:
        return await asyncio.to_thread(self._stub.CompleteKey, req, **kw)

    async def ReportOutcome(self, req: rpb.ReportOutcomeRequest, **kw: Any) -> rpb.ReportOutcomeResponse:
        return await asyncio.to_thread(self._stub.ReportOutcome, req, **kw)

    def WatchBreakers(self, req: rpb.WatchBreakersRequest, **kw: Any) -> "_ThreadedStream":
        return _ThreadedStream(self._stub.WatchBreakers(req, **kw))


class _ThreadedStream:
    """A blocking server stream read in a worker thread, as an async
    iterator with cancel(), like a grpc.aio stream."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._it = iter(stream)

    def __aiter__(self) -> "_ThreadedStream":
        return self

    async def __anext__(self) -> rpb.WatchBreakersResponse:
        msg = await asyncio.to_thread(next, self._it, None)
        if msg is None:
            raise StopAsyncIteration
        return msg  # type: ignore[no-any-return]

    def cancel(self) -> None:
        self._stream.cancel()


def _after_fork_in_child() -> None:
    global _aio_forked
    _aio_forked = _aio_forked or _aio_used


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class AsyncClient:
    """Runs retry loops with policyd's decisions on an asyncio event loop.
    Safe for concurrent use by many tasks of one loop; nothing it does blocks
    the loop. Use it as an async context manager, or ``await close()`` to
    flush the outcomes it still holds.

    The arguments are those of :class:`Client`, except that ``channel`` is a
    ``grpc.aio.Channel`` and ``sleep`` and ``reconnect_sleep`` are coroutine
    functions ``sleep(seconds)`` (default ``asyncio.sleep``), interrupted by
    cancelling the task. The channel (when dialled from ``address``) and the
    background tasks start on the running loop at ``__aenter__``,
    :meth:`start` or the first call.
    """

    def __init__(
        self,
        address: Optional[Address] = None,
        *,
        tenant: str,
        channel: Optional[grpc.aio.Channel] = None,
        token: Optional[str] = None,
        credentials: Optional[grpc.ChannelCredentials] = None,
        sleep: Optional[AsyncSleep] = None,
        reconnect_sleep: Optional[AsyncSleep] = None,
        now: Optional[Callable[[], float]] = None,
        rand: Optional[Callable[[], float]] = None,
        logger: Optional[logging.Logger] = None,
        on_event: Optional[EventHook] = None,
        **options: Unpack[Options],
    ) -> None:
        if (address is None) == (channel is None):
            raise ValueError("policyd_client: give exactly one of address and channel")
        self._core = Core(settings(tenant, options), now, rand, logger, on_event)
        self._settings = self._core.settings
        self._now = self._core.now
        self._sleep: AsyncSleep = sleep or asyncio.sleep
        self._reconnect_sleep: AsyncSleep = reconnect_sleep or asyncio.sleep
        self._address = None if address is None else target(address)  # a bad list fails here
        self._owned = channel is None
        self._credentials = credentials
        self._md = bearer(token)
        self._channel: Any = channel  # grpc.aio.Channel; a grpc.Channel in a forked child
        self._stub: Optional[rpb_grpc.RetryPolicyServiceStub] = None
        self._reporter: Optional[_AsyncReporter] = None
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._closed = False
        self._changed: Optional[asyncio.Event] = None
        follow_forks(self)

    def _after_fork_in_child(self) -> None:
        """Runs in a child after os.fork(): drops the parent's channel,
        tasks (they belong to the parent's event loop) and queued outcomes
        (the parent sends those), so that first use in the child starts
        afresh on the child's loop. A channel the caller gave cannot be
        redialled; it is kept, with a warning."""
        self._core.after_fork()
        if self._started:
            drop_inherited(self._core, self._owned, self._channel, self._stub, self._reporter, *self._tasks)
            if self._owned:
                self._channel = None
        self._stub, self._reporter, self._tasks = None, None, []
        self._changed = None
        self._started = False

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Dials policyd (when given an address) and starts the background
        tasks on the running loop. Idempotent; call() does it on first use."""
        self._io()

    def _io(self) -> tuple["_AsyncReporter", rpb_grpc.RetryPolicyServiceStub]:
        """Returns the reporter and the stub, starting them on the running
        loop on first use."""
        if self._reporter is not None and self._stub is not None:
            return self._reporter, self._stub
        if self._closed:
            raise RuntimeError("policyd_client: the client is closed")
        stub: Any
        if _aio_forked:
            if not self._owned:
                raise RuntimeError(_FORKED_AIO)
            if self._credentials is not None:
                self._channel = grpc.secure_channel(self._address, self._credentials, options=channel_options())  # type: ignore[arg-type]
            else:
                self._channel = grpc.insecure_channel(self._address, options=channel_options())  # type: ignore[arg-type]
            stub = _ThreadedStub(self._channel)
        else:
            global _aio_used
            _aio_used = True
            if self._channel is None:
                if self._credentials is not None:
                    self._channel = grpc.aio.secure_channel(self._address, self._credentials, options=channel_options())  # type: ignore[arg-type]
                else:
                    self._channel = grpc.aio.insecure_channel(self._address, options=channel_options())  # type: ignore[arg-type]
            stub = rpb_grpc.RetryPolicyServiceStub(self._channel)
        self._started = True
        self._changed = asyncio.Event()
        self._core.cache.on_change = self._on_change
        reporter = _AsyncReporter(stub, self._core, self._md)
        self._tasks.append(asyncio.create_task(reporter.run(), name="policyd-outcomes"))
        if self._settings.watch:
            self._tasks.append(asyncio.create_task(self._watch(stub), name="policyd-watch"))
        self._stub, self._reporter = stub, reporter
        return reporter, stub

    async def __aenter__(self) -> "AsyncClient":
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        await self.close()

    async def close(self, timeout: Optional[float] = None) -> int:
        """Stops watching breakers and flushes every queued outcome, giving
        policyd up to ``timeout`` seconds (default ``close_timeout``, 1 s),
        then closes the channel if the client dialled it; see
        :meth:`Client.close`. Closing twice does nothing."""
        if self._closed:
            return 0
        self._closed = True
        reporter = self._reporter
        if reporter is None:
            return 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._settings.close_timeout if timeout is None else timeout)
        reporter.stop()
        for t in self._tasks[1:]:
            t.cancel()  # the watch: nothing to lose
        await asyncio.wait(self._tasks, timeout=max(deadline - loop.time(), 0.001))
        lost = await reporter.drain(deadline)
        for t in self._tasks:
            t.cancel()
        if self._owned and self._channel is not None:
            closing = self._channel.close()
            if closing is not None:  # grpc.aio's; a blocking channel closes at once
                await closing
        return lost

    def _on_change(self) -> None:
        # Called by the watch task, on the loop: wake every waiter.
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    async def _wait_cache(self, predicate: Callable[[], bool], timeout: Optional[float]) -> bool:
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            changed = self._changed
            assert changed is not None
            if predicate():
                return True
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            try:
                await asyncio.wait_for(changed.wait(), left)
            except asyncio.TimeoutError:
                return predicate()

    async def ready(self, timeout: Optional[float] = None) -> bool:
        """Waits until the client follows policyd's breakers (the
        WatchBreakers snapshot has arrived) or ``timeout`` seconds pass, and
        says whether it does. False at once when ``watch`` is off."""
        if not self._settings.watch:
            return False
        return await self._wait_cache(lambda: self._core.cache.live, timeout)

    def breaker_state(self, target: str) -> Optional[BreakerState]:
        """Returns target's breaker state as the cache sees it, None while the
        cache cannot answer."""
        return self._core.cache.state(target)

    async def wait_breaker_state(self, target: str, state: BreakerState, timeout: Optional[float] = None) -> bool:
        """Waits until the cache shows target's breaker in ``state`` or
        ``timeout`` seconds pass; says whether it does."""
        return await self._wait_cache(lambda: self._core.cache.state(target) == state, timeout)

    def stats(self) -> Stats:
        """Returns a snapshot of the client's counters."""
        return self._core.stats()

    # -- the loop ------------------------------------------------------------

    async def call(self, call: Call, fn: Callable[[Attempt], Awaitable[T]]) -> Result[T]:
        """Runs the coroutine function ``fn`` until it succeeds or policyd
        (or the local policy, when policyd cannot answer in time) says to
        stop; the loop of :meth:`Client.call`. Each attempt runs under its
        per-attempt timeout (``asyncio.wait_for``): an attempt that overruns
        it is cancelled and counts as a transport timeout.

        Cancelling the task running call() reports the call as DEAD_LETTER
        (DEADLINE) and re-raises CancelledError.
        """
        if self._closed:
            raise RuntimeError("policyd_client: the client is closed")
        st = self._core.begin(call, fn)
        reporter, stub = self._io()
        loop = _loop.run(self._core, st)
        reply: Any = None
        while True:
            try:
                effect = loop.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                reply = await self._do(effect, fn, reporter, stub)
            except asyncio.CancelledError:
                # The loop reports the cut; what it yields then is reports.
                try:
                    effect = loop.throw(_loop.CallCancelled())
                    while True:
                        assert isinstance(effect, _loop.Report)
                        reporter.add(effect.outcome)
                        effect = loop.send(None)
                except StopIteration:
                    pass
                raise

    async def _do(
        self, effect: _loop.Effect, fn: Callable[[Attempt], Awaitable[Any]], reporter: "_AsyncReporter",
        stub: rpb_grpc.RetryPolicyServiceStub,
    ) -> Any:
        """Carries out one effect of the loop; returns its answer."""
        dt = self._settings.decision_timeout
        if isinstance(effect, _loop.Report):
            reporter.add(effect.outcome)
            return None
        if isinstance(effect, _loop.Invoke):
            a = effect.attempt
            loop = asyncio.get_running_loop()
            start, started = self._now(), loop.time()
            token = _CURRENT.set(a)  # copied into the task wait_for creates
            try:
                value = await asyncio.wait_for(fn(a), a.timeout)
            except Exception as e:  # every failure of fn is classified
                timed_out = isinstance(e, asyncio.TimeoutError) and loop.time() - started >= a.timeout
                return _loop.Invoked(error=e, latency=max(self._now() - start, 0.0), timed_out=timed_out)
            finally:
                _CURRENT.reset(token)
            return _loop.Invoked(value=value, latency=max(self._now() - start, 0.0))
        if isinstance(effect, _loop.Sleep):
            await self._sleep(effect.seconds)
            return False  # cancellation arrives as CancelledError
        if isinstance(effect, _loop.Admit):
            try:
                return await stub.Admit(effect.request, timeout=effect.timeout or dt, metadata=self._md)
            except Exception as e:
                return e
        if isinstance(effect, _loop.Claim):
            try:
                return await stub.ClaimKey(effect.request, timeout=dt, metadata=self._md)
            except Exception as e:
                return e
        if isinstance(effect, _loop.Complete):
            try:
                return await stub.CompleteKey(effect.request, timeout=dt, metadata=self._md)
            except Exception as e:
                self._core.log.warning("policyd_client: policyd did not record the idempotency key's outcome: %s", e)
                return e
        # Decide: successes queued before this failure reach the breaker
        # first; both share the decision timeout.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + dt
        await reporter.flush_now(dt)
        try:
            return await stub.NextDelay(effect.request, timeout=max(deadline - loop.time(), 0.001), metadata=self._md)
        except Exception as e:
            return e

    def retry(
        self,
        target: str,
        *,
        idempotent: bool = False,
        run_id: str = "",
        deadline_after: Optional[float] = None,
        submission: Optional[Callable[..., tuple[str, Union[bytes, str]]]] = None,
    ) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
        """Decorates a coroutine function so every call of it runs through
        :meth:`call`; see :meth:`Client.retry`::

            @aclient.retry(target="geo", idempotent=True)
            async def geocode(address: str) -> dict: ...
        """

        def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
            @functools.wraps(fn)
            async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                spec = self._core.decorated_call(target, idempotent, run_id, deadline_after, submission, args, kwargs)
                return value_of(await self.call(spec, lambda _a: fn(*args, **kwargs)))

            return wrapper

        return decorate


    # -- the breaker cache ---------------------------------------------------

    async def _watch(self, stub: rpb_grpc.RetryPolicyServiceStub) -> None:
        """Keeps the cache in step with policyd until close (which cancels
        this task), reconnecting with jittered, capped backoff."""
        failures = 0
        while True:
            if await self._follow(stub):
                failures = 0
            self._core.cache.down()
            await self._reconnect_sleep(self._core.reconnect_delay(failures))
            failures += 1

    async def _follow(self, stub: rpb_grpc.RetryPolicyServiceStub) -> bool:
        """Runs one WatchBreakers stream; says whether it got as far as a
        complete snapshot."""
        session = WatchSession(self._core.cache, self._core.chains)
        stream = stub.WatchBreakers(session.request(self._settings.tenant), metadata=self._md)
        try:
            async for msg in stream:
                session.feed(msg)
        except grpc.RpcError as e:  # the stream broke
            session.failed(e.code() if hasattr(e, "code") else None)
        except Exception:
            pass
        finally:
            stream.cancel()
        return session.complete


class _AsyncReporter:
    """The outcome reporter of :class:`AsyncClient`: as the sync client's,
    with a task instead of a thread."""

    def __init__(self, stub: rpb_grpc.RetryPolicyServiceStub, core: Core, md: Metadata) -> None:
        self._stub = stub
        self._md = md
        self._core = core
        self._q = OutcomeQueue(core)
        self._every = core.settings.flush_interval
        self._rpc_timeout = 4 * core.settings.decision_timeout
        self._wake = asyncio.Event()
        self._stopped = False
        # Workers waiting for the queue to be sent (flush_now).
        self._requests: list[asyncio.Future[None]] = []

    def add(self, o: PendingOutcome) -> None:
        if self._q.add(o):
            self._wake.set()

    async def flush_now(self, timeout: float) -> None:
        """Asks the reporter task to send what is queued and waits until it
        has, or timeout seconds pass."""
        if self._stopped:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._requests.append(done)
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout)
        except asyncio.TimeoutError:
            pass

    def _release(self, requests: list[asyncio.Future[None]]) -> None:
        for r in requests:
            if not r.done():
                r.set_result(None)

    def stop(self) -> None:
        self._stopped = True
        self._release(self._requests)
        self._requests = []
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        tick = loop.time() + self._every
        backoff = False  # the last flush failed: wait for the tick
        while True:
            while not self._stopped and not self._requests and (backoff or len(self._q) < self._q.size):
                left = tick - loop.time()
                if left <= 0:
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), left)
                except asyncio.TimeoutError:
                    pass
            if self._stopped:
                return
            requests, self._requests = self._requests, []
            if loop.time() >= tick:
                tick = loop.time() + self._every
            backoff = not await self._flush(self._rpc_timeout)
            self._release(requests)

    async def _flush(self, timeout: float) -> bool:
        """Drives the core's flush with awaited ReportOutcome calls."""
        steps = flush(self._core, self._q)
        err: Sent = None
        while True:
            try:
                batch = steps.send(err)
            except StopIteration as done:
                return bool(done.value)
            try:
                err = await self._stub.ReportOutcome(report_request(batch), timeout=timeout, metadata=self._md)
            except Exception as e:
                err = e

    async def drain(self, deadline: float) -> int:
        loop = asyncio.get_running_loop()
        while True:
            left = deadline - loop.time()
            if left > 0 and await self._flush(min(self._rpc_timeout, left)):
                return 0
            left = deadline - loop.time()
            if left <= 0:
                return self._q.give_up()
            await asyncio.sleep(min(0.05, left))
