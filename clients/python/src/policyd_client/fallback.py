"""The local copy of policyd's default policy, used while policyd cannot be
reached or does not answer within the decision timeout.

It keeps to the same rules as the Go client's ``localPolicy``: the default
classification tables and reasons, FULL jitter over base 0.5 s x 2^n capped
at 30 s, 3 attempts, a Retry-After hint never undercut (spread above it by
max(10 %, 250 ms)), the deadline checked before the wait with the attempt
timeout reserved, and a local token bucket so a fleet cut off from policyd
cannot storm its upstreams. Like policyd's default policy (and unlike the Go
client, see the package README), a hint is honoured up to one hour: every
valid hint, however large, is capped there rather than ignored; a negative
grpc-retry-pushback-ms stops (SERVER_PUSHBACK) and "-0" is zero.
"""

from __future__ import annotations

import email.utils
import re
import threading
from dataclasses import dataclass
from datetime import timezone
from typing import Callable, Optional

from retrypolicy.v1 import types_pb2

from .errors import ClassifiedFailure

__all__ = ["LocalPolicy", "LocalBudget", "classify_local", "parse_hints", "parse_retry_after"]

Category = int  # a retrypolicy.v1.Category value

_TRANSIENT_HTTP = frozenset({429, 500, 502, 503, 504})
_TERMINAL_HTTP = frozenset({400, 401, 403, 404, 422})
# UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, ABORTED
_TRANSIENT_GRPC = frozenset({14, 8, 4, 10})
_GRPC_NAMES = (
    "OK", "CANCELED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)
_TRANSPORT = {
    types_pb2.TRANSPORT_ERROR_TIMEOUT: (types_pb2.CATEGORY_TRANSIENT, "transport:timeout", False),
    types_pb2.TRANSPORT_ERROR_CONNECTION_RESET: (types_pb2.CATEGORY_TRANSIENT, "transport:connection_reset", False),
    # Refused connections and DNS failures never sent the request.
    types_pb2.TRANSPORT_ERROR_CONNECTION_REFUSED: (types_pb2.CATEGORY_TRANSIENT, "transport:connection_refused", True),
    types_pb2.TRANSPORT_ERROR_DNS: (types_pb2.CATEGORY_TRANSIENT, "transport:dns", True),
}

NOT_IDEMPOTENT = "unsafe:not_idempotent"


def _classify_default(f: types_pb2.Failure) -> tuple[Category, str, bool]:
    """Returns (category, reason, never_sent) under the default tables."""
    kind = f.WhichOneof("kind")
    if kind == "http_status":
        code = f.http_status
        if code in _TRANSIENT_HTTP:
            return types_pb2.CATEGORY_TRANSIENT, f"transient:{code}", False
        if code in _TERMINAL_HTTP:
            return types_pb2.CATEGORY_TERMINAL, f"terminal:{code}", False
        return types_pb2.CATEGORY_UNCLASSIFIED, f"unclassified:{code}", False
    if kind == "grpc_code":
        code = f.grpc_code
        name = "grpc_" + (_GRPC_NAMES[code].lower() if code < len(_GRPC_NAMES) else str(code))
        if code in _TRANSIENT_GRPC:
            return types_pb2.CATEGORY_TRANSIENT, "transient:" + name, False
        return types_pb2.CATEGORY_TERMINAL, "terminal:" + name, False
    if kind == "transport_error":
        return _TRANSPORT.get(f.transport_error, (types_pb2.CATEGORY_TERMINAL, "transport:tls", False))
    if kind == "local_error":
        if f.local_error == types_pb2.LOCAL_ERROR_VALIDATION:
            return types_pb2.CATEGORY_TERMINAL, "local:validation", False
        return types_pb2.CATEGORY_TERMINAL, "local:parse", False
    return types_pb2.CATEGORY_UNCLASSIFIED, "unclassified:unknown", False


def classify_local(f: types_pb2.Failure, idempotent: bool, has_key: bool) -> tuple[Category, str]:
    """Returns the category and reason policyd's default tables give failure
    ``f``: a transient failure of an operation that is neither idempotent nor
    carries an idempotency key has reason ``unsafe:not_idempotent``, unless
    the request never left the caller (connection refused, DNS)."""
    cat, reason, never_sent = _classify_default(f)
    if cat == types_pb2.CATEGORY_TRANSIENT and not idempotent and not has_key and not never_sent:
        return cat, NOT_IDEMPOTENT
    return cat, reason


_INTEGER = re.compile(r"(-?)([0-9]+)")

#: X-RateLimit-Reset values above this are Unix times, not counts of seconds.
_UNIX_THRESHOLD = 1_000_000_000


def _integer(value: str) -> Optional[int]:
    """Parses a decimal integer of any size (ASCII digits, an optional
    leading '-'); "-0" is 0. None for anything else."""
    m = _INTEGER.fullmatch(value.strip())
    if m is None:
        return None
    n = int(m.group(2))
    return -n if m.group(1) else n


def _http_date(value: str) -> Optional[float]:
    """Parses an HTTP-date in any of the three RFC 9110 forms with
    email.utils (locale independent) into Unix seconds; None for anything
    else, including a zone other than GMT."""
    if "," in value and not value.endswith(" GMT"):
        return None
    try:
        t = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if t.tzinfo is None:  # asctime: UTC by definition
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp()


def parse_retry_after(value: str, now: float) -> Optional[float]:
    """Parses a Retry-After value, delta-seconds or an HTTP-date in any of the
    three RFC 9110 forms, into seconds from ``now`` (Unix seconds); a date in
    the past gives 0. Any valid value counts, however large (the policy's
    ``max_hint`` caps what is honoured); "-0" is 0. Anything else (a
    negative delta, garbage) gives None: the hint is ignored."""
    v = value.strip()
    if not v:
        return None
    if v[0] == "-" or v[0].isdigit():
        n = _integer(v)
        return float(n) if n is not None and n >= 0 else None
    t = _http_date(v)
    return None if t is None else max(t - now, 0.0)


def parse_hints(pushback: Optional[types_pb2.Pushback], now: float) -> tuple[Optional[float], bool]:
    """Combines a response's pushback headers as policy.ParseHints does:
    returns (the largest valid wait in seconds or None, do-not-retry). A
    negative grpc-retry-pushback-ms (but not "-0") means do not retry and
    wins over everything; other negative or unparseable values are ignored.
    Valid values are never refused for their size."""
    if pushback is None:
        return None, False
    waits: list[float] = []
    if pushback.retry_after:
        ra = parse_retry_after(pushback.retry_after, now)
        if ra is not None:
            waits.append(ra)
    if pushback.grpc_retry_pushback_ms:
        ms = _integer(pushback.grpc_retry_pushback_ms)
        if ms is not None and ms < 0:
            return None, True
        if ms is not None:
            waits.append(ms / 1000)
    if pushback.x_ratelimit_reset:
        n = _integer(pushback.x_ratelimit_reset)
        if n is not None and n >= 0:
            waits.append(max(n - now, 0.0) if n > _UNIX_THRESHOLD else float(n))
    if pushback.x_amz_retry_after:
        ms = _integer(pushback.x_amz_retry_after)
        if ms is not None and ms >= 0:
            waits.append(ms / 1000)
    return (max(waits) if waits else None), False


class LocalBudget:
    """A token bucket for retries decided locally: ``capacity`` tokens,
    refilled at ``per_second``. Safe for concurrent use."""

    def __init__(self, capacity: float, per_second: float) -> None:
        self._lock = threading.Lock()
        self.capacity = capacity
        self.tokens = capacity
        self.per_second = per_second
        self._last: Optional[float] = None

    def after_fork(self) -> None:
        """Rebuilds the lock in a child after os.fork()."""
        self._lock = threading.Lock()

    def take(self, now: float, cost: float) -> bool:
        """Withdraws ``cost`` tokens at ``now`` (Unix seconds) if there are
        enough, and reports whether it did."""
        with self._lock:
            if self._last is not None and now > self._last:
                self.tokens = min(self.capacity, self.tokens + (now - self._last) * self.per_second)
            self._last = now
            if self.tokens < cost:
                return False
            self.tokens -= cost
            return True

    def deposit(self, n: float) -> None:
        """Adds ``n`` tokens, up to the capacity."""
        with self._lock:
            self.tokens = min(self.capacity, self.tokens + n)


@dataclass(frozen=True)
class Decision:
    """NextDelay's answer, from policyd or from the local policy. Delays and
    timeouts are in seconds; stop_reason and disposition are
    ``retrypolicy.v1`` values."""

    retry: bool
    delay: float = 0.0
    stop_reason: int = types_pb2.STOP_REASON_UNSPECIFIED
    disposition: int = types_pb2.DISPOSITION_UNSPECIFIED
    reason: str = ""
    attempt_timeout: float = 0.0
    fallback: bool = False
    #: Where the next attempt goes on RETRY (NextDelayResponse.target);
    #: empty: where the last one went.
    target: str = ""


class LocalPolicy:
    """policyd's default policy, decided in the client. Safe for concurrent
    use (the budget is locked; the rest is read-only)."""

    base = 0.5
    factor = 2.0
    cap = 30.0
    max_attempts = 3
    #: policyd's default max_hint: a longer hint is honoured up to this.
    max_hint = 3600.0

    def __init__(self, attempt_timeout: float, budget: LocalBudget, rand: Callable[[], float]) -> None:
        self.attempt_timeout = attempt_timeout
        self.budget = budget
        self._rand = rand

    def decide(
        self,
        now: float,
        deadline: Optional[float],
        attempt: int,
        f: ClassifiedFailure,
        idempotent: bool,
        has_key: bool,
    ) -> Decision:
        """Decides locally after attempt number ``attempt`` failed with ``f``
        (which must be classified). Times are Unix seconds."""
        assert f.failure is not None
        cat, reason = classify_local(f.failure, idempotent, has_key)

        def stop(r: int, d: int) -> Decision:
            return Decision(False, 0.0, r, d, reason, self.attempt_timeout, True)

        if cat != types_pb2.CATEGORY_TRANSIENT:
            return stop(types_pb2.STOP_REASON_TERMINAL, types_pb2.DISPOSITION_FAILED_TERMINAL)
        if reason == NOT_IDEMPOTENT:
            return stop(types_pb2.STOP_REASON_NOT_IDEMPOTENT, types_pb2.DISPOSITION_DEAD_LETTER)
        if attempt >= self.max_attempts:
            return stop(types_pb2.STOP_REASON_ATTEMPTS_EXHAUSTED, types_pb2.DISPOSITION_DEAD_LETTER)
        hint, do_not_retry = parse_hints(f.pushback, now)
        if do_not_retry:
            return stop(types_pb2.STOP_REASON_SERVER_PUSHBACK, types_pb2.DISPOSITION_DEAD_LETTER)
        nominal = min(self.base * self.factor ** (attempt - 1), self.cap)
        delay = self._rand() * nominal
        if hint is not None:
            hint = min(hint, self.max_hint)
            spread = max(hint / 10, 0.25)
            delay = max(delay, hint + self._rand() * spread)
        if deadline is not None and now + delay + self.attempt_timeout > deadline:
            return stop(types_pb2.STOP_REASON_DEADLINE, types_pb2.DISPOSITION_DEAD_LETTER)
        if not self.budget.take(now, 2.0 if f.is_timeout else 1.0):
            return stop(types_pb2.STOP_REASON_BUDGET_EXHAUSTED, types_pb2.DISPOSITION_DEAD_LETTER)
        return Decision(True, delay, reason=reason, attempt_timeout=self.attempt_timeout, fallback=True)
