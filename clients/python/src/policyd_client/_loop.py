"""The retry loop, written once and without I/O: a generator that yields
the effects one call needs (admit, invoke the user's function, sleep, ask
for a decision, report an outcome) and is sent back what each effect
produced. The sync client drives it with blocking calls on its thread; the
asyncio client with awaits on its loop. Neither driver decides anything, so
the two cannot drift apart (httpcore's approach).

A driver answers each effect:

- :class:`Admit`: the ``AdmitResponse``, or the exception the RPC raised;
- :class:`Invoke`: an :class:`Invoked` (the value or the exception, the
  latency, whether it overran its timeout, whether the call was cancelled);
- :class:`Sleep`: True when the call was cancelled while it waited;
- :class:`Decide`: the ``NextDelayResponse``, or the exception;
- :class:`Report`: None (queueing never blocks).

Cancellation that arrives as an exception (an asyncio task's) is thrown into
the generator as :class:`CallCancelled`; it reports the call as
DEAD_LETTER (DEADLINE) and returns. A call that uses the idempotency ledger
claims its key (:class:`Claim`: the ``ClaimKeyResponse`` or the exception)
before each :class:`Invoke` and completes it after (:class:`Complete`: the
``CompleteKeyResponse`` or the exception; see :func:`_claim`).

Escalation: every attempt has a target (``CallState.target``, told to the
function as ``Attempt.target``): the primary (``Call.target``) for attempt
1, then wherever policyd's NextDelay (``target``) or Admit (``target``,
when the attempt's breaker is open and the policy escalates on an open
circuit) sends it. Admit, NextDelay and each outcome carry it as
``attempt_target`` (empty for the primary); the breaker cache is asked
about it, not about the primary. The chain of each primary is known from
the local copy of its fallback settings (``Settings.fallbacks``) where the
caller gave one, else from what policyd told (``_core.ChainMemory``: the
WatchBreakers snapshot and every ReportOutcome answer). While policyd
cannot answer, local admission and local decisions place each attempt by
policyd's rules over the chain known (:meth:`Fallback.route`) on the
breakers the cache last saw: the after_attempts rule, the skip past an open
target with on_circuit_open, CIRCUIT_OPEN when the target chosen is open
and none takes the call; with no chain known, by the chain seen in
policyd's answers once its after_attempts was seen, and otherwise the call
stays where policyd last sent it. An attempt the cache would refuse as OPEN
goes to the next target of the chain whose breaker is not known OPEN when
the local copy has ``on_circuit_open``, without an RPC; without a local
copy it asks Admit (one RPC, which names the fallback) when the chain told
escalates on an open circuit to a target not known OPEN, or Admit recently
sent a call of that primary on from an open circuit, and is refused at once
otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generator, NamedTuple, Optional, Union

from retrypolicy.v1 import retry_policy_service_pb2 as rpb
from retrypolicy.v1 import types_pb2

from ._core import (
    CEILING_FULL,
    COOLDOWN,
    FLOW_UNAVAILABLE,
    RATE_LIMITED,
    RUN_CUTOFF,
    CallState,
    Core,
    PendingOutcome,
    admit_from_cache,
    decision_from_pb,
    from_duration,
    from_timestamp,
    stop_reason,
)
from ._model import Attempt, Cancelled, Disposition, Event, EventKind, Fallback, Result, StopReason
from .errors import ClassifiedFailure, classify_exception
from .fallback import Decision


class Admit(NamedTuple):
    """Ask policyd's Admit whether the attempt may go ahead, within
    ``timeout`` seconds (None: the decision timeout)."""

    request: rpb.AdmitRequest
    timeout: Optional[float] = None


class Invoke(NamedTuple):
    """Call the user's function for one attempt."""

    attempt: Attempt


class Invoked(NamedTuple):
    """What one attempt of the user's function did."""

    value: Any = None
    error: Optional[Exception] = None
    latency: float = 0.0
    timed_out: bool = False
    cancelled: bool = False


class Sleep(NamedTuple):
    """Wait ``seconds`` before going on (interruptible by cancellation)."""

    seconds: float


class Decide(NamedTuple):
    """Send the queued outcomes, then ask policyd's NextDelay; both within
    the decision timeout."""

    request: rpb.NextDelayRequest


class Claim(NamedTuple):
    """Claim the call's idempotency key before an attempt (ClaimKey)."""

    request: rpb.ClaimKeyRequest


class Complete(NamedTuple):
    """Record how the attempt holding the key's lease ended (CompleteKey)."""

    request: rpb.CompleteKeyRequest


class Report(NamedTuple):
    """Queue an outcome for the reporter."""

    outcome: PendingOutcome


Effect = Union[Admit, Claim, Invoke, Complete, Sleep, Decide, Report]
Loop = Generator[Effect, Any, Result[Any]]


class CallCancelled(Exception):
    """Thrown into the loop by a driver whose call was cancelled."""


def run(core: Core, st: CallState[Any]) -> Loop:
    """Runs one call to its end; see the module doc for the protocol."""
    try:
        res = yield from _attempts(core, st)
    except CallCancelled:
        if not st.ended:
            st.error = Cancelled()
            yield Report(st.end(Disposition.DEAD_LETTER, StopReason.DEADLINE, st.attempts, cancelled_at=core.now()))
        res = st.result()
    if not res.ok and core.observed:
        core.emit(Event(EventKind.STOPPED, target=st.target, call_id=st.info.call_id, attempt=res.attempts,
                        reason=res.reason, disposition=res.disposition, stop_reason=res.stop_reason, local=res.local))
    return res


#: What sent an attempt to another target (_move): NextDelay by the chain,
#: Admit past an open circuit, or the client itself (its local copy or the
#: chain it saw).
BY_CHAIN, BY_CIRCUIT, BY_CLIENT = "chain", "circuit", "client"


def _move(core: Core, st: CallState[Any], to: str, attempt: int, why: str) -> None:
    """Sends attempt (and those after it) to target ``to`` instead of the
    current one, telling the hook and remembering what policyd did; nothing
    when it is the same."""
    if not to or to == st.target:
        return
    core.count("fallbacks")
    if core.observed:
        core.emit(Event(EventKind.FALLBACK_TAKEN, target=to, call_id=st.info.call_id, attempt=attempt,
                        from_target=st.target, to_target=to, local=why == BY_CLIENT))
    if why != BY_CLIENT:
        core.chains.learn(st.info.target, st.target, to, attempt, why == BY_CIRCUIT, core.now())
    st.target = to


def _open_fallback(core: Core, st: CallState[Any], fb: Fallback, now: float) -> str:
    """Returns the next target of the chain after the current one whose
    breaker the cache does not know OPEN, "" when none is (or the current
    target is not in the chain)."""
    chain = fb.chain(st.info.target)
    if st.target not in chain:
        return ""
    for t in chain[chain.index(st.target) + 1:]:
        b = core.cache.lookup(t)
        if b is None or admit_from_cache(b, now) != "open":
            return t
    return ""


def _attempts(core: Core, st: CallState[Any]) -> Loop:
    attempt = st.attempts  # 0, or those an earlier process made (a Celery retry)
    while True:
        attempt += 1
        permit = yield from _admit(core, st, attempt)
        if permit is None:
            return st.result()
        lease = ""
        if _uses_ledger(st):
            claimed = yield from _claim(core, st, attempt)
            if claimed is None:
                return st.result()
            lease = claimed
        st.attempts = attempt
        core.count("attempts")
        a = st.attempt(attempt, core.now())
        if core.observed:
            core.emit(Event(EventKind.ATTEMPT_STARTED, target=st.target, call_id=st.info.call_id,
                            attempt=attempt, delay=a.timeout))
        got: Invoked = yield Invoke(a)
        recorded = False  # the ledger knows how the attempt ended
        if lease:
            recorded = not isinstance((yield Complete(_completion(st, lease, got))), BaseException)
        if got.error is None:
            yield Report(st.succeed(attempt, permit, got.latency, got.value))
            core.local.budget.deposit(0.2)
            return st.result()
        st.error = got.error
        if got.cancelled:
            yield Report(st.end(Disposition.DEAD_LETTER, StopReason.DEADLINE, attempt, cancelled_at=core.now()))
            return st.result()
        f = classify_exception(got.error, timed_out=got.timed_out)
        if f.unclassified:
            # Nothing is known about this error: terminal, never retried blindly.
            st.reason = f.reason
            yield Report(st.end(Disposition.FAILED_TERMINAL, StopReason.TERMINAL, attempt))
            return st.result()
        if _uses_ledger(st) and _lost(f, got):
            # The upstream may have applied it: another attempt needs a
            # claim, and one the ledger cannot answer for is not made.
            st.must_claim = UNKNOWN
            if not recorded:
                st.reason = UNKNOWN
                yield Report(st.end(Disposition.DEAD_LETTER, StopReason.NOT_IDEMPOTENT, attempt, f.failure))
                return st.result()
        dec = yield from _decide(core, st, attempt, f, permit)
        st.reason = dec.reason
        unrecorded = None
        if dec.fallback:
            st.local = True
            unrecorded = f.failure  # policyd has not seen this failure: report it
        if not dec.retry:
            yield Report(st.end(Disposition.from_pb(dec.disposition), stop_reason(dec.stop_reason), attempt, unrecorded))
            return st.result()
        if unrecorded is not None:
            yield Report(st.failure(attempt, unrecorded, permit, got.latency))
        if dec.attempt_timeout > 0:
            st.timeout = dec.attempt_timeout
        st.prev = dec.delay
        if core.observed:
            core.emit(Event(EventKind.RETRY_SCHEDULED, target=st.target, call_id=st.info.call_id,
                            attempt=attempt, delay=dec.delay, reason=dec.reason, local=dec.fallback))
        _move(core, st, dec.target, attempt + 1, BY_CLIENT if dec.fallback else BY_CHAIN)
        if (yield Sleep(dec.delay)):
            raise CallCancelled


def _admit(core: Core, st: CallState[Any], attempt: int) -> Generator[Effect, Any, Optional[str]]:
    """Says whether attempt may go ahead: its probe permit ("" for none),
    or None when the call ended. It waits out a fleet-wide cool-down when
    the deadline allows. A call of a run past its cut-off (by the client's
    clock, the cut-off as Admit told it once per run) ends DEADLINE_CUT
    without the attempt; until the cut-off is known, Admit is asked even
    while the breaker is CLOSED.

    While policyd is silent (Admit unanswered within the decision timeout,
    or unreachable), an attempt to a target without a known ceiling goes
    ahead on the local policy; one to a target policyd said has a ceiling
    (``BreakerCache.ceiling_known``) does not: its Admit waits longer for
    an answer (:func:`_ceiling_admit_timeout`), then it waits
    (:func:`_silent_wait`) and asks Admit again, and ends a dead letter
    (DEADLINE, ``flow:unavailable``) when the deadline leaves no room for an
    attempt; the report reaches policyd once it answers."""
    run_known = True
    if st.info.run_id:
        if st.cutoff is None:
            st.cutoff = core.run_cutoff(st.info.run_id)
        run_known = st.cutoff is not None
        if st.cutoff is not None and core.now() >= st.cutoff:
            st.reason = RUN_CUTOFF
            yield Report(st.end(Disposition.DEADLINE_CUT, StopReason.DEADLINE, st.attempts))
            return None
    fb = core.fallback(st.info.target)
    unanswered = 0  # Admits in a row policyd left unanswered
    while True:
        now = core.now()
        b = core.cache.lookup(st.target)
        flow = core.cache.flow_controlled(st.target)
        if b is not None:
            verdict = admit_from_cache(b, now)
            if verdict == "wait":
                if not (yield from _cooldown(core, st, b.cooldown_until - now)):
                    return None
                continue
            if verdict == "go" and run_known and not flow:
                return ""
            if verdict == "open":
                if fb is not None and fb.on_circuit_open:
                    to = _open_fallback(core, st, fb, now)
                    if to:
                        _move(core, st, to, attempt, BY_CLIENT)
                        continue
                if fb is not None or not _escalates_on_open(core, st, attempt, now):
                    core.count("fast_fails")
                    st.reason = "breaker:open"
                    yield Report(st.end(Disposition.CIRCUIT_OPEN, StopReason.CIRCUIT_OPEN, st.attempts))
                    return None
                # The chain policyd told escalates on an open circuit, or
                # Admit recently sent a call of this primary on from one:
                # Admit may route this one.
        ceiling = core.cache.ceiling_known(st.target)
        if not ceiling and not core.reachable():
            # policyd is away: the local policy admits, unless its chain
            # moved the call to a target with a ceiling.
            local = yield from _admit_local(core, st, attempt)
            if local is None or not core.cache.ceiling_known(st.target):
                return local
            continue
        core.count("admit_rpcs")
        asked = st.target
        resp = yield Admit(rpb.AdmitRequest(call=st.ref, attempt=attempt, attempt_target=st.attempt_target),
                           _ceiling_admit_timeout(core, st) if ceiling else None)
        if isinstance(resp, BaseException):  # policyd away, slow, or the channel closed
            core.failed(resp)
            if ceiling and core.silence(resp):
                # A fleet-wide ceiling is kept by policyd alone: no attempt
                # without its lease or rate slot. Wait and ask again.
                if not (yield from _silent_wait(core, st, unanswered)):
                    return None
                unanswered += 1
                continue
            local = yield from _admit_local(core, st, attempt)
            if local is None or not core.cache.ceiling_known(st.target):
                return local
            continue  # the local chain moved the call to a target with a ceiling
        unanswered = 0
        if st.info.run_id and resp.HasField("run_cutoff_time"):
            st.cutoff = from_timestamp(resp.run_cutoff_time)
            core.learn_cutoff(st.info.run_id, st.cutoff)
            run_known = True
        if resp.admitted:
            _move(core, st, resp.target, attempt, BY_CIRCUIT)  # Admit routed it on from an open breaker
            core.cache.learn_flow(st.target, resp.flow_controlled)
            st.lease = str(resp.lease_id)
            return str(resp.permit_id)
        core.cache.learn_flow(asked, resp.flow_controlled)
        if resp.reason in (COOLDOWN, CEILING_FULL, RATE_LIMITED):
            # Waiting for a cool-down or a ceiling counts no attempt.
            if not (yield from _cooldown(core, st, from_duration(resp.retry_after), resp.reason)):
                return None
            continue
        st.reason = resp.reason
        if resp.reason == RUN_CUTOFF:
            yield Report(st.end(Disposition.DEADLINE_CUT, StopReason.DEADLINE, st.attempts))
            return None
        yield Report(st.end(Disposition.CIRCUIT_OPEN, StopReason.CIRCUIT_OPEN, st.attempts))
        return None


def _escalates_on_open(core: Core, st: CallState[Any], attempt: int, now: float) -> bool:
    """Says whether attempt, whose target's breaker the cache knows OPEN,
    should ask Admit, which may send it to a fallback: the chain policyd
    told for the primary escalates on an open circuit to a target not known
    OPEN, or Admit sent a call of the primary on from an open circuit within
    ESCALATION_MEMORY."""
    told = core.chains.told(st.info.target)
    if told is not None and told.on_circuit_open and told.route(st.info.target, attempt, core.cache.open_at(now)):
        return True
    return core.chains.escalates_on_open(st.info.target, now)


def _admit_local(core: Core, st: CallState[Any], attempt: int) -> Generator[Effect, Any, Optional[str]]:
    """Admits attempt while policyd is away, on the target the chain known
    gives it (_local_target) on the breakers last seen: the call moves
    there ("": no permit), or, when that target is open and no fallback
    takes the call, it ends CIRCUIT_OPEN (None)."""
    to = _local_target(core, st, attempt)
    if to is None:
        st.reason = "breaker:open"
        yield Report(st.end(Disposition.CIRCUIT_OPEN, StopReason.CIRCUIT_OPEN, st.attempts))
        return None
    _move(core, st, to, attempt, BY_CLIENT)
    return ""


def _cooldown(core: Core, st: CallState[Any], d: float, reason: str = COOLDOWN) -> Generator[Effect, Any, bool]:
    """Waits out a fleet-wide cool-down or a full ceiling (reason) of d
    seconds (spread; a rate ceiling's exact wait is not) before an attempt,
    unless the attempt could then not finish by the deadline; says whether
    to go on."""
    if reason != RATE_LIMITED:
        d = core.spread(d)
    deadline, cut = _binding_deadline(st)
    if deadline is not None and core.now() + d + st.timeout > deadline:
        st.reason = reason
        yield Report(st.end(Disposition.DEADLINE_CUT if cut else Disposition.DEAD_LETTER, StopReason.DEADLINE, st.attempts))
        return False
    if (yield Sleep(d)):
        raise CallCancelled
    return True


def _ceiling_admit_timeout(core: Core, st: CallState[Any]) -> float:
    """Bounds an Admit about a target with a fleet-wide ceiling. No attempt
    goes ahead without its answer, so giving up at the decision timeout
    would gain nothing and leave the lease policyd granted meanwhile held by
    no one until it expires: it waits up to retry_unreachable_after (at
    least the decision timeout), and not past the last instant an attempt
    could still start and finish by the deadline."""
    s = core.settings
    d = max(s.decision_timeout, s.retry_unreachable_after)
    deadline, _ = _binding_deadline(st)
    if deadline is not None:
        d = min(d, max(deadline - core.now() - st.timeout, s.decision_timeout))
    return d


def _silent_wait(core: Core, st: CallState[Any], n: int) -> Generator[Effect, Any, bool]:
    """Waits before asking Admit again for an attempt to a target with a
    fleet-wide ceiling, after n Admits in a row policyd left unanswered:
    equal jitter over min(retry_unreachable_after, 0.1 s * 2^n), and never
    past the last instant an attempt could still start and finish by the
    deadline (the call's, or the run's cut-off), so the last ask is made
    then. Once that instant has passed the call ends a dead letter
    (DEADLINE; a run's call past its cut-off DEADLINE_CUT), reason
    ``flow:unavailable``, and the answer is False."""
    nominal = min(core.settings.retry_unreachable_after, 0.1 * 2.0 ** min(n, 16))
    d = nominal / 2 + core.rand() * nominal / 2
    deadline, cut = _binding_deadline(st)
    if deadline is not None:
        room = deadline - core.now() - st.timeout
        if room <= 0:
            st.reason = FLOW_UNAVAILABLE
            yield Report(st.end(Disposition.DEADLINE_CUT if cut else Disposition.DEAD_LETTER, StopReason.DEADLINE, st.attempts))
            return False
        d = min(d, room)
    if (yield Sleep(d)):
        st.reason = FLOW_UNAVAILABLE
        raise CallCancelled
    return True


def _decide(core: Core, st: CallState[Any], attempt: int, f: ClassifiedFailure, permit: str) -> Generator[Effect, Any, Decision]:
    """Asks policyd what to do after a failed attempt, or decides locally
    when policyd does not answer within the decision timeout."""
    if core.reachable():
        req = rpb.NextDelayRequest(call=st.ref, attempt=attempt, failure=f.failure, permit_id=permit, lease_id=st.lease,
                                   attempt_target=st.attempt_target)
        if f.pushback is not None:
            req.pushback.CopyFrom(f.pushback)
        req.previous_delay.FromNanoseconds(int(st.prev * 1e9))
        resp = yield Decide(req)
        if not isinstance(resp, BaseException):
            st.lease = ""  # NextDelay returned it
            core.cache.learn_flow(st.target, resp.flow_controlled)
            return decision_from_pb(resp)
        core.failed(resp)
    core.count("local_decisions")
    deadline, cut = _binding_deadline(st)
    dec = core.local.decide(core.now(), deadline, attempt, f, st.info.idempotent, st.info.key != "")
    if cut and dec.stop_reason == types_pb2.STOP_REASON_DEADLINE:
        dec = dataclasses.replace(dec, disposition=types_pb2.DISPOSITION_DEADLINE_CUT)  # the run's cut-off bound
    if dec.retry:
        to = _local_target(core, st, attempt + 1)
        if to is None:
            # The chain's next target is open and none after it takes the
            # call, as policyd would answer; CIRCUIT_OPEN spends no budget.
            core.local.budget.deposit(2.0 if f.is_timeout else 1.0)
            dec = dataclasses.replace(dec, retry=False, delay=0.0, stop_reason=types_pb2.STOP_REASON_CIRCUIT_OPEN,
                                      disposition=types_pb2.DISPOSITION_CIRCUIT_OPEN)
        else:
            dec = dataclasses.replace(dec, target=to)
    if core.observed:
        core.emit(Event(EventKind.LOCAL_DECISION, target=st.target, call_id=st.info.call_id, attempt=attempt,
                        delay=dec.delay, reason=dec.reason, local=True))
    return dec


def _local_target(core: Core, st: CallState[Any], attempt: int) -> Optional[str]:
    """Returns where a locally decided or admitted attempt goes: by
    policyd's rules (:meth:`Fallback.route`) over the chain known (the local
    copy of the primary's fallback settings, else the chain policyd told)
    on the breakers the cache last saw, None when that target is open and no
    fallback takes the call; else over the chain seen in policyd's answers
    once its after_attempts was seen; else where the call is."""
    fb = core.chain(st.info.target)
    if fb is not None:
        if not fb.targets:
            return st.target
        return fb.route(st.info.target, attempt, core.cache.open_at(core.now()))
    seen = core.chains.seen(st.info.target)
    if seen is not None and seen.after_attempts > 0:
        return seen.target_of(st.info.target, attempt)
    return st.target


def _binding_deadline(st: CallState[Any]) -> "tuple[Optional[float], bool]":
    """The deadline a local decision holds to: the call's, or its run's
    cut-off when that comes first (then True)."""
    if st.cutoff is not None and (st.deadline is None or st.cutoff < st.deadline):
        return st.cutoff, True
    return st.deadline, False


def _uses_ledger(st: CallState[Any]) -> bool:
    """Says whether the call claims its key: a non-idempotent call with a
    key, or any call with one and ``Call.claim_key``."""
    return bool(st.info.key) and (not st.info.idempotent or st.info.claim_key)


#: The reasons a call that uses the ledger is dead-lettered (NOT_IDEMPOTENT)
#: when policyd cannot be asked for a claim: an earlier attempt's outcome
#: was lost, another worker held the key, or the client requires a claim.
UNKNOWN, IN_FLIGHT, UNAVAILABLE = "idempotency:unknown", "idempotency:in_flight", "idempotency:unavailable"


def _claim(core: Core, st: CallState[Any], attempt: int) -> Generator[Effect, Any, Optional[str]]:
    """Claims the call's idempotency key before attempt: returns the lease
    held ("" for none: policyd is away, see :func:`_unclaimed`), or None
    when the call ended (the ledger answered it with an earlier success,
    the previous attempt's outcome was lost and the upstream does not
    deduplicate, or no claim could be made and none may be done without).

    While policyd is away the call goes on without the ledger, except after
    an attempt whose outcome was lost (a timeout, a 504, a reset), or once
    a claim said another worker holds the key: the upstream may have
    applied the write, and only a claim can say whether another is safe,
    so without one the call is dead-lettered (NOT_IDEMPOTENT,
    ``idempotency:unknown`` or ``idempotency:in_flight``). With
    ``require_claim`` no attempt goes without a claim
    (``idempotency:unavailable``). The Go client does the same."""
    while True:
        if not core.reachable():
            return (yield from _unclaimed(core, st))
        resp = yield Claim(rpb.ClaimKeyRequest(call=st.ref, attempt=attempt))
        if isinstance(resp, BaseException):
            core.failed(resp)
            return (yield from _unclaimed(core, st))
        if resp.state == types_pb2.KEY_STATE_SUCCEEDED:
            core.count("deduplicated")
            st.deduplicated, st.reason = True, resp.reason
            yield Report(st.succeed(attempt, "", 0.0, resp.result_ref)._replace(deduplicated=True))
            return None
        if resp.state == types_pb2.KEY_STATE_IN_FLIGHT:
            # Another worker's attempt holds the key: wait for its end.
            st.must_claim = st.must_claim or IN_FLIGHT
            if not (yield from _cooldown(core, st, from_duration(resp.retry_after))):
                st.reason = resp.reason
                return None
            continue
        if resp.state == types_pb2.KEY_STATE_UNKNOWN and not resp.lease_id:
            st.reason = resp.reason
            yield Report(st.end(Disposition.DEAD_LETTER, StopReason.NOT_IDEMPOTENT, st.attempts))
            return None
        return str(resp.lease_id)


def _unclaimed(core: Core, st: CallState[Any]) -> Generator[Effect, Any, Optional[str]]:
    """Decides an attempt policyd could not be asked to claim: it goes on
    without the ledger (""), unless an earlier attempt's outcome was lost
    or another worker held the key (``st.must_claim``), or the client
    requires a claim, when the call ends a dead letter (None)."""
    reason = st.must_claim or (UNAVAILABLE if core.settings.require_claim else "")
    if not reason:
        return ""
    st.reason = reason
    yield Report(st.end(Disposition.DEAD_LETTER, StopReason.NOT_IDEMPOTENT, st.attempts))
    return None


def _completion(st: CallState[Any], lease: str, got: Invoked) -> rpb.CompleteKeyRequest:
    """The CompleteKey of an attempt: success (a string value is its result
    reference), a failure whose outcome is lost (a timeout, a 504, a reset)
    or one that was not applied."""
    req = rpb.CompleteKeyRequest(tenant=st.info.tenant, idempotency_key=st.info.key, lease_id=lease)
    if got.error is None:
        req.outcome = types_pb2.KEY_OUTCOME_SUCCEEDED
        if isinstance(got.value, str) and len(got.value.encode()) <= 1024:
            req.result_ref = got.value
        return req
    req.outcome = types_pb2.KEY_OUTCOME_FAILED
    if _lost(classify_exception(got.error, timed_out=got.timed_out), got):
        req.outcome = types_pb2.KEY_OUTCOME_UNKNOWN
    return req


def _lost(f: ClassifiedFailure, got: Invoked) -> bool:
    """Says whether a failed attempt leaves unknown whether the upstream
    applied it: an error nothing is known of, an overrun attempt timeout,
    or a lost outcome (:func:`_outcome_lost`)."""
    return f.unclassified or got.timed_out or f.failure is None or _outcome_lost(f.failure)


def _outcome_lost(f: types_pb2.Failure) -> bool:
    """Says whether a failure leaves unknown whether the upstream applied
    the attempt: a timeout, a reset, a 504, gRPC DEADLINE_EXCEEDED or
    UNKNOWN."""
    kind = f.WhichOneof("kind")
    return ((kind == "http_status" and f.http_status == 504)
            or (kind == "grpc_code" and f.grpc_code in (2, 4))
            or (kind == "transport_error" and f.transport_error in (
                types_pb2.TRANSPORT_ERROR_TIMEOUT, types_pb2.TRANSPORT_ERROR_CONNECTION_RESET)))
