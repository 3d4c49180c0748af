"""The asyncio client: retry loops over grpc.aio, with outcome batching and
the breaker cache as background tasks."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
from types import TracebackType
from typing import Awaitable, Callable, Optional, ParamSpec, TypeVar, Union

import grpc
import grpc.aio

from retrypolicy.v1 import retry_policy_service_pb2 as rpb
from retrypolicy.v1 import retry_policy_service_pb2_grpc as rpb_grpc

from ._core import (
    _CURRENT,
    follow_forks,
    inherit,
    COOLDOWN,
    CachedBreaker,
    CallState,
    Core,
    Metadata,
    PendingOutcome,
    Settings,
    admit_from_cache,
    bearer,
    cached_from_pb,
    decision_from_pb,
    describe,
    from_duration,
    report_is_transient,
    stop_reason,
)
from ._model import Attempt, BreakerState, Call, Cancelled, Disposition, Result, Stats, StopReason
from .errors import ClassifiedFailure, RetryError, classify_exception
from .fallback import Decision

P = ParamSpec("P")
T = TypeVar("T")

#: sleep(seconds) waits; cancelling the task interrupts it.
AsyncSleep = Callable[[float], Awaitable[None]]


# Whether an AsyncClient has run grpc.aio in this process, and whether this
# process is a child forked after one did. grpc.aio keeps one poller thread
# per process, which a child does not inherit: every grpc.aio call in such a
# child hangs, on a fresh channel too, so start() refuses there instead.
_aio_used = False
_aio_forked = False

_FORKED_AIO = (
    "policyd_client: grpc.aio was used in this process's parent before os.fork(), and cannot run in the "
    "child; create and start AsyncClient only in the child (Celery: worker_process_init; gunicorn "
    "--preload: on first use in the worker, not at import)"
)


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
    ``grpc.aio.Channel`` and ``sleep`` is a coroutine function
    ``sleep(seconds)`` (default ``asyncio.sleep``), interrupted by cancelling
    the task. The channel (when dialled from ``address``) and the background
    tasks start on the running loop at ``__aenter__``, :meth:`start` or the
    first call.
    """

    def __init__(
        self,
        address: Optional[str] = None,
        *,
        tenant: str,
        channel: Optional[grpc.aio.Channel] = None,
        token: Optional[str] = None,
        credentials: Optional[grpc.ChannelCredentials] = None,
        decision_timeout: float = 0.25,
        attempt_timeout: float = 10.0,
        retry_unreachable_after: float = 1.0,
        local_budget: float = 20.0,
        local_budget_per_second: float = 2.0,
        batch_size: int = 256,
        flush_interval: float = 0.1,
        queue_size: int = 65536,
        watch: bool = True,
        sleep: Optional[AsyncSleep] = None,
        now: Optional[Callable[[], float]] = None,
        rand: Optional[Callable[[], float]] = None,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        if (address is None) == (channel is None):
            raise ValueError("policyd_client: give exactly one of address and channel")
        self._core = Core(
            Settings(tenant, decision_timeout, attempt_timeout, retry_unreachable_after, local_budget,
                     local_budget_per_second, batch_size, flush_interval, queue_size, watch),
            now, rand, logger,
        )
        self._settings = self._core.settings
        self._now = self._core.now
        self._sleep: AsyncSleep = sleep or asyncio.sleep
        self._address = address
        self._owned = channel is None
        self._credentials = credentials
        self._md = bearer(token)
        self._channel: Optional[grpc.aio.Channel] = channel
        self._stub: Optional[rpb_grpc.RetryPolicyServiceStub] = None
        self._reporter: Optional[_AsyncReporter] = None
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._closed = False
        self._stopping: Optional[asyncio.Event] = None
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
            inherit(self._stub, self._reporter, *self._tasks)
            if self._owned:
                inherit(self._channel)
                self._channel = None
            else:
                self._core.log.warning(
                    "policyd_client: an AsyncClient with a channel of the caller's was used before os.fork(); "
                    "gRPC channels do not survive fork: give an address instead, or make the client in the child"
                )
        self._stub, self._reporter, self._tasks = None, None, []
        self._stopping = self._changed = None
        self._started = False

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Dials policyd (when given an address) and starts the background
        tasks on the running loop. Idempotent; call() does it on first use."""
        if self._started:
            return
        if self._closed:
            raise RuntimeError("policyd_client: the client is closed")
        if _aio_forked:
            raise RuntimeError(_FORKED_AIO)
        global _aio_used
        _aio_used = True
        self._started = True
        if self._channel is None:
            if self._credentials is not None:
                self._channel = grpc.aio.secure_channel(self._address, self._credentials)  # type: ignore[arg-type]
            else:
                self._channel = grpc.aio.insecure_channel(self._address)  # type: ignore[arg-type]
        self._stub = rpb_grpc.RetryPolicyServiceStub(self._channel)
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()
        self._core.cache.on_change = self._on_change
        self._reporter = _AsyncReporter(self._stub, self._core, self._md)
        self._tasks.append(asyncio.create_task(self._reporter.run(), name="policyd-outcomes"))
        if self._settings.watch:
            self._tasks.append(asyncio.create_task(self._watch(), name="policyd-watch"))

    async def __aenter__(self) -> "AsyncClient":
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        await self.close()

    async def close(self, timeout: float = 10.0) -> int:
        """Stops watching breakers and flushes every queued outcome, giving
        policyd up to ``timeout`` seconds, then closes the channel if the
        client dialled it. Returns the number of outcomes that could not be
        reported. Closing twice does nothing."""
        if self._closed:
            return 0
        self._closed = True
        if not self._started:
            return 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        assert self._stopping is not None and self._reporter is not None
        self._stopping.set()
        self._reporter.stop()
        for t in self._tasks[1:]:
            t.cancel()  # the watch: nothing to lose
        await asyncio.gather(*self._tasks, return_exceptions=True)
        lost = await self._reporter.drain(deadline)
        if self._owned and self._channel is not None:
            await self._channel.close()
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

        Cancelling the task running call() reports the call as DEADLINE_CUT
        and re-raises CancelledError.
        """
        if self._closed:
            raise RuntimeError("policyd_client: the client is closed")
        st: CallState[T] = self._core.begin(call, fn)
        await self.start()
        try:
            return await self._run(st, fn)
        except asyncio.CancelledError:
            if not st.ended:
                st.error = Cancelled()
                self._add(st.end(Disposition.DEADLINE_CUT, StopReason.DEADLINE, st.attempts))
            raise

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
                sid, payload = submission(*args, **kwargs) if submission is not None else ("", b"")
                spec = Call(
                    target=target, submission_id=sid, payload=payload, idempotent=idempotent, run_id=run_id,
                    deadline=self._now() + deadline_after if deadline_after is not None else None,
                )
                res = await self.call(spec, lambda _a: fn(*args, **kwargs))
                if res.ok:
                    return res.value  # type: ignore[return-value]
                raise RetryError(res) from res.error

            return wrapper

        return decorate

    def _add(self, o: PendingOutcome) -> None:
        assert self._reporter is not None
        self._reporter.add(o)

    async def _run(self, st: CallState[T], fn: Callable[[Attempt], Awaitable[T]]) -> Result[T]:
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            attempt += 1
            ok, permit = await self._admit(st, attempt)
            if not ok:
                return st.result()
            st.attempts = attempt
            self._core.count("attempts")
            start = self._now()
            a = st.attempt(attempt, start)
            started = loop.time()
            token = _CURRENT.set(a)  # copied into the task wait_for creates
            err: Optional[Exception] = None
            try:
                value = await asyncio.wait_for(fn(a), a.timeout)
            except Exception as e:  # every failure of fn is classified
                err = e
            finally:
                _CURRENT.reset(token)
            latency = max(self._now() - start, 0.0)
            if err is None:
                self._add(st.succeed(attempt, permit, latency, value))
                self._core.local.budget.deposit(0.2)
                return st.result()
            st.error = err
            timed_out = isinstance(err, asyncio.TimeoutError) and loop.time() - started >= a.timeout
            f = classify_exception(err, timed_out=timed_out)
            if f.unclassified:
                st.reason = f.reason
                self._add(st.end(Disposition.FAILED_TERMINAL, StopReason.TERMINAL, attempt))
                return st.result()
            dec = await self._next(st, attempt, f, permit)
            st.reason = dec.reason
            unrecorded = None
            if dec.fallback:
                st.local = True
                unrecorded = f.failure
            if not dec.retry:
                self._add(st.end(Disposition.from_pb(dec.disposition), stop_reason(dec.stop_reason), attempt, unrecorded))
                return st.result()
            if unrecorded is not None:
                self._add(st.failure(attempt, unrecorded, permit, latency))
            if dec.attempt_timeout > 0:
                st.timeout = dec.attempt_timeout
            st.prev = dec.delay
            await self._sleep(dec.delay)

    async def _admit(self, st: CallState[T], attempt: int) -> tuple[bool, str]:
        core = self._core
        assert self._stub is not None
        while True:
            now = self._now()
            b = core.cache.lookup(st.info.target)
            if b is not None:
                verdict = admit_from_cache(b, now)
                if verdict == "wait":
                    if not await self._wait_for(st, b.cooldown_until - now, attempt):
                        return False, ""
                    continue
                if verdict == "go":
                    return True, ""
                if verdict == "open":
                    core.count("fast_fails")
                    st.reason = "breaker:open"
                    self._add(st.end(Disposition.CIRCUIT_OPEN, StopReason.CIRCUIT_OPEN, attempt - 1))
                    return False, ""
            if not core.reachable():
                return True, ""
            core.count("admit_rpcs")
            try:
                resp = await self._stub.Admit(
                    rpb.AdmitRequest(call=st.ref, attempt=attempt), timeout=self._settings.decision_timeout, metadata=self._md
                )
            except Exception as e:
                core.failed(e)
                return True, ""
            if resp.admitted:
                return True, resp.permit_id
            if resp.reason == COOLDOWN:
                if not await self._wait_for(st, from_duration(resp.retry_after), attempt):
                    return False, ""
                continue
            st.reason = resp.reason
            self._add(st.end(Disposition.CIRCUIT_OPEN, StopReason.CIRCUIT_OPEN, attempt - 1))
            return False, ""

    async def _wait_for(self, st: CallState[T], d: float, attempt: int) -> bool:
        d = self._core.spread(d)
        if st.deadline is not None and self._now() + d + st.timeout > st.deadline:
            st.reason = COOLDOWN
            self._add(st.end(Disposition.DEADLINE_CUT, StopReason.DEADLINE, attempt - 1))
            return False
        await self._sleep(d)
        return True

    async def _next(self, st: CallState[T], attempt: int, f: ClassifiedFailure, permit: str) -> Decision:
        core = self._core
        assert self._stub is not None
        if core.reachable():
            # Successes queued before this failure reach the breaker first;
            # both share the decision timeout.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._settings.decision_timeout
            assert self._reporter is not None
            await self._reporter.flush_now(self._settings.decision_timeout)
            req = rpb.NextDelayRequest(call=st.ref, attempt=attempt, failure=f.failure, permit_id=permit)
            if f.pushback is not None:
                req.pushback.CopyFrom(f.pushback)
            req.previous_delay.FromNanoseconds(int(st.prev * 1e9))
            try:
                left = max(deadline - loop.time(), 0.001)
                resp = await self._stub.NextDelay(req, timeout=left, metadata=self._md)
                return decision_from_pb(resp)
            except Exception as e:
                core.failed(e)
        core.count("local_decisions")
        return core.local.decide(
            self._now(), st.deadline, attempt, f, st.info.idempotent, st.info.key != ""
        )

    # -- the breaker cache ---------------------------------------------------

    async def _watch(self) -> None:
        assert self._stopping is not None
        backoff = 0.1
        while not self._stopping.is_set():
            if await self._follow():
                backoff = 0.1
            self._core.cache.down()
            try:
                await asyncio.wait_for(self._stopping.wait(), backoff)
                return
            except asyncio.TimeoutError:
                pass
            backoff = min(2 * backoff, 5.0)

    async def _follow(self) -> bool:
        assert self._stub is not None
        cache = self._core.cache
        fresh: dict[tuple[str, str], CachedBreaker] = {}
        complete = False
        stream = self._stub.WatchBreakers(rpb.WatchBreakersRequest(tenant=self._settings.tenant), metadata=self._md)
        try:
            async for msg in stream:
                if msg.snapshot_complete:
                    cache.replace(fresh)
                    complete = True
                elif not complete:
                    k, v = cached_from_pb(msg.breaker)
                    fresh[k] = v
                else:
                    k, v = cached_from_pb(msg.breaker)
                    cache.update(k, v)
        except grpc.RpcError:
            pass
        finally:
            stream.cancel()
        return complete


class _AsyncReporter:
    """The outcome queue of :class:`AsyncClient`: as the sync client's, with
    a task instead of a thread."""

    def __init__(self, stub: rpb_grpc.RetryPolicyServiceStub, core: Core, md: Metadata) -> None:
        self._stub = stub
        self._md = md
        self._core = core
        s = core.settings
        self._size, self._every, self._cap = s.batch_size, s.flush_interval, s.queue_size
        self._rpc_timeout = 4 * s.decision_timeout
        self._q: collections.deque[PendingOutcome] = collections.deque()
        self._wake = asyncio.Event()
        self._stopped = False
        # Workers waiting for the queue to be sent (flush_now).
        self._requests: list[asyncio.Future[None]] = []

    def add(self, o: PendingOutcome) -> None:
        if len(self._q) >= self._cap:
            self._core.count("outcomes_dropped")
            return
        self._q.append(o)
        if len(self._q) >= self._size:
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
            while not self._stopped and not self._requests and (backoff or len(self._q) < self._size):
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

    def _take(self) -> list[PendingOutcome]:
        return [self._q.popleft() for _ in range(min(len(self._q), self._size))]

    def _putback(self, batch: list[PendingOutcome]) -> None:
        self._q.extendleft(reversed(batch))
        extra = len(self._q) - self._cap
        for _ in range(max(extra, 0)):
            self._q.popleft()
        if extra > 0:
            self._core.count("outcomes_dropped", extra)

    async def _send(self, batch: list[PendingOutcome], timeout: float) -> Optional[Exception]:
        try:
            await self._stub.ReportOutcome(rpb.ReportOutcomeRequest(outcomes=[o.pb() for o in batch]), timeout=timeout, metadata=self._md
            )
        except Exception as e:
            return e
        self._core.count("outcomes_sent", len(batch))
        self._core.count("report_batches_sent")
        return None

    async def _flush(self, timeout: float) -> bool:
        while True:
            batch = self._take()
            if not batch:
                return True
            err = await self._send(batch, timeout)
            if err is None:
                continue
            if report_is_transient(err):
                self._putback(batch)
                return False
            for i, o in enumerate(batch):
                err = await self._send([o], timeout)
                if err is None:
                    continue
                if report_is_transient(err):
                    self._putback(batch[i:])
                    return False
                self._core.count("outcomes_dropped")
                self._core.log.error("policyd refused an outcome of call %s; dropped: %s", o.call.call_id, describe(err))

    async def drain(self, deadline: float) -> int:
        loop = asyncio.get_running_loop()
        while True:
            left = deadline - loop.time()
            if await self._flush(max(min(self._rpc_timeout, left), 0.001)):
                return 0
            left = deadline - loop.time()
            if left <= 0:
                lost = len(self._q)
                self._q.clear()
                self._core.count("outcomes_dropped", lost)
                self._core.log.warning("policyd_client: %d outcomes not reported", lost)
                return lost
            await asyncio.sleep(min(0.05, left))
