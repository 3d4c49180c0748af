"""The synchronous client: the core's retry loop driven with blocking
calls, with outcome batching and the breaker cache on background threads."""

from __future__ import annotations

import functools
import logging
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Optional, ParamSpec, TypeVar, Union

import grpc

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

#: sleep(seconds, cancel) waits ``seconds`` or until ``cancel`` is set.
SyncSleep = Callable[[float, threading.Event], None]


def _sleep(seconds: float, cancel: threading.Event) -> None:
    if seconds > 0:
        cancel.wait(seconds)


_NEVER = threading.Event()  # a cancel event nobody sets


class Client:
    """Runs retry loops with policyd's decisions. Safe for concurrent use by
    many threads; close it (or use it as a context manager) to flush the
    outcomes it still holds. Safe to make before ``os.fork()``: it dials
    policyd on first use, in each process that uses it.

    Give either ``address`` (``host:port``; a list of replicas'
    ``ip:port``, or ``dns:///name:port`` for replicas behind one name, over
    which calls are spread as :data:`policyd_client.SERVICE_CONFIG` says; the
    client dials it and owns the channel: plaintext, policyd's loopback
    default, or TLS with ``credentials``, e.g.
    ``grpc.ssl_channel_credentials(...)``) or ``channel`` (which the caller
    keeps owning). ``token`` is the tenant's
    worker token, when policyd requires one: it is sent with every RPC as
    ``authorization: Bearer <token>``. The keyword ``options``
    (``decision_timeout``, ``attempt_timeout``, ``retry_unreachable_after``,
    ``local_budget``, ``local_budget_per_second``, ``batch_size``,
    ``flush_interval``, ``queue_size``, ``watch``, ``close_timeout``,
    ``reconnect_base``, ``reconnect_cap``, ``fallbacks``, ``require_claim``) are described,
    with their defaults, in :class:`policyd_client.Settings`.

    ``sleep(seconds, cancel)`` waits between attempts, returning early when
    ``cancel`` is set; ``now()`` tells the time in Unix seconds; ``rand()``
    draws the jitter in [0, 1); ``reconnect_sleep(seconds, stop)`` waits
    between the watch's reconnection tries (default: on the stop event).
    Tests inject fakes so nothing waits. ``on_event(event)`` is called for
    every :class:`policyd_client.Event` (attempt started, retry scheduled,
    stopped, local decision, breaker changed, fallback taken).
    """

    def __init__(
        self,
        address: Optional[Address] = None,
        *,
        tenant: str,
        channel: Optional[grpc.Channel] = None,
        token: Optional[str] = None,
        credentials: Optional[grpc.ChannelCredentials] = None,
        sleep: Optional[SyncSleep] = None,
        reconnect_sleep: Optional[SyncSleep] = None,
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
        self._sleep: SyncSleep = sleep or _sleep
        self._reconnect_sleep: SyncSleep = reconnect_sleep or _sleep
        self._address = None if address is None else target(address)  # a bad list fails here
        self._credentials = credentials
        self._owned = channel is None
        self._md = bearer(token)
        self._channel: Optional[grpc.Channel] = channel
        self._closed = False
        # Guards starting and closing; the channel, the reporter and the
        # threads start on first use, so a client made before os.fork() and
        # used only in the children never has gRPC objects in the parent.
        self._close_lock = threading.Lock()
        self._started = False
        self._stream_lock = threading.Lock()
        self._stream: Optional[Any] = None  # the WatchBreakers call, to cancel
        self._init_io()
        follow_forks(self)

    def _init_io(self) -> None:
        """Sets up, unstarted, what a process of its own needs: the stop
        event, the stub, the reporter and the threads."""
        self._stopping = threading.Event()
        self._stub: Optional[rpb_grpc.RetryPolicyServiceStub] = None
        self._reporter: Optional[_Reporter] = None
        self._threads: list[threading.Thread] = []

    def _start(self) -> tuple["_Reporter", rpb_grpc.RetryPolicyServiceStub]:
        """Dials policyd (when given an address) and starts the reporter and
        the watch on first use; returns the reporter and the stub."""
        r, stub = self._reporter, self._stub
        if r is not None and stub is not None:
            return r, stub
        with self._close_lock:
            if self._closed:
                raise RuntimeError("policyd_client: the client is closed")
            if self._reporter is None:
                if self._channel is None:
                    if self._credentials is not None:
                        self._channel = grpc.secure_channel(self._address, self._credentials, options=channel_options())  # type: ignore[arg-type]
                    else:
                        self._channel = grpc.insecure_channel(self._address, options=channel_options())  # type: ignore[arg-type]
                self._stub = rpb_grpc.RetryPolicyServiceStub(self._channel)
                reporter = _Reporter(self._stub, self._core, self._md)
                self._threads = [threading.Thread(target=reporter.run, name="policyd-outcomes", daemon=True)]
                if self._settings.watch:
                    self._threads.append(threading.Thread(target=self._watch, args=(self._stub,), name="policyd-watch",
                                                          daemon=True))
                for t in self._threads:
                    t.start()
                self._started = True
                self._reporter = reporter
            assert self._stub is not None
            return self._reporter, self._stub

    def _after_fork_in_child(self) -> None:
        """Runs in a child after os.fork(): drops the parent's channel,
        stream, threads, locks and queued outcomes (the parent sends those),
        so that first use in the child dials afresh. A channel the caller
        gave cannot be redialled; it is kept, with a warning."""
        self._close_lock = threading.Lock()
        self._stream_lock = threading.Lock()
        self._core.after_fork()
        if self._started:
            drop_inherited(self._core, self._owned, self._channel, self._stream, self._stub, self._reporter)
            if self._owned:
                self._channel = None
        self._stream = None
        self._started = False
        self._init_io()

    # -- lifecycle -----------------------------------------------------------

    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.close()

    def close(self, timeout: Optional[float] = None) -> int:
        """Stops watching breakers and flushes every queued outcome, giving
        policyd up to ``timeout`` seconds (default ``close_timeout``, 1 s),
        then closes the channel if the client dialled it. Returns within
        about that time whether or not policyd answers, with the number of
        outcomes that could not be reported (0 normally; they are counted as
        dropped and logged with their call ids). Calls running concurrently
        with close may lose their reports. Closing twice does nothing."""
        with self._close_lock:
            if self._closed:
                return 0
            self._closed = True
            reporter = self._reporter
        if reporter is None:
            return 0  # never used: nothing dialled, nothing queued
        deadline = time.monotonic() + (self._settings.close_timeout if timeout is None else timeout)
        self._stopping.set()
        with self._stream_lock:
            if self._stream is not None:
                self._stream.cancel()
        reporter.stop()
        for t in self._threads:
            t.join(max(deadline - time.monotonic(), 0.0))  # a flush in flight ends by its RPC timeout
        lost = reporter.drain(deadline)
        if self._owned and self._channel is not None:
            self._channel.close()  # cancels whatever is still in flight
        return lost

    def ready(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the client follows policyd's breakers (the
        WatchBreakers snapshot has arrived) or ``timeout`` seconds pass, and
        says whether it does. Never needed for correctness: until then every
        attempt asks Admit. False at once when ``watch`` is off."""
        if not self._settings.watch:
            return False
        self._start()
        return self._core.cache.wait(lambda: self._core.cache.live, timeout)

    def breaker_state(self, target: str) -> Optional[BreakerState]:
        """Returns target's breaker state as this client's cache sees it, or
        None while the cache cannot answer (not yet, or no longer, following
        policyd)."""
        return self._core.cache.state(target)

    def wait_breaker_state(self, target: str, state: BreakerState, timeout: Optional[float] = None) -> bool:
        """Blocks until the cache shows target's breaker in ``state`` or
        ``timeout`` seconds pass; says whether it does."""
        self._start()
        return self._core.cache.wait(lambda: self._core.cache.state(target) == state, timeout)

    def stats(self) -> Stats:
        """Returns a snapshot of the client's counters."""
        return self._core.stats()

    # -- the loop ------------------------------------------------------------

    def call(
        self, call: Call, fn: Callable[[Attempt], T], *, cancel: Optional[threading.Event] = None
    ) -> Result[T]:
        """Runs ``fn`` until it succeeds or policyd (or, when policyd cannot
        answer in time, the local copy of the default policy) says to stop:
        admit (skipped while the breaker is known CLOSED; refused at once
        while it is known OPEN), call ``fn(attempt)``, classify what it
        raised, ask NextDelay, wait, repeat. Outcomes are reported in the
        background. Setting ``cancel`` ends the call at its next wait with
        DEAD_LETTER (stop reason DEADLINE).

        ``fn`` should apply ``attempt.timeout`` to the I/O it does; an attempt
        that overruns it counts as a timeout. Exceptions that are not
        ``Exception`` (KeyboardInterrupt) propagate. Raises ValueError or
        TypeError for misuse (RuntimeError once the client is closed) only:
        how the call ended is in the Result.
        """
        if self._closed:
            raise RuntimeError("policyd_client: the client is closed")
        st = self._core.begin(call, fn)
        reporter, stub = self._start()
        cancel = cancel or _NEVER
        loop = _loop.run(self._core, st)
        reply: Any = None
        while True:
            try:
                effect = loop.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            reply = self._do(effect, fn, cancel, reporter, stub)

    def _do(
        self, effect: _loop.Effect, fn: Callable[[Attempt], Any], cancel: threading.Event, reporter: "_Reporter",
        stub: rpb_grpc.RetryPolicyServiceStub,
    ) -> Any:
        """Carries out one effect of the loop, blocking; returns its answer."""
        dt = self._settings.decision_timeout
        if isinstance(effect, _loop.Invoke):
            a = effect.attempt
            start = self._now()
            token = _CURRENT.set(a)
            try:
                value = fn(a)
            except Exception as e:  # every failure of fn is classified
                latency = max(self._now() - start, 0.0)
                return _loop.Invoked(error=e, latency=latency, timed_out=a.timeout > 0 and latency >= a.timeout,
                                     cancelled=cancel.is_set())
            finally:
                _CURRENT.reset(token)
            return _loop.Invoked(value=value, latency=max(self._now() - start, 0.0))
        if isinstance(effect, _loop.Report):
            reporter.add(effect.outcome)
            return None
        if isinstance(effect, _loop.Sleep):
            self._sleep(effect.seconds, cancel)
            return cancel.is_set()
        if isinstance(effect, _loop.Admit):
            try:
                return stub.Admit(effect.request, timeout=effect.timeout or dt, metadata=self._md)
            except Exception as e:  # policyd away, slow, or the channel closed
                return e
        if isinstance(effect, _loop.Claim):
            try:
                return stub.ClaimKey(effect.request, timeout=dt, metadata=self._md)
            except Exception as e:
                return e
        if isinstance(effect, _loop.Complete):
            try:
                return stub.CompleteKey(effect.request, timeout=dt, metadata=self._md)
            except Exception as e:
                self._core.log.warning("policyd_client: policyd did not record the idempotency key's outcome: %s", e)
                return e
        # Decide: the successes queued before this failure reach the breaker
        # before it does (a consecutive-failure breaker must not count
        # failures "in a row" that had successes between them); both share
        # the decision timeout.
        deadline = time.monotonic() + dt
        reporter.flush_now(dt)
        try:
            return stub.NextDelay(effect.request, timeout=max(deadline - time.monotonic(), 0.001), metadata=self._md)
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
    ) -> Callable[[Callable[P, T]], Callable[P, T]]:
        """Decorates a function so every call of it runs through :meth:`call`::

            @client.retry(target="geo", idempotent=True)
            def geocode(address: str) -> dict:
                a = current_attempt()
                return session.get(URL, params={"q": address}, timeout=a.timeout).json()

        The decorated function keeps its signature; it returns the function's
        value on success and raises :class:`RetryError` (with the last
        exception as ``__cause__``) otherwise. :func:`current_attempt` tells
        the function its attempt. ``submission(*args, **kwargs)``, if given,
        returns the (submission id, payload) of an invocation, from which
        the idempotency key is derived. ``deadline_after`` bounds each
        invocation to that many seconds.
        """

        def decorate(fn: Callable[P, T]) -> Callable[P, T]:
            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                spec = self._core.decorated_call(target, idempotent, run_id, deadline_after, submission, args, kwargs)
                return value_of(self.call(spec, lambda _a: fn(*args, **kwargs)))

            return wrapper

        return decorate


    # -- the breaker cache ---------------------------------------------------

    def _watch(self, stub: rpb_grpc.RetryPolicyServiceStub) -> None:
        """Keeps the cache in step with policyd until close, reconnecting
        with jittered, capped backoff when the stream breaks."""
        failures = 0
        while not self._stopping.is_set():
            if self._follow(stub):
                failures = 0
            self._core.cache.down()
            self._reconnect_sleep(self._core.reconnect_delay(failures), self._stopping)
            failures += 1

    def _follow(self, stub: rpb_grpc.RetryPolicyServiceStub) -> bool:
        """Runs one WatchBreakers stream; says whether it got as far as a
        complete snapshot."""
        session = WatchSession(self._core.cache, self._core.chains)
        try:
            stream = stub.WatchBreakers(session.request(self._settings.tenant), metadata=self._md)
            with self._stream_lock:
                self._stream = stream
            if self._stopping.is_set():
                stream.cancel()
            for msg in stream:
                session.feed(msg)
        except grpc.RpcError as e:  # the stream broke (or close cancelled it)
            session.failed(e.code() if hasattr(e, "code") else None)
        except Exception:
            pass
        finally:
            with self._stream_lock:
                self._stream = None
        return session.complete


class _Reporter:
    """Sends the outcome queue to policyd in batches on a background thread,
    off the worker's path: a full batch or a tick sends (the core's
    :func:`flush` decides what to send again and what to drop); close drains
    what is left."""

    def __init__(self, stub: rpb_grpc.RetryPolicyServiceStub, core: Core, md: Metadata) -> None:
        self._stub = stub
        self._md = md
        self._core = core
        self._q = OutcomeQueue(core)
        self._every = core.settings.flush_interval
        self._rpc_timeout = 4 * core.settings.decision_timeout
        self._cond = threading.Condition()
        self._stopped = False
        # Workers waiting for the queue to be sent (flush_now).
        self._requests: list[threading.Event] = []

    def add(self, o: PendingOutcome) -> None:
        """Queues o without blocking."""
        if self._q.add(o):
            with self._cond:
                self._cond.notify()

    def flush_now(self, timeout: float) -> None:
        """Asks the reporter thread to send what is queued and waits until it
        has, or timeout seconds pass."""
        done = threading.Event()
        with self._cond:
            if self._stopped:
                return
            self._requests.append(done)
            self._cond.notify()
        done.wait(timeout)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            for r in self._requests:
                r.set()
            self._requests = []
            self._cond.notify()

    def run(self) -> None:
        """Batches until stop."""
        tick = time.monotonic() + self._every
        backoff = False  # the last flush failed: wait for the tick
        while True:
            with self._cond:
                while not self._stopped and not self._requests and (backoff or len(self._q) < self._q.size):
                    left = tick - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._stopped:
                    return
                requests, self._requests = self._requests, []
            if time.monotonic() >= tick:
                tick = time.monotonic() + self._every
            backoff = not self._flush(self._rpc_timeout)
            for r in requests:
                r.set()

    def _flush(self, timeout: float) -> bool:
        """Drives the core's flush with blocking ReportOutcome calls."""
        steps = flush(self._core, self._q)
        err: Sent = None
        while True:
            try:
                batch = steps.send(err)
            except StopIteration as done:
                return bool(done.value)
            try:
                err = self._stub.ReportOutcome(report_request(batch), timeout=timeout, metadata=self._md)
            except Exception as e:
                err = e

    def drain(self, deadline: float) -> int:
        """Sends everything still queued until ``deadline``
        (time.monotonic); returns the number of outcomes policyd did not
        take by then, which are counted as dropped and logged."""
        wait = threading.Event()
        while True:
            left = deadline - time.monotonic()
            if left > 0 and self._flush(min(self._rpc_timeout, left)):
                return 0
            left = deadline - time.monotonic()
            if left <= 0:
                return self._q.give_up()
            wait.wait(min(0.05, left))
