"""The client's public value types: what a call is, how it ended, counters."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Generic, Optional, Sequence, TypeVar, Union

from retrypolicy.v1 import types_pb2

T = TypeVar("T")


class Disposition(str, enum.Enum):
    """How a call ended, for routing: done, fix the input, park it on a
    dead-letter queue, or give up for this run. The values are the names the
    Go client's ``Disposition.String`` returns."""

    SUCCEEDED = "succeeded"
    #: The upstream refused for good: fix the input.
    FAILED_TERMINAL = "failed_terminal"
    #: Retries ran out (attempts, budget, pushback), or the call's own
    #: deadline or its cancellation ended it (stop reason DEADLINE): it may
    #: succeed later.
    DEAD_LETTER = "dead_letter"
    #: The run's cut-off ended it.
    DEADLINE_CUT = "deadline_cut"
    #: The upstream's breaker refused it.
    CIRCUIT_OPEN = "circuit_open"

    def __str__(self) -> str:
        return self.value

    def to_pb(self) -> int:
        """Returns the ``retrypolicy.v1.Disposition`` value."""
        return _DISPOSITION_TO_PB[self]

    @classmethod
    def from_pb(cls, d: int) -> "Disposition":
        """Maps a ``retrypolicy.v1.Disposition``; anything unknown is a dead
        letter, as in the Go client."""
        return _DISPOSITION_FROM_PB.get(d, cls.DEAD_LETTER)


_DISPOSITION_TO_PB: dict[Disposition, int] = {
    Disposition.SUCCEEDED: types_pb2.DISPOSITION_SUCCEEDED,
    Disposition.FAILED_TERMINAL: types_pb2.DISPOSITION_FAILED_TERMINAL,
    Disposition.DEAD_LETTER: types_pb2.DISPOSITION_DEAD_LETTER,
    Disposition.DEADLINE_CUT: types_pb2.DISPOSITION_DEADLINE_CUT,
    Disposition.CIRCUIT_OPEN: types_pb2.DISPOSITION_CIRCUIT_OPEN,
}
_DISPOSITION_FROM_PB: dict[int, Disposition] = {v: k for k, v in _DISPOSITION_TO_PB.items()}


class StopReason(str, enum.Enum):
    """The rule that ended a failed call. The values are the
    ``retrypolicy.v1.StopReason`` names without their prefix, as the Go
    client's ``Result.StopReason`` has them."""

    TERMINAL = "TERMINAL"
    NOT_IDEMPOTENT = "NOT_IDEMPOTENT"
    ATTEMPTS_EXHAUSTED = "ATTEMPTS_EXHAUSTED"
    DEADLINE = "DEADLINE"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
    CIRCUIT_OPEN = "CIRCUIT_OPEN"
    SERVER_PUSHBACK = "SERVER_PUSHBACK"

    def __str__(self) -> str:
        return self.value

    def to_pb(self) -> int:
        """Returns the ``retrypolicy.v1.StopReason`` value."""
        return types_pb2.StopReason.Value("STOP_REASON_" + self.value)

    @classmethod
    def from_pb(cls, r: int) -> "StopReason":
        """Maps a ``retrypolicy.v1.StopReason`` other than UNSPECIFIED."""
        return cls(types_pb2.StopReason.Name(r).removeprefix("STOP_REASON_"))


class BreakerState(enum.IntEnum):
    """The state of a fleet-wide breaker, as ``retrypolicy.v1.BreakerState``."""

    CLOSED = types_pb2.BREAKER_STATE_CLOSED
    OPEN = types_pb2.BREAKER_STATE_OPEN
    HALF_OPEN = types_pb2.BREAKER_STATE_HALF_OPEN
    DISABLED = types_pb2.BREAKER_STATE_DISABLED


@dataclass(frozen=True)
class Call:
    """One logical call: one unit of work and all its attempts.

    ``target`` names the upstream and is required: the primary, from which
    policyd may escalate attempts to the fallback targets of its policy
    (``Attempt.target`` says where each goes). ``submission_id`` names the
    unit of work (a document id, say); with ``payload`` it derives the
    idempotency key once, before the first attempt (see
    :func:`idempotency_key`), and it is the default call id.
    ``idempotency_key``, when set, is used instead of the derived key.
    ``idempotent`` says repeating the operation cannot duplicate an effect; a
    call that is not idempotent is retried only with an idempotency key, which
    a submission id provides. ``run_id`` names the batch run whose retry pool
    the call spends. ``deadline`` bounds the whole call: Unix seconds on the
    client's clock (its ``now``), or an aware ``datetime``. ``call_id`` names
    the call in policyd's audit trail; default the submission id, else a
    random id. ``origin`` is when the work began (the event's original
    timestamp; Unix seconds on the client's clock, or an aware
    ``datetime``): policyd anchors the call's deadline to it; default now.
    ``triage_ref`` is a reference for triage (the source document's URI,
    say), up to 1024 bytes: a call of a run carries it into the run's call
    table (``policyd run calls``). ``claim_key`` makes an idempotent call
    use policyd's idempotency ledger too (a non-idempotent call with a key
    always does): a string the function returns is kept as the result
    reference, and a later call of the same key gets it as its ``value``
    (``Result.deduplicated``) without the function being called.
    """

    target: str
    submission_id: str = ""
    payload: Union[bytes, str] = b""
    idempotency_key: str = ""
    idempotent: bool = False
    run_id: str = ""
    deadline: Union[float, datetime, None] = None
    call_id: str = ""
    origin: Union[float, datetime, None] = None
    triage_ref: str = ""
    claim_key: bool = False


#: The most fallback targets a chain names, as policyd's policy.MaxFallbacks.
MAX_FALLBACKS = 4


@dataclass(frozen=True)
class Fallback:
    """A target's escalation to fallback providers, as its policy's
    ``fallback`` (FallbackSettings) says: the client's local copy, followed
    while policyd cannot answer, and used to route around a breaker the
    cache knows is open. policyd's answers win whenever it answers.

    The chain is the primary (``Call.target``), then ``targets`` in order (a
    target equal to the primary is skipped). ``after_attempts`` K > 0 gives
    each target of the chain K attempts: attempt n goes to
    ``chain[min((n - 1) // K, len(chain) - 1)]``, so the last target keeps
    the rest; 0 keeps every attempt on the primary unless the circuit rule
    moves it. ``on_circuit_open`` sends an attempt whose target's breaker is
    open to the next target of the chain instead of stopping the call."""

    targets: Sequence[str]
    after_attempts: int = 0
    on_circuit_open: bool = False

    def chain(self, primary: str) -> tuple[str, ...]:
        """Returns the chain of a call of primary: the primary, then the
        fallback targets."""
        return (primary, *(t for t in self.targets if t != primary))

    def target_of(self, primary: str, attempt: int) -> str:
        """Returns the target attempt (from 1) of a call of primary goes to
        by the after_attempts rule, before the circuit rule."""
        if self.after_attempts <= 0:
            return primary
        chain = self.chain(primary)
        return chain[min((max(attempt, 1) - 1) // self.after_attempts, len(chain) - 1)]

    def route(self, primary: str, attempt: int, is_open: Callable[[str], bool]) -> Optional[str]:
        """Returns the target policyd sends attempt (from 1) of a call of
        primary to, is_open saying which breakers are open: target_of's;
        when its breaker is open and ``on_circuit_open``, the first later
        target of the chain whose breaker is not. None when the target
        chosen is open and no fallback takes the call: it stops
        CIRCUIT_OPEN. The rule is policyd's (policy.Fallback); the shared
        vectors (testdata/vectors.json, fallback_chains) hold both to it."""
        t = self.target_of(primary, attempt)
        if not is_open(t):
            return t
        if not self.on_circuit_open:
            return None
        chain = self.chain(primary)
        return next((c for c in chain[chain.index(t) + 1:] if not is_open(c)), None)

    def check(self, primary: str) -> None:
        """Raises ValueError naming the field and the rule when policyd
        would refuse these settings for primary's policy."""
        where = f"policyd_client: fallbacks[{primary!r}]"
        if isinstance(self.targets, str):
            raise ValueError(f"{where}.targets must be a sequence of target names, not a string")
        if not 1 <= len(self.targets) <= MAX_FALLBACKS:
            raise ValueError(f"{where}.targets must name 1 to {MAX_FALLBACKS} targets, got {len(self.targets)}")
        for i, t in enumerate(self.targets):
            if not isinstance(t, str) or not t:
                raise ValueError(f"{where}.targets[{i}] must be a non-empty target name")
            if t == primary:
                raise ValueError(f"{where}.targets[{i}] must not be the primary itself")
            if t in self.targets[:i]:
                raise ValueError(f"{where}.targets[{i}] repeats {t!r}")
        if isinstance(self.after_attempts, bool) or not isinstance(self.after_attempts, int) or self.after_attempts < 0:
            raise ValueError(f"{where}.after_attempts must be an integer >= 0, got {self.after_attempts!r}")


@dataclass(frozen=True)
class Attempt:
    """What the function a client runs is told about the attempt it makes.

    ``number`` counts from 1. ``call_id`` and ``idempotency_key`` are the same
    on every attempt; send the key to the upstream. ``timeout`` is the
    per-attempt timeout in seconds (policyd's, capped by the call's deadline):
    pass it to the HTTP or gRPC call the function makes. The asyncio client
    also enforces it. ``target`` is the upstream this attempt goes to: the
    call's target (the primary), or a fallback target policyd escalated the
    call to (its policy's ``fallback``); send the attempt there.
    """

    number: int
    call_id: str
    idempotency_key: str
    timeout: float
    target: str = ""


@dataclass(frozen=True)
class Result(Generic[T]):
    """How a call ended.

    ``disposition`` is the routing verdict. ``stop_reason`` is the rule that
    ended a failed call, None on success. ``reason`` is the classification of
    the last failure (``transient:503``, ``unclassified:ValueError``,
    ``breaker:open``), empty when nothing failed. ``attempts`` counts the calls
    of the function (0 when the breaker refused the first). ``error`` is the
    last exception the function raised (or :class:`Cancelled`), None on
    success. ``value`` is what the function returned, on success. ``local`` is
    true when at least one decision was made without policyd. ``target`` is
    the target the call ended on: the primary, or the fallback it escalated
    to.
    """

    disposition: Disposition
    stop_reason: Optional[StopReason] = None
    reason: str = ""
    attempts: int = 0
    error: Optional[BaseException] = None
    call_id: str = ""
    idempotency_key: str = ""
    local: bool = False
    value: Optional[T] = None
    #: True when the idempotency ledger said an earlier attempt succeeded:
    #: the function was not called; ``value`` is its result reference.
    deduplicated: bool = False
    target: str = ""

    @property
    def ok(self) -> bool:
        """True when the call succeeded."""
        return self.disposition is Disposition.SUCCEEDED


@dataclass
class Stats:
    """A snapshot of a client's counters."""

    #: call() invocations (and decorated calls).
    calls: int = 0
    #: Calls of the user's function.
    attempts: int = 0
    #: Admit RPCs sent (the CLOSED fast path sends none).
    admit_rpcs: int = 0
    #: Calls the idempotency ledger answered with an earlier success.
    deduplicated: int = 0
    #: Attempts refused locally from the breaker cache.
    fast_fails: int = 0
    #: Decisions made locally because policyd did not answer in time.
    local_decisions: int = 0
    #: Attempts sent to another target than the one before (a fallback).
    fallbacks: int = 0
    outcomes_sent: int = 0
    #: Outcomes lost: the queue was full, policyd refused them for good, or
    #: policyd was unreachable at close.
    outcomes_dropped: int = 0
    report_batches_sent: int = 0


class EventKind(str, enum.Enum):
    """What an :class:`Event` reports, as the Go client's event kinds."""

    #: The user's function is about to be called for ``attempt``.
    ATTEMPT_STARTED = "attempt_started"
    #: The attempt failed and the call will retry after ``delay`` seconds.
    RETRY_SCHEDULED = "retry_scheduled"
    #: The call ended without success: ``disposition``, ``stop_reason``.
    STOPPED = "stopped"
    #: policyd did not answer in time (or refused): ``reason`` was decided
    #: by the local copy of the default policy (a degraded answer).
    LOCAL_DECISION = "local_decision"
    #: The watch saw the breaker of ``target`` change to ``breaker_state``.
    BREAKER_CHANGED = "breaker_changed"
    #: ``attempt`` (and the call's later attempts) goes to ``to_target``
    #: (also ``target``) instead of ``from_target`` (the previous attempt's
    #: target, or the one Admit was asked for): policyd escalated it, or the
    #: client did (``local``: its local copy, or the chain it saw).
    FALLBACK_TAKEN = "fallback_taken"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Event:
    """One thing a client did or saw, for metrics and logs: give a client
    ``on_event=callable``. The hook runs on the thread or task that caused
    the event (a breaker change: the watch's), so it should be quick; what
    it raises is logged and otherwise ignored. Fields that do not apply to
    the kind are empty. ``target`` is the attempt's target (the call's, or
    the fallback it was escalated to; for BREAKER_CHANGED the breaker's),
    as the Go client's ``Event.Target``."""

    kind: EventKind
    target: str
    call_id: str = ""
    attempt: int = 0
    #: Seconds: the per-attempt timeout (ATTEMPT_STARTED) or the wait
    #: before the next attempt (RETRY_SCHEDULED).
    delay: float = 0.0
    reason: str = ""
    disposition: Optional[Disposition] = None
    stop_reason: Optional[StopReason] = None
    breaker_state: Optional[BreakerState] = None
    #: True when a decision of this call was made without policyd.
    local: bool = False
    #: FALLBACK_TAKEN: the target the call left, and the one it moved to.
    from_target: str = ""
    to_target: str = ""


#: The hook a client calls for every event.
EventHook = Callable[[Event], None]


class Cancelled(Exception):
    """The call was cancelled (its ``cancel`` event was set) while it waited;
    :attr:`Result.error` holds it and the disposition is DEAD_LETTER
    (stop reason DEADLINE)."""

