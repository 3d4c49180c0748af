"""tenacity strategies backed by policyd's decisions
(``pip install 'policyd-client[tenacity]'``)::

    policy = policyd_client.tenacity.Policy(client, target="geocoder", idempotent=True)

    @tenacity.retry(**policy.strategies())
    def geocode(q: str) -> dict: ...

:class:`Policy` (for ``tenacity.Retrying`` and the ``@retry`` decorator,
driven by a :class:`policyd_client.Client`) and :class:`AsyncPolicy` (for
``tenacity.AsyncRetrying``, driven by a :class:`policyd_client.AsyncClient`)
run the client's own retry loop, one call per tenacity retry state, with
tenacity making the attempts and the waits:

- ``before`` admits each attempt through the fleet-wide breaker (at no RPC
  cost while it is known CLOSED), waiting out a fleet-wide cool-down; an
  attempt the breaker refuses raises :class:`policyd_client.RetryError`
  (``result.disposition`` is ``circuit_open``), as tenacity has no way to
  skip an attempt;
- ``retry`` reports a success, or classifies the exception and asks policyd
  (or, when policyd cannot answer in time, the local policy) what to do:
  True for every failure, so that tenacity consults ``stop``;
- ``stop`` is policyd's STOP (terminal, not idempotent, attempts, deadline,
  budget, breaker), after the call's final outcome was reported;
- ``wait`` is policyd's delay, never shorter than a server's Retry-After;
- ``before_sleep`` logs the decision (``logger``, ``log_level``).

Pass all five (``strategies()`` returns them as keyword arguments); do not
combine them with tenacity's own stops or retries, which would end calls
policyd was told continue. :meth:`Policy.result` says how a call ended,
:meth:`Policy.attempt` (or :func:`policyd_client.current_attempt` inside the
function) gives the attempt's timeout, idempotency key and target.

Fallback targets: when the target's policy escalates (``fallback``), an
attempt may go to a fallback target instead of ``target``:
``current_attempt().target`` (or ``Policy.attempt(rs).target``) inside the
function says where this attempt goes, and :meth:`Policy.target` says where
the next one goes once policyd scheduled the retry (in ``before_sleep`` and
``wait``; ``before_sleep``'s log line names it). The function sends the
attempt there; tenacity itself knows nothing of targets. A failure that
is not an ``Exception`` (``KeyboardInterrupt``, a task's cancellation) ends
the call as ``dead_letter`` with stop reason ``DEADLINE`` and is raised as
it is.

A call with an idempotency key (a non-idempotent one with ``submission``)
claims it in policyd's ledger before each attempt. When an earlier attempt
of the key succeeded (in this process or another), the call ends as
succeeded without calling the function: the retrying call returns the
earlier attempt's result reference (the string it returned; None if it kept
none), the iterator form ends without an attempt, and
:meth:`Policy.result` has ``deduplicated`` set. When the previous attempt's
outcome is unknown (a timeout, a reset, a 504), ``before`` raises
:class:`policyd_client.RetryError` (``dead_letter``,
``idempotency:unknown``) unless the target's policy sets
``upstream_dedupes_by_key``.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import threading
import weakref
from typing import Any, Awaitable, Callable, Optional, TypedDict, Union

from tenacity import RetryCallState

from . import _loop
from ._core import _CURRENT, CallState, Core, PendingOutcome
from ._model import Attempt, Result
from .aio import AsyncClient
from .client import Client
from .errors import RetryError

__all__ = ["AsyncPolicy", "AsyncStrategies", "Policy", "Strategies"]


class Strategies(TypedDict):
    """:meth:`Policy.strategies`: keyword arguments of ``Retrying`` and
    ``@retry``."""

    before: Callable[[RetryCallState], None]
    retry: Callable[[RetryCallState], bool]
    stop: Callable[[RetryCallState], bool]
    wait: Callable[[RetryCallState], float]
    before_sleep: Callable[[RetryCallState], None]


class AsyncStrategies(TypedDict):
    """:meth:`AsyncPolicy.strategies`: keyword arguments of
    ``AsyncRetrying`` and ``@retry`` on a coroutine function."""

    before: Callable[[RetryCallState], Awaitable[None]]
    retry: Callable[[RetryCallState], Awaitable[bool]]
    stop: Callable[[RetryCallState], bool]
    wait: Callable[[RetryCallState], float]
    before_sleep: Callable[[RetryCallState], None]

_NEVER = threading.Event()  # the calls tenacity runs are not cancelled by an event


def _fn(_: Attempt) -> None:
    """The function a tenacity call stands for in the client's core (tenacity
    itself calls the user's function)."""


async def _afn(_: Attempt) -> None:
    """_fn, for the asyncio client."""


def _skip_attempt(rs: RetryCallState, value: Any) -> bool:
    """Makes the tenacity call of rs end now with value, without calling
    the function: tenacity runs the actions of an iteration in order, and
    the one after ``before`` (running now) is the attempt; it is replaced by
    one that returns value (the call form returns it, the iterator form
    ends). Says whether tenacity's actions were as expected."""
    state = getattr(rs.retry_object, "iter_state", None)
    actions = getattr(state, "actions", None)
    if not isinstance(actions, list) or len(actions) != 2:
        return False

    def done(_: RetryCallState) -> Any:
        return value

    async def adone(_: RetryCallState) -> Any:
        return value

    actions[1] = adone if inspect.iscoroutinefunction(actions[1]) else done
    return True


class _Run:
    """One tenacity call's run of the client's loop."""

    def __init__(self, st: CallState[Any], loop: _loop.Loop) -> None:
        self.st = st
        self.loop = loop
        self.attempt: Optional[Attempt] = None
        self.started = 0.0
        self.token: Optional[contextvars.Token[Optional[Attempt]]] = None
        self.delay = 0.0
        self.stopped = False
        self.result: Optional[Result[Any]] = None


class _Strategies:
    """What both policies share: the call each retry state makes, and what
    the loop's answers mean for tenacity."""

    def __init__(
        self,
        core: Core,
        target: str,
        idempotent: bool,
        run_id: str,
        deadline_after: Optional[float],
        submission: Optional[Callable[..., tuple[str, Union[bytes, str]]]],
        logger: Optional[logging.Logger],
        log_level: int,
    ) -> None:
        self._core = core
        self._spec = (target, idempotent, run_id, deadline_after, submission)
        self._log = logger or logging.getLogger("policyd_client.tenacity")
        self._level = log_level
        self._runs: "weakref.WeakKeyDictionary[RetryCallState, _Run]" = weakref.WeakKeyDictionary()

    def result(self, rs: RetryCallState) -> Optional[Result[Any]]:
        """Returns how the call of retry state ``rs`` ended, None while it
        runs."""
        run = self._runs.get(rs)
        return run.result if run is not None else None

    def attempt(self, rs: RetryCallState) -> Optional[Attempt]:
        """Returns the attempt retry state ``rs`` makes: its number, call id,
        idempotency key and per-attempt timeout."""
        run = self._runs.get(rs)
        return run.attempt if run is not None else None

    def target(self, rs: RetryCallState) -> Optional[str]:
        """Returns the target of the attempt retry state ``rs`` makes, or,
        once policyd scheduled a retry (in ``before_sleep`` and ``wait``),
        of the next attempt: the primary, or a fallback policyd escalated
        the call to. None before ``before`` ran for ``rs``."""
        run = self._runs.get(rs)
        return run.st.target if run is not None else None

    def stop(self, rs: RetryCallState) -> bool:
        """Says whether policyd stopped the call."""
        return self._run(rs).stopped

    def wait(self, rs: RetryCallState) -> float:
        """Returns policyd's delay before the next attempt, in seconds."""
        run = self._run(rs)
        return 0.0 if run.stopped else run.delay

    def before_sleep(self, rs: RetryCallState) -> None:
        """Logs the retry policyd scheduled."""
        run = self._run(rs)
        a = run.attempt
        if a is not None and self._log.isEnabledFor(self._level):
            exc = rs.outcome.exception() if rs.outcome is not None else None
            self._log.log(self._level, "policyd: retrying %s (call %s, attempt %d) in %.3fs on %s after %s",
                          self._spec[0], a.call_id, a.number, run.delay, run.st.target, exc)

    def _run(self, rs: RetryCallState) -> _Run:
        run = self._runs.get(rs)
        if run is None:
            raise TypeError("policyd_client.tenacity: give Retrying the policy's before as well as its "
                            "retry, stop and wait (strategies() has them all): before admits each attempt")
        return run

    def _begin(self, rs: RetryCallState) -> tuple[_Run, Any]:
        """Returns the run of rs and the reply to send its loop: a new run
        for the first attempt, else the answer to the wait tenacity did."""
        run = self._runs.get(rs)
        if run is not None and rs.attempt_number > 1:
            return run, False  # the Sleep: not cancelled
        target, idempotent, run_id, deadline_after, submission = self._spec
        call = self._core.decorated_call(target, idempotent, run_id, deadline_after, submission,
                                         tuple(rs.args), dict(rs.kwargs))
        st = self._core.begin(call, _fn)
        run = _Run(st, _loop.run(self._core, st))
        self._runs[rs] = run
        return run, None

    def _admitted(self, run: _Run, effect: Optional[_loop.Effect], rs: RetryCallState) -> None:
        """Starts the attempt the loop admitted, or refuses it. A call the
        idempotency ledger answered ends as succeeded without the attempt."""
        if effect is None:
            assert run.result is not None
            if run.result.deduplicated and _skip_attempt(rs, run.result.value):
                return
            raise RetryError(run.result)
        assert isinstance(effect, _loop.Invoke)
        run.attempt = effect.attempt
        run.started = self._core.now()
        run.token = _CURRENT.set(effect.attempt)

    def _invoked(self, run: _Run, rs: RetryCallState) -> tuple[Optional[_loop.Invoked], bool]:
        """Returns what the attempt did, for the loop, and whether the call
        was cancelled (a failure that is not an Exception)."""
        if run.token is not None:
            try:
                _CURRENT.reset(run.token)
            except ValueError:  # set in another context
                _CURRENT.set(None)
            run.token = None
        a = run.attempt
        assert a is not None and rs.outcome is not None
        latency = max(self._core.now() - run.started, 0.0)
        if not rs.outcome.failed:
            return _loop.Invoked(value=rs.outcome.result(), latency=latency), False
        err = rs.outcome.exception()
        if not isinstance(err, Exception):
            return None, True
        return _loop.Invoked(error=err, latency=latency, timed_out=a.timeout > 0 and latency >= a.timeout), False

    @staticmethod
    def _cancel(run: _Run, add: Callable[[PendingOutcome], None]) -> None:
        """Ends a call whose attempt was cancelled (DEAD_LETTER, DEADLINE), queueing
        what the loop reports with add."""
        try:
            effect = run.loop.throw(_loop.CallCancelled())
            while True:
                assert isinstance(effect, _loop.Report)
                add(effect.outcome)
                effect = run.loop.send(None)
        except StopIteration as done:
            run.result = done.value

    def _decided(self, run: _Run, effect: Optional[_loop.Effect]) -> bool:
        """Records what the loop decided after an attempt; returns tenacity's
        retry answer."""
        if effect is None:
            assert run.result is not None
            run.stopped = not run.result.ok
            return run.stopped
        assert isinstance(effect, _loop.Sleep)
        run.delay = effect.seconds
        return True


class Policy(_Strategies):
    """policyd's strategies for ``tenacity.Retrying`` and ``@retry``: each
    retry state is one call of ``target`` through ``client``. ``idempotent``,
    ``run_id``, ``deadline_after`` (seconds from the first attempt) and
    ``submission(*args, **kwargs)`` (the submission id and payload the
    idempotency key is derived from, as for :meth:`Client.retry`) describe
    the call. Safe for concurrent use by many threads."""

    def __init__(
        self,
        client: Client,
        target: str,
        *,
        idempotent: bool = False,
        run_id: str = "",
        deadline_after: Optional[float] = None,
        submission: Optional[Callable[..., tuple[str, Union[bytes, str]]]] = None,
        logger: Optional[logging.Logger] = None,
        log_level: int = logging.INFO,
    ) -> None:
        super().__init__(client._core, target, idempotent, run_id, deadline_after, submission, logger, log_level)
        self._client = client

    def strategies(self) -> Strategies:
        """Returns ``before``, ``retry``, ``stop``, ``wait`` and
        ``before_sleep``, as keyword arguments for ``Retrying`` or
        ``@retry``."""
        return Strategies(before=self.before, retry=self.retry, stop=self.stop, wait=self.wait,
                          before_sleep=self.before_sleep)

    def _drive(self, run: _Run, reply: Any, admitting: bool) -> Optional[_loop.Effect]:
        """Carries out the loop's effects until it hands tenacity an attempt
        (Invoke) or a wait (a Sleep after a decision); None when it ended. A
        cool-down before an attempt is waited out here."""
        reporter, stub = self._client._start()
        while True:
            try:
                effect = run.loop.send(reply)
            except StopIteration as done:
                run.result = done.value
                return None
            if isinstance(effect, _loop.Invoke):
                return effect
            if isinstance(effect, _loop.Sleep):
                if not admitting:
                    return effect
                self._client._sleep(effect.seconds, _NEVER)
                reply = False
                continue
            reply = self._client._do(effect, _fn, _NEVER, reporter, stub)

    def before(self, rs: RetryCallState) -> None:
        """Admits the attempt rs is about to make."""
        run, reply = self._begin(rs)
        self._admitted(run, self._drive(run, reply, admitting=True), rs)

    def retry(self, rs: RetryCallState) -> bool:
        """Reports the attempt's outcome and asks policyd what follows."""
        run = self._run(rs)
        got, cancelled = self._invoked(run, rs)
        if cancelled:
            self._cancel(run, self._client._start()[0].add)
            return False  # tenacity raises what the function raised
        return self._decided(run, self._drive(run, got, admitting=False))


class AsyncPolicy(_Strategies):
    """:class:`Policy` for ``tenacity.AsyncRetrying``, driven by an
    :class:`policyd_client.AsyncClient`; ``before`` and ``retry`` are
    coroutine functions, which AsyncRetrying awaits. Use it from tasks of
    the client's event loop."""

    def __init__(
        self,
        client: AsyncClient,
        target: str,
        *,
        idempotent: bool = False,
        run_id: str = "",
        deadline_after: Optional[float] = None,
        submission: Optional[Callable[..., tuple[str, Union[bytes, str]]]] = None,
        logger: Optional[logging.Logger] = None,
        log_level: int = logging.INFO,
    ) -> None:
        super().__init__(client._core, target, idempotent, run_id, deadline_after, submission, logger, log_level)
        self._client = client

    def strategies(self) -> AsyncStrategies:
        """Returns ``before``, ``retry``, ``stop``, ``wait`` and
        ``before_sleep``, as keyword arguments for ``AsyncRetrying`` or
        ``@retry`` on a coroutine function."""
        return AsyncStrategies(before=self.before, retry=self.retry, stop=self.stop, wait=self.wait,
                               before_sleep=self.before_sleep)

    async def _drive(self, run: _Run, reply: Any, admitting: bool) -> Optional[_loop.Effect]:
        """As :meth:`Policy._drive`, with awaits."""
        reporter, stub = self._client._io()
        while True:
            try:
                effect = run.loop.send(reply)
            except StopIteration as done:
                run.result = done.value
                return None
            if isinstance(effect, _loop.Invoke):
                return effect
            if isinstance(effect, _loop.Sleep):
                if not admitting:
                    return effect
                await self._client._sleep(effect.seconds)
                reply = False
                continue
            reply = await self._client._do(effect, _afn, reporter, stub)

    async def before(self, rs: RetryCallState) -> None:
        """Admits the attempt rs is about to make."""
        run, reply = self._begin(rs)
        self._admitted(run, await self._drive(run, reply, admitting=True), rs)

    async def retry(self, rs: RetryCallState) -> bool:
        """Reports the attempt's outcome and asks policyd what follows."""
        run = self._run(rs)
        got, cancelled = self._invoked(run, rs)
        if cancelled:
            self._cancel(run, self._client._io()[0].add)
            return False
        return self._decided(run, await self._drive(run, got, admitting=False))
