"""The synchronous client: retry loops over a gRPC channel, with outcome
batching and the breaker cache on background threads."""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from types import TracebackType
from typing import Any, Callable, Optional, ParamSpec, TypeVar, Union

import grpc

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

#: sleep(seconds, cancel) waits ``seconds`` or until ``cancel`` is set.
SyncSleep = Callable[[float, threading.Event], None]


def _sleep(seconds: float, cancel: threading.Event) -> None:
    if seconds > 0:
        cancel.wait(seconds)


_NEVER = threading.Event()  # a cancel event nobody sets


class Client:
    """Runs retry loops with policyd's decisions. Safe for concurrent use by
    many threads; close it (or use it as a context manager) to flush the
    outcomes it still holds.

    Give either ``address`` (``host:port``; the client dials it and owns the
    channel: plaintext, policyd's loopback default, or TLS with
    ``credentials``, e.g. ``grpc.ssl_channel_credentials(...)``) or
    ``channel`` (which the caller keeps owning). ``token`` is the tenant's
    worker token, when policyd requires one: it is sent with every RPC as
    ``authorization: Bearer <token>``. Times are seconds:

    - ``decision_timeout`` bounds every decision RPC (Admit, NextDelay); past
      it the client decides locally. Default 0.25.
    - ``attempt_timeout`` is the per-attempt timeout until policyd says
      otherwise. Default 10 (policyd's default).
    - ``retry_unreachable_after``: after policyd failed to answer, the client
      decides locally for this long before asking again. Default 1.
    - ``local_budget`` / ``local_budget_per_second`` size the token bucket
      for retries decided locally. Defaults 20 and 2.
    - ``batch_size``, ``flush_interval``, ``queue_size`` shape outcome
      reporting: batches of up to ``batch_size`` (at most 1000), sent when a
      batch is full and at least every ``flush_interval``, from a queue of
      ``queue_size`` (an outcome that finds it full is dropped and counted).
      Defaults 256, 0.1, 65536.
    - ``watch``: follow WatchBreakers so attempts against a CLOSED breaker
      cost no RPC and attempts against an OPEN one fail at once. Default on.
    - ``sleep(seconds, cancel)`` waits between attempts, returning early when
      ``cancel`` is set; ``now()`` tells the time in Unix seconds;
      ``rand()`` draws the local policy's jitter in [0, 1). Tests inject
      fakes so nothing waits.
    """

    def __init__(
        self,
        address: Optional[str] = None,
        *,
        tenant: str,
        channel: Optional[grpc.Channel] = None,
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
        sleep: Optional[SyncSleep] = None,
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
        self._sleep: SyncSleep = sleep or _sleep
        self._address = address
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
        event, the outcome queue and the threads."""
        self._stopping = threading.Event()
        self._stub: Optional[rpb_grpc.RetryPolicyServiceStub] = None
        self._reporter: Optional[_Reporter] = None
        self._threads: list[threading.Thread] = []

    def _start(self) -> "_Reporter":
        """Dials policyd (when given an address) and starts the reporter and
        the watch on first use; returns the reporter."""
        r = self._reporter
        if r is not None:
            return r
        with self._close_lock:
            if self._closed:
                raise RuntimeError("policyd_client: the client is closed")
            if self._reporter is not None:
                return self._reporter
            if self._channel is None:
                if self._credentials is not None:
                    self._channel = grpc.secure_channel(self._address, self._credentials)  # type: ignore[arg-type]
                else:
                    self._channel = grpc.insecure_channel(self._address)  # type: ignore[arg-type]
            self._stub = rpb_grpc.RetryPolicyServiceStub(self._channel)
            reporter = _Reporter(self._stub, self._core, self._md)
            self._threads = [threading.Thread(target=reporter.run, name="policyd-outcomes", daemon=True)]
            if self._settings.watch:
                self._threads.append(threading.Thread(target=self._watch, name="policyd-watch", daemon=True))
            for t in self._threads:
                t.start()
            self._started = True
            self._reporter = reporter
            return reporter

    def _io(self) -> tuple["_Reporter", rpb_grpc.RetryPolicyServiceStub]:
        """Returns the reporter and the stub, starting them if need be."""
        reporter = self._start()
        assert self._stub is not None
        return reporter, self._stub

    def _after_fork_in_child(self) -> None:
        """Runs in a child after os.fork(): drops the parent's channel,
        stream, threads, locks and queued outcomes (the parent sends those),
        so that first use in the child dials afresh. A channel the caller
        gave cannot be redialled; it is kept, with a warning."""
        self._close_lock = threading.Lock()
        self._stream_lock = threading.Lock()
        self._core.after_fork()
        if self._started:
            inherit(self._stream, self._stub, self._reporter)
            if self._owned:
                inherit(self._channel)
                self._channel = None
            else:
                self._core.log.warning(
                    "policyd_client: a Client with a channel of the caller's was used before os.fork(); "
                    "gRPC channels do not survive fork: give an address instead, or make the client in the child"
                )
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

    def close(self, timeout: float = 10.0) -> int:
        """Stops watching breakers and flushes every queued outcome, giving
        policyd up to ``timeout`` seconds, then closes the channel if the
        client dialled it. Returns the number of outcomes that could not be
        reported (0 normally). Calls running concurrently with close may lose
        their reports. Closing twice does nothing."""
        with self._close_lock:
            if self._closed:
                return 0
            self._closed = True
            reporter = self._reporter
        if reporter is None:
            return 0  # never used: nothing dialled, nothing queued
        deadline = time.monotonic() + timeout
        self._stopping.set()
        with self._stream_lock:
            if self._stream is not None:
                self._stream.cancel()
        reporter.stop()
        for t in self._threads:
            t.join()
        lost = reporter.drain(deadline)
        if self._owned and self._channel is not None:
            self._channel.close()
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
        DEADLINE_CUT.

        ``fn`` should apply ``attempt.timeout`` to the I/O it does; an attempt
        that overruns it counts as a timeout. Exceptions that are not
        ``Exception`` (KeyboardInterrupt) propagate. Raises ValueError or
        TypeError for misuse (RuntimeError once the client is closed) only:
        how the call ended is in the Result.
        """
        if self._closed:
            raise RuntimeError("policyd_client: the client is closed")
        st: CallState[T] = self._core.begin(call, fn)
        reporter = self._start()
        cancel = cancel or _NEVER
        attempt = 0
        while True:
            attempt += 1
            ok, permit = self._admit(st, attempt, cancel)
            if not ok:
                return st.result()
            st.attempts = attempt
            self._core.count("attempts")
            start = self._now()
            a = st.attempt(attempt, start)
            token = _CURRENT.set(a)
            err: Optional[Exception] = None
            try:
                value = fn(a)
            except Exception as e:  # every failure of fn is classified
                err = e
            finally:
                _CURRENT.reset(token)
            latency = max(self._now() - start, 0.0)
            if err is None:
                reporter.add(st.succeed(attempt, permit, latency, value))
                self._core.local.budget.deposit(0.2)
                return st.result()
            st.error = err
            if cancel.is_set():
                reporter.add(st.end(Disposition.DEADLINE_CUT, StopReason.DEADLINE, attempt))
                return st.result()
            f = classify_exception(err, timed_out=a.timeout > 0 and latency >= a.timeout)
            if f.unclassified:
                # Nothing is known about this error: terminal, never retried blindly.
                st.reason = f.reason
                reporter.add(st.end(Disposition.FAILED_TERMINAL, StopReason.TERMINAL, attempt))
                return st.result()
            dec = self._next(st, attempt, f, permit, cancel)
            st.reason = dec.reason
            unrecorded = None
            if dec.fallback:
                st.local = True
                unrecorded = f.failure  # policyd has not seen this failure: report it
            if not dec.retry:
                reporter.add(
                    st.end(Disposition.from_pb(dec.disposition), stop_reason(dec.stop_reason), attempt, unrecorded)
                )
                return st.result()
            if unrecorded is not None:
                reporter.add(st.failure(attempt, unrecorded, permit, latency))
            if dec.attempt_timeout > 0:
                st.timeout = dec.attempt_timeout
            st.prev = dec.delay
            self._sleep(dec.delay, cancel)
            if cancel.is_set():
                st.error = Cancelled()
                reporter.add(st.end(Disposition.DEADLINE_CUT, StopReason.DEADLINE, attempt))
                return st.result()

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
                sid, payload = submission(*args, **kwargs) if submission is not None else ("", b"")
                spec = Call(
                    target=target, submission_id=sid, payload=payload, idempotent=idempotent, run_id=run_id,
                    deadline=self._now() + deadline_after if deadline_after is not None else None,
                )
                res = self.call(spec, lambda _a: fn(*args, **kwargs))
                if res.ok:
                    return res.value  # type: ignore[return-value]
                raise RetryError(res) from res.error

            return wrapper

        return decorate

    def _admit(self, st: CallState[T], attempt: int, cancel: threading.Event) -> tuple[bool, str]:
        """Asks whether attempt may go ahead; returns (ok, probe permit). It
        waits out a fleet-wide cool-down when the deadline allows. ok False
        means the call ended."""
        core = self._core
        reporter, stub = self._io()
        while True:
            now = self._now()
            b = core.cache.lookup(st.info.target)
            if b is not None:
                verdict = admit_from_cache(b, now)
                if verdict == "wait":
                    if not self._wait_for(st, b.cooldown_until - now, attempt, cancel):
                        return False, ""
                    continue
                if verdict == "go":
                    return True, ""
                if verdict == "open":
                    core.count("fast_fails")
                    st.reason = "breaker:open"
                    reporter.add(st.end(Disposition.CIRCUIT_OPEN, StopReason.CIRCUIT_OPEN, attempt - 1))
                    return False, ""
            if not core.reachable():
                return True, ""  # policyd is away: the local policy admits
            core.count("admit_rpcs")
            try:
                resp = stub.Admit(
                    rpb.AdmitRequest(call=st.ref, attempt=attempt), timeout=self._settings.decision_timeout, metadata=self._md
                )
            except Exception as e:  # policyd away, slow, or the channel closed
                core.failed(e)
                return True, ""
            if resp.admitted:
                return True, resp.permit_id
            if resp.reason == COOLDOWN:
                if not self._wait_for(st, from_duration(resp.retry_after), attempt, cancel):
                    return False, ""
                continue
            st.reason = resp.reason
            reporter.add(st.end(Disposition.CIRCUIT_OPEN, StopReason.CIRCUIT_OPEN, attempt - 1))
            return False, ""

    def _wait_for(self, st: CallState[T], d: float, attempt: int, cancel: threading.Event) -> bool:
        """Waits out a fleet-wide cool-down of d seconds (spread) before an
        attempt, unless the attempt could then not finish by the deadline."""
        reporter, _ = self._io()
        d = self._core.spread(d)
        if st.deadline is not None and self._now() + d + st.timeout > st.deadline:
            st.reason = COOLDOWN
            reporter.add(st.end(Disposition.DEADLINE_CUT, StopReason.DEADLINE, attempt - 1))
            return False
        self._sleep(d, cancel)
        if cancel.is_set():
            st.error = Cancelled()
            reporter.add(st.end(Disposition.DEADLINE_CUT, StopReason.DEADLINE, attempt - 1))
            return False
        return True

    def _next(
        self, st: CallState[T], attempt: int, f: ClassifiedFailure, permit: str, cancel: threading.Event
    ) -> Decision:
        """Asks policyd what to do after a failed attempt, or decides locally
        when policyd does not answer within the decision timeout."""
        core = self._core
        reporter, stub = self._io()
        if core.reachable():
            # The successes queued before this failure reach the breaker
            # before it does (a consecutive-failure breaker must not count
            # failures "in a row" that had successes between them); both
            # share the decision timeout.
            deadline = time.monotonic() + self._settings.decision_timeout
            reporter.flush_now(self._settings.decision_timeout)
            req = rpb.NextDelayRequest(call=st.ref, attempt=attempt, failure=f.failure, permit_id=permit)
            if f.pushback is not None:
                req.pushback.CopyFrom(f.pushback)
            req.previous_delay.FromNanoseconds(int(st.prev * 1e9))
            try:
                left = max(deadline - time.monotonic(), 0.001)
                return decision_from_pb(stub.NextDelay(req, timeout=left, metadata=self._md))
            except Exception as e:
                if not cancel.is_set():
                    core.failed(e)
        core.count("local_decisions")
        return core.local.decide(
            self._now(), st.deadline, attempt, f, st.info.idempotent, st.info.key != ""
        )

    # -- the breaker cache ---------------------------------------------------

    def _watch(self) -> None:
        """Keeps the cache in step with policyd until close, reconnecting
        with capped backoff when the stream breaks."""
        backoff = 0.1
        while not self._stopping.is_set():
            if self._follow():
                backoff = 0.1
            self._core.cache.down()
            if self._stopping.wait(backoff):
                return
            backoff = min(2 * backoff, 5.0)

    def _follow(self) -> bool:
        """Runs one WatchBreakers stream; says whether it got as far as a
        complete snapshot."""
        cache = self._core.cache
        _, stub = self._io()
        try:
            stream = stub.WatchBreakers(rpb.WatchBreakersRequest(tenant=self._settings.tenant), metadata=self._md)
        except Exception:
            return False
        with self._stream_lock:
            self._stream = stream
        if self._stopping.is_set():
            stream.cancel()
        fresh: dict[tuple[str, str], CachedBreaker] = {}
        complete = False
        try:
            for msg in stream:
                if msg.snapshot_complete:
                    cache.replace(fresh)
                    complete = True
                elif not complete:
                    k, v = cached_from_pb(msg.breaker)
                    fresh[k] = v
                else:
                    k, v = cached_from_pb(msg.breaker)
                    cache.update(k, v)
        except Exception:  # the stream broke (or close cancelled it)
            pass
        finally:
            with self._stream_lock:
                self._stream = None
        return complete


class _Reporter:
    """Queues outcomes and sends them to policyd in batches on a background
    thread, off the worker's path: a full batch or a tick sends; a batch
    policyd did not take stays queued and is sent again; a batch policyd
    refuses for good is split so that only the refused outcomes are lost;
    close drains what is left."""

    def __init__(self, stub: rpb_grpc.RetryPolicyServiceStub, core: Core, md: Metadata) -> None:
        self._stub = stub
        self._md = md
        self._core = core
        s = core.settings
        self._size, self._every, self._cap = s.batch_size, s.flush_interval, s.queue_size
        self._rpc_timeout = 4 * s.decision_timeout
        self._q: collections.deque[PendingOutcome] = collections.deque()
        self._cond = threading.Condition()
        self._stopped = False
        # Workers waiting for the queue to be sent (flush_now).
        self._requests: list[threading.Event] = []

    def add(self, o: PendingOutcome) -> None:
        """Queues o without blocking; an outcome that finds the queue full
        is dropped and counted."""
        with self._cond:
            if len(self._q) >= self._cap:
                self._core.count("outcomes_dropped")
                return
            self._q.append(o)
            if len(self._q) >= self._size:
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
                while not self._stopped and not self._requests and (backoff or len(self._q) < self._size):
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

    def _take(self) -> list[PendingOutcome]:
        with self._cond:
            return [self._q.popleft() for _ in range(min(len(self._q), self._size))]

    def _putback(self, batch: list[PendingOutcome]) -> None:
        with self._cond:
            self._q.extendleft(reversed(batch))
            extra = len(self._q) - self._cap
            for _ in range(max(extra, 0)):
                self._q.popleft()  # the oldest go first
            if extra > 0:
                self._core.count("outcomes_dropped", extra)

    def _send(self, batch: list[PendingOutcome], timeout: float) -> Optional[Exception]:
        try:
            self._stub.ReportOutcome(rpb.ReportOutcomeRequest(outcomes=[o.pb() for o in batch]), timeout=timeout, metadata=self._md
            )
        except Exception as e:
            return e
        self._core.count("outcomes_sent", len(batch))
        self._core.count("report_batches_sent")
        return None

    def _flush(self, timeout: float) -> bool:
        """Sends everything queued; says whether the queue emptied."""
        while True:
            batch = self._take()
            if not batch:
                return True
            err = self._send(batch, timeout)
            if err is None:
                continue
            if report_is_transient(err):
                self._putback(batch)
                return False
            # Refused for good: find the outcomes policyd refuses, one by one.
            for i, o in enumerate(batch):
                err = self._send([o], timeout)
                if err is None:
                    continue
                if report_is_transient(err):
                    self._putback(batch[i:])
                    return False
                self._core.count("outcomes_dropped")
                self._core.log.error("policyd refused an outcome of call %s; dropped: %s", o.call.call_id, describe(err))

    def drain(self, deadline: float) -> int:
        """Sends everything still queued, after run has returned, until
        ``deadline`` (time.monotonic). Returns the number of outcomes policyd
        could not take, which are counted as dropped."""
        wait = threading.Event()
        while True:
            left = deadline - time.monotonic()
            if self._flush(max(min(self._rpc_timeout, left), 0.001)):
                return 0
            left = deadline - time.monotonic()
            if left <= 0:
                with self._cond:
                    lost = len(self._q)
                    self._q.clear()
                self._core.count("outcomes_dropped", lost)
                self._core.log.warning("policyd_client: %d outcomes not reported", lost)
                return lost
            wait.wait(min(0.05, left))
