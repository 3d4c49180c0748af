"""What the sync and the asyncio clients share: configuration, counters, the
breaker cache, the state of one call, and the conversions to and from the
wire types. The two clients differ only in how they wait and do I/O."""

from __future__ import annotations

import collections
import contextvars
import logging
import math
import os
import random
import secrets
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Callable, Dict, Generator, Generic, Mapping, NamedTuple, Optional, TypedDict, TypeVar, Union

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from retrypolicy.v1 import retry_policy_service_pb2 as rpb
from retrypolicy.v1 import types_pb2

from ._model import (
    Attempt,
    BreakerState,
    Call,
    Disposition,
    Event,
    EventHook,
    EventKind,
    MAX_FALLBACKS,
    Fallback,
    Result,
    Stats,
    StopReason,
)
from .errors import RetryError
from .fallback import Decision, LocalBudget, LocalPolicy
from .key import idempotency_key

T = TypeVar("T")

_CURRENT: contextvars.ContextVar[Optional[Attempt]] = contextvars.ContextVar("policyd_attempt", default=None)


# Clients alive in this process, to be rebuilt in a child after os.fork().
_LIVE: "weakref.WeakSet[Any]" = weakref.WeakSet()
# gRPC objects a child inherited from its parent. They must be neither used
# nor closed in the child (closing a channel there can hang), and must not be
# collected either (their finalizers close and cancel), so the child keeps
# them here until it exits.
_INHERITED: list[object] = []


def follow_forks(client: Any) -> None:
    """Registers client to be told, in a child after os.fork(), to drop what
    it inherited (``client._after_fork_in_child()``): the parent's channel,
    threads or tasks, locks and queued outcomes. Holds client weakly."""
    _LIVE.add(client)


def inherit(*objs: object) -> None:
    """Keeps gRPC objects inherited from the parent alive and unused."""
    _INHERITED.extend(o for o in objs if o is not None)


def drop_inherited(core: "Core", owned: bool, channel: object, *objs: object) -> None:
    """Sets aside, in a child after os.fork(), what a client inherited from
    its parent's use (its channel when it dialled it, its stub, stream,
    reporter or tasks): kept alive and unused. A channel the caller gave
    cannot be redialled: it is kept in use, with a warning."""
    inherit(*objs)
    if owned:
        inherit(channel)
    else:
        core.log.warning(
            "policyd_client: a client with a channel of the caller's was used before os.fork(); "
            "gRPC channels do not survive fork: give an address instead, or make the client in the child"
        )


def _after_fork_in_child() -> None:
    for c in list(_LIVE):
        c._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def current_attempt() -> Optional[Attempt]:
    """Returns the attempt the running function makes, inside a function
    decorated with ``Client.retry`` / ``AsyncClient.retry`` (or run by
    ``call``); None elsewhere. Use it for the per-attempt timeout and the
    idempotency key."""
    return _CURRENT.get()


def to_timestamp(t: float) -> timestamp_pb2.Timestamp:
    """Converts Unix seconds to a Timestamp."""
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(round(t * 1e9)))
    return ts


def from_timestamp(ts: timestamp_pb2.Timestamp) -> float:
    """Converts a Timestamp to Unix seconds."""
    return ts.seconds + ts.nanos / 1e9


def to_duration(d: float) -> duration_pb2.Duration:
    """Converts seconds to a Duration."""
    out = duration_pb2.Duration()
    out.FromNanoseconds(int(round(max(d, 0.0) * 1e9)))
    return out


def from_duration(d: duration_pb2.Duration) -> float:
    """Converts a Duration to seconds."""
    return d.seconds + d.nanos / 1e9


#: gRPC call metadata, as the stubs take it.
Metadata = Optional[tuple[tuple[str, str], ...]]


def bearer(token: Optional[str]) -> Metadata:
    """Returns the metadata that sends token as "authorization: Bearer
    <token>", the form policyd's tenant and admin tokens take; None for no
    token. It is sent over plaintext channels too, so policyd's loopback
    default works; use TLS for anything else."""
    if not token:
        return None
    return (("authorization", "Bearer " + token),)


# Decision RPC errors that mean policyd is away or too slow: the client then
# decides locally for a while.
_UNREACHABLE = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
})

# ReportOutcome errors worth sending the same batch again for; any other code
# means policyd refused the batch for good (an unknown run, say), and the
# batch is split to find the outcomes it refuses.
REPORT_TRANSIENT = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
})


def rpc_code(err: BaseException) -> Optional[grpc.StatusCode]:
    """Returns the status code of a failed RPC, None for other errors."""
    code = getattr(err, "code", None)
    if isinstance(err, grpc.RpcError) and callable(code):
        try:
            c = code()
        except Exception:
            return None
        return c if isinstance(c, grpc.StatusCode) else None
    return None


def report_is_transient(err: BaseException) -> bool:
    """Says whether a failed ReportOutcome may succeed when sent again."""
    code = rpc_code(err)
    return code is None or code in REPORT_TRANSIENT


class Options(TypedDict, total=False):
    """The tunables both clients take as keyword arguments; their defaults
    (and meaning) are those of :class:`Settings`."""

    decision_timeout: float
    attempt_timeout: float
    retry_unreachable_after: float
    local_budget: float
    local_budget_per_second: float
    batch_size: int
    flush_interval: float
    queue_size: int
    watch: bool
    close_timeout: float
    reconnect_base: float
    reconnect_cap: float
    fallbacks: Mapping[str, Fallback]
    require_claim: bool


def settings(tenant: str, options: Options) -> "Settings":
    """Returns the settings of a client of tenant with options, validated."""
    try:
        return Settings(tenant, **options).checked()
    except TypeError as e:
        raise TypeError(f"policyd_client: unknown option: {e}") from None


@dataclass(frozen=True)
class Settings:
    """A client's configuration, validated, with defaults filled in: the
    one place the defaults are written. Times are seconds.

    - ``decision_timeout`` bounds every decision RPC (Admit, NextDelay); past
      it the client decides locally, except about a target with a
      fleet-wide ceiling: its Admit waits up to
      max(decision_timeout, retry_unreachable_after), and while policyd is
      silent the call waits and asks again, ending a dead letter (DEADLINE,
      ``flow:unavailable``) when its deadline leaves no room.
    - ``attempt_timeout`` is the per-attempt timeout until policyd says
      otherwise (policyd's default).
    - ``retry_unreachable_after``: after policyd failed to answer, the client
      decides locally for this long before asking again.
    - ``local_budget`` / ``local_budget_per_second`` size the token bucket
      for retries decided locally.
    - ``batch_size``, ``flush_interval``, ``queue_size`` shape outcome
      reporting: batches of up to ``batch_size`` (at most 1000), sent when a
      batch is full and at least every ``flush_interval``, from a queue of
      ``queue_size`` (an outcome that finds it full is dropped and counted).
    - ``watch``: follow WatchBreakers so attempts against a CLOSED breaker
      cost no RPC and attempts against an OPEN one fail at once.
    - ``close_timeout``: how long ``close()`` gives policyd to take the
      outcomes still queued.
    - ``reconnect_base`` / ``reconnect_cap``: the watch reconnects after
      ``nominal/2 + U(0, nominal/2)`` with ``nominal = min(cap, base * 2^n)``
      after n failed tries in a row, so a restarted policyd is not hit by
      the whole fleet in lockstep.
    - ``fallbacks`` maps a target to its :class:`Fallback` (its policy's
      escalation, as set in policyd): the local copy the client follows
      while policyd cannot answer, and with which an attempt whose breaker
      the cache knows is OPEN goes to the next target of the chain (with
      ``on_circuit_open``) without an RPC. policyd's answers win whenever it
      answers; where given, it wins over the chains policyd tells (the
      WatchBreakers snapshot, ReportOutcome answers), which the client
      follows for the other targets. Default none.
    - ``require_claim`` makes a call that uses the idempotency ledger make no
      attempt without a claim: when policyd (or its store) cannot answer one,
      the call ends a dead letter (NOT_IDEMPOTENT, ``idempotency:unavailable``)
      instead of going on without the ledger. It trades the fallback's
      availability for exactly once across workers that may submit one
      document twice (the Go client's ``Config.RequireClaim``). Default False.
    """

    tenant: str
    decision_timeout: float = 0.25
    attempt_timeout: float = 10.0
    retry_unreachable_after: float = 1.0
    local_budget: float = 20.0
    local_budget_per_second: float = 2.0
    batch_size: int = 256
    flush_interval: float = 0.1
    queue_size: int = 65536
    watch: bool = True
    close_timeout: float = 1.0
    reconnect_base: float = 0.1
    reconnect_cap: float = 5.0
    fallbacks: Mapping[str, Fallback] = field(default_factory=dict)
    require_claim: bool = False

    def checked(self) -> "Settings":
        """Returns the settings validated, with policyd's caps applied."""
        if not self.tenant:
            raise ValueError("policyd_client: tenant is required")
        for name in ("decision_timeout", "attempt_timeout", "retry_unreachable_after", "flush_interval",
                     "close_timeout", "reconnect_base", "reconnect_cap"):
            v = getattr(self, name)
            if not (v > 0) or math.isinf(v):
                raise ValueError(f"policyd_client: {name} must be a positive number of seconds, got {v!r}")
        if self.local_budget <= 0 or self.local_budget_per_second < 0:
            raise ValueError("policyd_client: local_budget must be > 0 and local_budget_per_second >= 0")
        if self.reconnect_cap < self.reconnect_base:
            raise ValueError("policyd_client: reconnect_cap must be >= reconnect_base")
        if self.batch_size <= 0 or self.queue_size <= 0:
            raise ValueError("policyd_client: batch_size and queue_size must be > 0")
        for primary, fb in self.fallbacks.items():
            if not isinstance(primary, str) or not primary:
                raise ValueError("policyd_client: fallbacks must be keyed by non-empty target names")
            if not isinstance(fb, Fallback):
                raise TypeError(f"policyd_client: fallbacks[{primary!r}] must be a Fallback, got {type(fb).__name__}")
            fb.check(primary)
        # policyd takes at most 1000 outcomes per ReportOutcome; the
        # fallbacks are copied, so a caller's later change does not reach
        # a running client.
        fallbacks = {p: replace(fb, targets=tuple(fb.targets)) for p, fb in self.fallbacks.items()}
        return replace(self, batch_size=min(self.batch_size, 1000), fallbacks=fallbacks)


@dataclass(frozen=True)
class CachedBreaker:
    """A breaker as the cache knows it; times are Unix seconds (0: none)."""

    state: int
    forced: bool = False
    open_until: float = 0.0
    cooldown_until: float = 0.0


_CLOSED = CachedBreaker(state=types_pb2.BREAKER_STATE_CLOSED)


def cached_from_pb(b: types_pb2.Breaker) -> tuple[tuple[str, str], CachedBreaker]:
    """Converts a Breaker from WatchBreakers to a cache entry."""
    return (b.key.tenant, b.key.target), CachedBreaker(
        state=b.state,
        forced=b.forced,
        open_until=from_timestamp(b.open_until_time) if b.HasField("open_until_time") else 0.0,
        cooldown_until=from_timestamp(b.cooldown_until_time) if b.HasField("cooldown_until_time") else 0.0,
    )


class BreakerCache:
    """Mirrors the fleet's breakers for one tenant from WatchBreakers, so an
    attempt against a CLOSED breaker costs no RPC and one against an OPEN
    breaker fails without leaving the process. Safe for concurrent use.

    The cache answers only while the stream is connected and its snapshot is
    complete; only then does a breaker it was not told of count as CLOSED.
    """

    def __init__(self, tenant: str, emit: Optional[Callable[[Event], None]] = None) -> None:
        self.tenant = tenant
        self._emit = emit
        self._cond = threading.Condition()
        self._live = False
        self._m: dict[tuple[str, str], CachedBreaker] = {}
        # Which targets have a fleet-wide ceiling (a policy's flow settings):
        # from the snapshot, then from Admit and NextDelay answers. Before
        # the first snapshot every target is taken to have one, so the first
        # Admit tells.
        self._flow: dict[str, bool] = {}
        self._flow_known = False
        self._flow_other = False
        #: Called (on the updating thread) after every change; the asyncio
        #: client wakes its waiters with it.
        self.on_change: Optional[Callable[[], None]] = None
        #: The resume token of the last message applied, sent when the
        #: watch subscribes again: replicas of a Redis store go on after it,
        #: on any replica; "" subscribes for a fresh snapshot.
        self.resume_token = ""

    def after_fork(self) -> None:
        """Forgets everything in a child after os.fork(): its lock may have
        been held by a parent thread, and the child follows policyd anew."""
        self._cond = threading.Condition()
        self._live = False
        self._m = {}
        self._flow, self._flow_known, self._flow_other = {}, False, False
        self.resume_token = ""

    @property
    def live(self) -> bool:
        """True while the cache can answer."""
        return self._live

    def lookup(self, target: str) -> Optional[CachedBreaker]:
        """Returns the breaker of target for the tenant (or the target-scoped
        one), CLOSED when unknown, or None when the cache cannot answer."""
        with self._cond:
            if not self._live:
                return None
            b = self._m.get((self.tenant, target))
            if b is None:
                b = self._m.get(("", target))
            return b if b is not None else _CLOSED

    def open_at(self, now: float) -> Callable[[str], bool]:
        """Returns a function that says whether the cache last saw target's
        breaker (the tenant's, or the target-scoped one) open at now:
        forced OPEN, or OPEN until after now. Unlike lookup it answers from
        the last states seen while the stream is down too, for the local
        policy's routing along a chain."""

        def is_open(target: str) -> bool:
            with self._cond:
                b = self._m.get((self.tenant, target))
                if b is None:
                    b = self._m.get(("", target))
            return b is not None and b.state in OPEN_STATES and (b.forced or b.open_until > now)

        return is_open

    def flow_controlled(self, target: str) -> bool:
        """Says whether attempts to target must ask Admit for a lease or a
        rate slot, even while the breaker is CLOSED."""
        with self._cond:
            v = self._flow.get(target)
            if v is not None:
                return v
            return not self._flow_known or self._flow_other

    def ceiling_known(self, target: str) -> bool:
        """Says whether policyd told the client that target has a fleet-wide
        ceiling: an answer about it said so, or the snapshot did of the
        targets it did not name. A target the client has heard nothing of
        is not known to have one (though flow_controlled asks Admit)."""
        with self._cond:
            v = self._flow.get(target)
            if v is not None:
                return v
            return self._flow_known and self._flow_other

    def flow_reported(self, batch: "list[PendingOutcome]", resp: rpb.ReportOutcomeResponse) -> None:
        """Learns from a ReportOutcome answer: each target of the batch has
        a ceiling when the answer lists it (flow_controlled_targets), and
        none otherwise."""
        listed = set(resp.flow_controlled_targets)
        targets = {o.target or o.call.target for o in batch}
        with self._cond:
            for t in targets:
                self._flow[t] = t in listed

    def learn_flow(self, target: str, controlled: bool) -> None:
        """Records what an Admit or NextDelay answer said of target."""
        with self._cond:
            self._flow[target] = controlled

    def flow_snapshot(self, msg: rpb.WatchBreakersResponse) -> None:
        """Installs the flow-controlled targets of a snapshot_complete message."""
        fresh = {t: True for t in msg.flow_controlled_targets}
        fresh.update({t: False for t in msg.uncontrolled_targets})
        with self._cond:
            self._flow, self._flow_known, self._flow_other = fresh, True, msg.other_targets_flow_controlled

    def replace(self, fresh: dict[tuple[str, str], CachedBreaker]) -> None:
        """Installs a complete snapshot; the cache answers from now on."""
        with self._cond:
            self._m = fresh
            self._live = True
            self._changed()

    def resumed(self) -> None:
        """Keeps the states held: the stream resumed after the last message
        applied, and its changes follow. The cache answers from now on."""
        with self._cond:
            self._live = True
            self._changed()

    def update(self, key: tuple[str, str], b: CachedBreaker) -> None:
        """Records one breaker's change."""
        with self._cond:
            self._m[key] = b
            self._changed()
        if self._emit is not None and b.state in BreakerState._value2member_map_:
            self._emit(Event(EventKind.BREAKER_CHANGED, target=key[1], breaker_state=BreakerState(b.state)))

    def down(self) -> None:
        """Marks the stream broken: the cache stops answering."""
        with self._cond:
            self._live = False
            self._changed()

    def _changed(self) -> None:
        self._cond.notify_all()
        if self.on_change is not None:
            self.on_change()

    def wait(self, predicate: Callable[[], bool], timeout: Optional[float]) -> bool:
        """Blocks until predicate() holds (checked after every change) or
        timeout seconds pass; returns the predicate's last value."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def state(self, target: str) -> Optional[BreakerState]:
        """Returns target's breaker state as the cache sees it, None when the
        cache cannot answer."""
        b = self.lookup(target)
        return BreakerState(b.state) if b is not None and b.state in BreakerState._value2member_map_ else None


#: How long (seconds) a call Admit sent on from an open circuit makes the
#: client ask Admit, rather than fail at once, for an attempt whose breaker
#: the cache knows OPEN, for calls of that primary.
ESCALATION_MEMORY = 600.0
#: How many primaries' chains a client remembers.
MAX_CHAINS = 1024


@dataclass
class _Seen:
    targets: list[str] = field(default_factory=list)
    after: int = 0  # 0: not seen
    on_open_until: float = 0.0


def fallback_from_pb(f: types_pb2.FallbackSettings) -> Fallback:
    """Converts a policy's FallbackSettings (no targets: no chain)."""
    return Fallback(tuple(f.targets), after_attempts=f.after_attempts, on_circuit_open=f.on_circuit_open)


_NO_CHAIN = Fallback(())


class ChainMemory:
    """What the client knows of each primary's escalation chain (its
    effective policy's fallback), for when the client was given no local
    copy (``Settings.fallbacks``, which wins where given).

    policyd tells the chains: the WatchBreakers snapshot (fallback_chains
    for the targets a policy names, other_targets_fallback for the rest)
    and every ReportOutcome answer (fallback_chains of the batch's
    primaries), so a chain set after the snapshot is learnt within one
    report. Before a snapshot has told them, the client follows what it has
    seen in policyd's answers: the fallback targets calls were sent to, in
    order; after how many attempts NextDelay first sent a call off the
    primary (its after_attempts); and whether Admit recently sent a call on
    from an open circuit (on_circuit_open). Times are Unix seconds. Safe for
    concurrent use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._m: dict[str, _Seen] = {}
        # Once a snapshot told the chains (_told): the chain of each target
        # a policy names (_NO_CHAIN for none), and of every other target.
        self._told = False
        self._chains: dict[str, Fallback] = {}
        self._other = _NO_CHAIN

    def snapshot(self, msg: rpb.WatchBreakersResponse) -> None:
        """Replaces the chains told with those of a snapshot_complete
        message: every target of its flow lists is named by a policy and
        has the chain fallback_chains gives it, or none."""
        m = dict.fromkeys([*msg.flow_controlled_targets, *msg.uncontrolled_targets], _NO_CHAIN)
        m.update({c.target: fallback_from_pb(c.fallback) for c in msg.fallback_chains})
        other = fallback_from_pb(msg.other_targets_fallback)
        with self._lock:
            self._told, self._chains, self._other = True, m, other

    def reported(self, batch: "list[PendingOutcome]", resp: rpb.ReportOutcomeResponse) -> None:
        """Learns from a ReportOutcome answer: each primary of the batch's
        outcomes of attempts on the call's own target has the chain the
        answer lists for it, or none (an attempt on a fallback says nothing
        of the fallback's own chain). Before a snapshot told the chains it
        changes nothing."""
        listed = {c.target: fallback_from_pb(c.fallback) for c in resp.fallback_chains}
        with self._lock:
            if not self._told:
                return
            for o in batch:
                if not o.target:
                    self._chains[o.call.target] = listed.get(o.call.target, _NO_CHAIN)

    def told(self, primary: str) -> Optional[Fallback]:
        """Returns the chain policyd told for primary (no targets: none),
        None before a snapshot told the chains."""
        with self._lock:
            if not self._told:
                return None
            return self._chains.get(primary, self._other)

    def after_fork(self) -> None:
        """Rebuilds the lock in a child after os.fork()."""
        self._lock = threading.Lock()

    def learn(self, primary: str, came_from: str, to: str, attempt: int, by_circuit: bool, now: float) -> None:
        """Records that policyd sent attempt of a call of primary from
        target came_from to target to: Admit, past an open circuit
        (by_circuit), or NextDelay, by the chain."""
        with self._lock:
            s = self._m.get(primary)
            if s is None:
                if len(self._m) >= MAX_CHAINS:
                    self._m.clear()
                s = self._m[primary] = _Seen()
            if to != primary and to not in s.targets and len(s.targets) < MAX_FALLBACKS:
                s.targets.append(to)
            if by_circuit:
                s.on_open_until = now + ESCALATION_MEMORY
            elif came_from == primary and s.after == 0 and attempt > 1:
                s.after = attempt - 1

    def seen(self, primary: str) -> Optional[Fallback]:
        """Returns primary's chain as seen (after_attempts 0 when unseen),
        None when policyd never escalated a call of it."""
        with self._lock:
            s = self._m.get(primary)
            if s is None or not s.targets:
                return None
            return Fallback(tuple(s.targets), after_attempts=s.after)

    def escalates_on_open(self, primary: str, now: float) -> bool:
        """Says whether Admit sent a call of primary on from an open circuit
        within the last ESCALATION_MEMORY seconds."""
        with self._lock:
            s = self._m.get(primary)
            return s is not None and now < s.on_open_until


class Core:
    """The configuration, counters, local policy and breaker cache of one
    client. Safe for concurrent use."""

    def __init__(
        self,
        settings: Settings,
        now: Optional[Callable[[], float]],
        rand: Optional[Callable[[], float]],
        logger: Optional[logging.Logger],
        on_event: Optional[EventHook] = None,
    ) -> None:
        self.settings = settings
        self._on_event = on_event
        #: True when there is an event hook: events are built only then.
        self.observed = on_event is not None
        self.now: Callable[[], float] = now or time.time
        self.log = logger or logging.getLogger("policyd_client")
        self.rand: Callable[[], float] = rand or random.random
        budget = LocalBudget(self.settings.local_budget, self.settings.local_budget_per_second)
        self.local = LocalPolicy(self.settings.attempt_timeout, budget, self.rand)
        self.cache = BreakerCache(self.settings.tenant, self.emit)
        self.chains = ChainMemory()
        self._lock = threading.Lock()
        self._stats = Stats()
        # When to ask policyd again after it failed to answer (Unix seconds
        # on self.now); until then decisions are local.
        self._down_until = 0.0
        # The cut-off of each run the calls named, as Admit told it (Unix
        # seconds), so the cut-off holds while Admit is skipped.
        self._run_cutoffs: Dict[str, float] = {}

    def fallback(self, primary: str) -> Optional[Fallback]:
        """Returns the local copy of primary's fallback settings, if the
        client was given one."""
        return self.settings.fallbacks.get(primary)

    def chain(self, primary: str) -> Optional[Fallback]:
        """Returns the chain the client knows for primary: the local copy
        where it was given one, else the chain policyd told (no targets:
        none); None when neither is known (the chain seen is followed)."""
        fb = self.settings.fallbacks.get(primary)
        return fb if fb is not None else self.chains.told(primary)

    def run_cutoff(self, run_id: str) -> Optional[float]:
        """Returns the run's cut-off, when Admit told it."""
        with self._lock:
            return self._run_cutoffs.get(run_id)

    def learn_cutoff(self, run_id: str, cutoff: float) -> None:
        """Remembers the run's cut-off (at most MAX_RUN_CUTOFFS runs; beyond
        that the memory starts over, and a run forgotten costs one Admit)."""
        with self._lock:
            if run_id not in self._run_cutoffs and len(self._run_cutoffs) >= MAX_RUN_CUTOFFS:
                self._run_cutoffs.clear()
            self._run_cutoffs[run_id] = cutoff

    def after_fork(self) -> None:
        """Rebuilds the locks in a child after os.fork() (a parent thread may
        have held them), empties the breaker cache and starts the counters
        afresh; the local budget keeps its tokens."""
        self._lock = threading.Lock()
        self._stats = Stats()
        self._down_until = 0.0
        self.cache.after_fork()
        self.chains.after_fork()
        self.local.budget.after_fork()

    def emit(self, event: Event) -> None:
        """Calls the event hook, if any; what it raises is logged."""
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception:
            self.log.exception("policyd_client: the on_event hook raised on %s", event.kind)

    def count(self, name: str, n: int = 1) -> None:
        """Adds n to the counter name of Stats."""
        with self._lock:
            setattr(self._stats, name, getattr(self._stats, name) + n)

    def stats(self) -> Stats:
        """Returns a snapshot of the counters."""
        with self._lock:
            return replace(self._stats)

    def reachable(self) -> bool:
        """Says whether to ask policyd now."""
        with self._lock:
            return self.now() >= self._down_until

    def unreachable(self, err: BaseException) -> None:
        """Records that policyd failed to answer in time."""
        with self._lock:
            self._down_until = self.now() + self.settings.retry_unreachable_after
        self.log.warning(
            "policyd did not answer; deciding locally for %.3gs: %s",
            self.settings.retry_unreachable_after, describe(err),
        )

    @staticmethod
    def silence(err: BaseException) -> bool:
        """Says whether err means policyd did not answer (unreachable, slow,
        shedding, or the channel closed), not that it refused the request."""
        code = rpc_code(err)
        return code is None or code in _UNREACHABLE

    def failed(self, err: BaseException) -> None:
        """Notes a decision RPC that did not answer. An unreachable or slow
        policyd switches the client to local decisions for a while; any other
        error (a bad request, say) is logged and decided locally this once."""
        if self.silence(err):
            self.unreachable(err)
        else:
            self.log.error("policyd refused a decision request; deciding locally: %s", describe(err))

    def spread(self, d: float) -> float:
        """Spreads a fleet-wide cool-down of d seconds like policyd spreads a
        hint, over [d, d + max(d/10, 0.25)], so the workers one cool-down
        holds do not all call at the instant it ends."""
        return d + self.rand() * max(d / 10, 0.25)

    def reconnect_delay(self, failures: int) -> float:
        """Returns how long the watch waits before its next try after
        ``failures`` failed tries in a row: equal jitter over
        min(cap, base * 2^failures), so never below half of it and never
        above the cap."""
        s = self.settings
        nominal = min(s.reconnect_cap, s.reconnect_base * 2.0 ** min(failures, 64))
        return nominal / 2 + self.rand() * nominal / 2

    def decorated_call(
        self,
        target: str,
        idempotent: bool,
        run_id: str,
        deadline_after: Optional[float],
        submission: Optional[Callable[..., tuple[str, Union[bytes, str]]]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Call:
        """Returns the Call that one invocation of a function decorated with
        ``retry`` makes."""
        sid, payload = submission(*args, **kwargs) if submission is not None else ("", b"")
        return Call(
            target=target, submission_id=sid, payload=payload, idempotent=idempotent, run_id=run_id,
            deadline=self.now() + deadline_after if deadline_after is not None else None,
        )

    def begin(self, call: Call, fn: Any) -> "CallState[Any]":
        """Validates a call and returns its state before the first attempt."""
        if not isinstance(call, Call):
            raise TypeError(f"policyd_client: call must be a Call, got {type(call).__name__}")
        if not call.target:
            raise ValueError("policyd_client: Call.target is required")
        if fn is None or not callable(fn):
            raise TypeError("policyd_client: fn must be callable")
        if "\x00" in call.submission_id:
            raise ValueError("policyd_client: Call.submission_id must not contain NUL")
        if len(call.triage_ref.encode()) > MAX_TRIAGE_REF_LEN:
            raise ValueError(f"policyd_client: Call.triage_ref must be at most {MAX_TRIAGE_REF_LEN} bytes")
        self.count("calls")
        key = call.idempotency_key
        if not key and call.submission_id:
            key = idempotency_key(call.submission_id, call.payload)
        call_id = call.call_id or call.submission_id or secrets.token_hex(12)
        origin: float
        if isinstance(call.origin, datetime):
            if call.origin.tzinfo is None:
                raise ValueError("policyd_client: Call.origin must be an aware datetime (or Unix seconds)")
            origin = call.origin.timestamp()
        else:
            origin = self.now() if call.origin is None else float(call.origin)
        deadline: Optional[float]
        if isinstance(call.deadline, datetime):
            if call.deadline.tzinfo is None:
                raise ValueError("policyd_client: Call.deadline must be an aware datetime (or Unix seconds)")
            deadline = call.deadline.timestamp()
        else:
            deadline = None if call.deadline is None else float(call.deadline)
        info = CallInfo(
            tenant=self.settings.tenant, target=call.target, call_id=call_id, key=key, run_id=call.run_id,
            idempotent=call.idempotent, origin=origin, deadline=deadline, triage_ref=call.triage_ref,
            claim_key=call.claim_key,
        )
        return CallState(info, timeout=self.settings.attempt_timeout)


def value_of(res: Result[T]) -> T:
    """Returns a decorated function's value: the call's value on success;
    otherwise raises RetryError from the last exception."""
    if res.ok:
        return res.value  # type: ignore[return-value]
    raise RetryError(res) from res.error


def describe(err: BaseException) -> str:
    code = rpc_code(err)
    if code is not None:
        details = getattr(err, "details", None)
        return f"{code.name}: {details() if callable(details) else err}"
    return f"{type(err).__name__}: {err}"


@dataclass(frozen=True)
class CallInfo:
    """One call's identity and limits, shared by its attempts and by the
    outcomes the reporter turns into messages. Times are Unix seconds."""

    tenant: str
    target: str
    call_id: str
    key: str
    run_id: str
    idempotent: bool
    origin: float
    deadline: Optional[float]
    triage_ref: str = ""
    claim_key: bool = False

    def pb(self) -> types_pb2.CallRef:
        """Returns the call as the API spells it."""
        ref = types_pb2.CallRef(
            tenant=self.tenant, target=self.target, call_id=self.call_id, idempotent=self.idempotent,
            idempotency_key=self.key, run_id=self.run_id, origin_time=to_timestamp(self.origin),
            triage_ref=self.triage_ref,
        )
        if self.deadline is not None:
            ref.deadline_time.CopyFrom(to_timestamp(self.deadline))
        return ref

    def outcome_ref(self) -> types_pb2.CallRef:
        """Returns the call as an outcome names it: ReportOutcome reads only
        the tenant, target, call id, run id and triage reference (for the
        run's call table), so the times and the key stay out of every
        batch."""
        return types_pb2.CallRef(tenant=self.tenant, target=self.target, call_id=self.call_id, run_id=self.run_id,
                                 triage_ref=self.triage_ref, idempotency_key=self.key)


class PendingOutcome(NamedTuple):
    """One attempt's outcome as a worker queues it; the reporter turns it
    into a message, off the worker's path."""

    call: CallInfo
    attempt: int
    success: bool = False
    already_recorded: bool = False
    failure: Optional[types_pb2.Failure] = None
    permit: str = ""
    lease: str = ""
    latency: float = 0.0
    final: int = types_pb2.DISPOSITION_UNSPECIFIED
    stop: int = types_pb2.STOP_REASON_UNSPECIFIED
    deduplicated: bool = False
    #: The target the attempt went to, when not the primary.
    target: str = ""
    #: The deadline a final outcome tells, when the caller ended the call
    #: (cancelled it) before the deadline policyd knows: the moment it did.
    deadline: Optional[float] = None

    def pb(self) -> rpb.Outcome:
        """Returns the Outcome message."""
        o = rpb.Outcome(
            call=self.call.outcome_ref(), attempt=self.attempt, success=self.success, permit_id=self.permit, lease_id=self.lease,
            final_disposition=self.final, final_stop_reason=self.stop, already_recorded=self.already_recorded,  # type: ignore[arg-type]
            deduplicated=self.deduplicated, attempt_target=self.target,
        )
        if self.failure is not None:
            o.failure.CopyFrom(self.failure)
        if self.latency > 0:
            o.latency.CopyFrom(to_duration(self.latency))
        if self.deadline is not None:
            o.call.deadline_time.CopyFrom(to_timestamp(self.deadline))
        return o


class CallState(Generic[T]):
    """The state of one call between its attempts, and the outcomes it
    reports. Owned by the one thread or task running the call."""

    def __init__(self, info: CallInfo, timeout: float) -> None:
        self.info = info
        self.deadline = info.deadline
        #: The run's cut-off (Unix seconds), once known.
        self.cutoff: Optional[float] = None
        #: The call was answered by the idempotency ledger.
        self.deduplicated = False
        #: Once set, why no attempt may be made without a claim: an
        #: attempt's outcome was lost (``idempotency:unknown``), or a claim
        #: said another worker holds the key (``idempotency:in_flight``).
        self.must_claim = ""
        self._ref: Optional[types_pb2.CallRef] = None
        #: The per-attempt timeout for the next attempt, in seconds.
        self.timeout = timeout
        #: The last delay, in seconds.
        self.prev = 0.0
        self.attempts = 0
        self.disposition: Optional[Disposition] = None
        self.stop_reason: Optional[StopReason] = None
        self.reason = ""
        self.error: Optional[BaseException] = None
        self.local = False
        self.value: Optional[T] = None
        #: The concurrency lease the attempt holds; the next outcome or
        #: NextDelay returns it.
        self.lease = ""
        #: The target of the current (or next) attempt: the primary until
        #: policyd, or the local copy of the policy, escalates the call.
        self.target = info.target

    @property
    def attempt_target(self) -> str:
        """The target of the current attempt as the API spells it
        (attempt_target): empty for the primary."""
        return "" if self.target == self.info.target else self.target

    def take_lease(self) -> str:
        """Returns the lease held, which the caller returns, and forgets it."""
        lease, self.lease = self.lease, ""
        return lease

    @property
    def ref(self) -> types_pb2.CallRef:
        """The CallRef, built for the first RPC, then reused (a call that
        succeeds at once on a CLOSED breaker never builds it)."""
        if self._ref is None:
            self._ref = self.info.pb()
        return self._ref

    @property
    def ended(self) -> bool:
        return self.disposition is not None

    def attempt(self, number: int, now: float) -> Attempt:
        """Returns what the function is told about attempt number: the
        per-attempt timeout, capped by the call's deadline."""
        timeout = self.timeout
        if self.deadline is not None:
            timeout = max(min(timeout, self.deadline - now), 0.0)
        return Attempt(number=number, call_id=self.info.call_id, idempotency_key=self.info.key, timeout=timeout,
                       target=self.target)

    def result(self) -> Result[T]:
        assert self.disposition is not None
        return Result(
            disposition=self.disposition, stop_reason=self.stop_reason, reason=self.reason, attempts=self.attempts,
            error=self.error, call_id=self.info.call_id, idempotency_key=self.info.key, local=self.local,
            value=self.value, deduplicated=self.deduplicated, target=self.target,
        )

    def succeed(self, attempt: int, permit: str, latency: float, value: T) -> PendingOutcome:
        """Ends the call with success; returns the outcome to report."""
        self.disposition, self.error, self.value = Disposition.SUCCEEDED, None, value
        return PendingOutcome(self.info, attempt, success=True, permit=permit, lease=self.take_lease(), latency=latency,
                              final=types_pb2.DISPOSITION_SUCCEEDED, target=self.attempt_target)

    def failure(self, attempt: int, failure: types_pb2.Failure, permit: str, latency: float) -> PendingOutcome:
        """Returns the outcome of a failed attempt policyd has not seen (it was
        decided locally)."""
        return PendingOutcome(self.info, attempt, failure=failure, permit=permit, lease=self.take_lease(), latency=latency,
                              target=self.attempt_target)

    def end(
        self,
        disposition: Disposition,
        stop: Optional[StopReason],
        attempt: int,
        unrecorded: Optional[types_pb2.Failure] = None,
        cancelled_at: Optional[float] = None,
    ) -> PendingOutcome:
        """Ends the call with a failure disposition; returns the final outcome
        to report. ``unrecorded`` is the last failure when policyd has not
        seen it (a local decision); otherwise the outcome says the failure
        was already recorded by NextDelay. ``cancelled_at`` is when the
        caller cancelled the call (DEAD_LETTER, DEADLINE): the deadline of
        its own the call ended at, which the outcome tells policyd, since
        the deadline policyd knows (a policy's call_deadline) has not
        passed."""
        self.disposition, self.stop_reason = disposition, stop
        deadline = None
        if cancelled_at is not None:
            deadline = cancelled_at if self.deadline is None else min(self.deadline, cancelled_at)
        return PendingOutcome(
            self.info, max(attempt, 1), already_recorded=unrecorded is None, failure=unrecorded, lease=self.take_lease(),
            final=disposition.to_pb(), stop=stop.to_pb() if stop is not None else types_pb2.STOP_REASON_UNSPECIFIED,
            target=self.attempt_target, deadline=deadline,
        )


def decision_from_pb(resp: rpb.NextDelayResponse) -> Decision:
    """Converts policyd's NextDelay answer."""
    return Decision(
        retry=resp.decision == types_pb2.DECISION_RETRY,
        delay=from_duration(resp.delay),
        stop_reason=resp.stop_reason,
        disposition=resp.disposition,
        reason=resp.classification,
        attempt_timeout=from_duration(resp.attempt_timeout),
        target=resp.target,
    )


def stop_reason(r: int) -> Optional[StopReason]:
    """Maps a StopReason value; UNSPECIFIED or unknown values give None."""
    try:
        return StopReason.from_pb(r) if r != types_pb2.STOP_REASON_UNSPECIFIED else None
    except ValueError:
        return None


# Admit refusals that ask the caller to wait and ask again.
COOLDOWN = "cooldown:pushback"
CEILING_FULL = "concurrency:full"
RATE_LIMITED = "rate:limited"
#: Admit's reason for a call of a run past its cut-off.
RUN_CUTOFF = "run:cutoff"
#: The reason of a call to a target with a fleet-wide ceiling that ended
#: because policyd, which alone hands out its leases and rate slots, did
#: not answer before the deadline.
FLOW_UNAVAILABLE = "flow:unavailable"
#: The longest Call.triage_ref, in bytes.
MAX_TRIAGE_REF_LEN = 1024
#: How many runs' cut-offs a client remembers.
MAX_RUN_CUTOFFS = 1024

OPEN_STATES = (types_pb2.BREAKER_STATE_OPEN,)
FLOWING_STATES = (types_pb2.BREAKER_STATE_CLOSED, types_pb2.BREAKER_STATE_DISABLED)


def admit_from_cache(b: CachedBreaker, now: float) -> str:
    """Says what the cache allows for an attempt at now: "wait" (a fleet-wide
    cool-down is running), "go" (CLOSED or DISABLED), "open" (known OPEN:
    fail fast, also when forced OPEN without open_until) or "ask" (ask
    Admit: HALF_OPEN, or OPEN past its cooldown)."""
    if b.cooldown_until > now:
        return "wait"
    if b.state in FLOWING_STATES:
        return "go"
    if b.state in OPEN_STATES and (b.forced or b.open_until > now):
        return "open"
    return "ask"


class WatchSession:
    """One WatchBreakers stream's messages applied to the cache: the
    snapshot is gathered and installed whole at ``snapshot_complete`` (with
    the fallback chains it tells, into chains), later changes one by one.
    Owned by the thread or task reading the stream."""

    def __init__(self, cache: BreakerCache, chains: Optional[ChainMemory] = None) -> None:
        self._cache = cache
        self._chains = chains
        self._fresh: dict[tuple[str, str], CachedBreaker] = {}
        #: True once the snapshot is complete.
        self.complete = False

    def request(self, tenant: str) -> rpb.WatchBreakersRequest:
        """The stream's request: from the resume token of the last message
        the cache applied, if any."""
        return rpb.WatchBreakersRequest(tenant=tenant, resume_token=self._cache.resume_token)

    def feed(self, msg: rpb.WatchBreakersResponse) -> None:
        """Applies one message of the stream."""
        if msg.snapshot_complete:
            self._cache.flow_snapshot(msg)
            if self._chains is not None:
                self._chains.snapshot(msg)
            if msg.resumed:
                self._cache.resumed()
            else:
                self._cache.replace(self._fresh)
            self._cache.resume_token = msg.resume_token
            self.complete = True
            return
        k, v = cached_from_pb(msg.breaker)
        if self.complete:
            self._cache.update(k, v)
            self._cache.resume_token = msg.resume_token
        else:
            self._fresh[k] = v

    def failed(self, code: Optional[grpc.StatusCode]) -> None:
        """Notes how the stream ended: a token the store refused
        (INVALID_ARGUMENT) is dropped, so the next stream starts from a
        snapshot."""
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            self._cache.resume_token = ""


class OutcomeQueue:
    """The bounded queue of outcomes waiting to be reported. Safe for
    concurrent use."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self._lock = threading.Lock()
        self._q: collections.deque[PendingOutcome] = collections.deque()
        self.size, self.cap = core.settings.batch_size, core.settings.queue_size

    def __len__(self) -> int:
        return len(self._q)

    def add(self, o: PendingOutcome) -> bool:
        """Queues o without blocking; an outcome that finds the queue full
        is dropped and counted. Says whether a batch is full."""
        with self._lock:
            if len(self._q) >= self.cap:
                self._core.count("outcomes_dropped")
                return False
            self._q.append(o)
            return len(self._q) >= self.size

    def take(self) -> list[PendingOutcome]:
        """Removes and returns up to one batch."""
        with self._lock:
            return [self._q.popleft() for _ in range(min(len(self._q), self.size))]

    def putback(self, batch: list[PendingOutcome]) -> None:
        """Returns a batch policyd did not take to the front; if that
        overfills the queue, the oldest outcomes are dropped."""
        with self._lock:
            self._q.extendleft(reversed(batch))
            extra = len(self._q) - self.cap
            for _ in range(max(extra, 0)):
                self._q.popleft()
        if extra > 0:
            self._core.count("outcomes_dropped", extra)

    def give_up(self) -> int:
        """Drops everything still queued (policyd cannot take it), logging
        the calls it belonged to; returns how many outcomes were lost."""
        with self._lock:
            lost = list(self._q)
            self._q.clear()
        if lost:
            self._core.count("outcomes_dropped", len(lost))
            ids = sorted({o.call.call_id for o in lost})
            self._core.log.warning(
                "policyd_client: %d outcomes not reported (policyd did not take them in time), of calls %s%s",
                len(lost), ", ".join(ids[:10]), " ..." if len(ids) > 10 else "",
            )
        return len(lost)


#: A flush's effect: send this batch; the driver answers with the
#: ReportOutcomeResponse (or None) when policyd took it, or the exception
#: ReportOutcome raised.
SendBatch = list[PendingOutcome]
Sent = Union[rpb.ReportOutcomeResponse, BaseException, None]


def flush(core: Core, q: OutcomeQueue) -> Generator[SendBatch, Sent, bool]:
    """Sends everything queued, batch by batch, through the driver; says
    whether the queue emptied. A batch policyd did not take goes back to the
    queue; one policyd refuses for good is split so that only the outcomes
    it refuses are lost. The chains and ceilings an answer tells are
    learnt."""
    while True:
        batch = q.take()
        if not batch:
            return True
        err = yield batch
        if isinstance(err, rpb.ReportOutcomeResponse):
            core.chains.reported(batch, err)
            core.cache.flow_reported(batch, err)
            err = None
        if err is None:
            core.count("outcomes_sent", len(batch))
            core.count("report_batches_sent")
            continue
        if report_is_transient(err):
            q.putback(batch)
            return False
        # Refused for good: find the outcomes policyd refuses, one by one.
        for i, o in enumerate(batch):
            err = yield [o]
            if isinstance(err, rpb.ReportOutcomeResponse):
                core.chains.reported([o], err)
                core.cache.flow_reported([o], err)
                err = None
            if err is None:
                core.count("outcomes_sent")
                core.count("report_batches_sent")
                continue
            if report_is_transient(err):
                q.putback(batch[i:])
                return False
            core.count("outcomes_dropped")
            core.log.error("policyd refused an outcome of call %s; dropped: %s", o.call.call_id, describe(err))


def report_request(batch: SendBatch) -> rpb.ReportOutcomeRequest:
    """Returns the ReportOutcome request of a batch."""
    return rpb.ReportOutcomeRequest(outcomes=[o.pb() for o in batch])
