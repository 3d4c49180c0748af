"""Escalation in the sans-I/O loop (policyd_client._loop), driven by hand
with the response messages policyd sends: the loop follows the target
NextDelay and Admit name, sends it back as attempt_target, tells it to the
function, asks the breaker cache about it, and, while policyd cannot
answer, places attempts by the chain rule of a local copy of the policy."""

from __future__ import annotations

import itertools
from typing import Any, Callable, Optional

import grpc
import pytest

from retrypolicy.v1 import retry_policy_service_pb2 as rpb
from retrypolicy.v1 import types_pb2

import policyd_client as pc
from policyd_client import _loop
from policyd_client._core import Core, Settings, WatchSession

from conftest import FakeClock, FakeRpcError

S503 = pc.HTTPStatusError(503)
DOWN = FakeRpcError(grpc.StatusCode.UNAVAILABLE)


def core(clock: FakeClock, events: Optional[list[pc.Event]] = None, **kw: Any) -> Core:
    return Core(Settings("acme", watch=False, **kw).checked(), clock.now, lambda: 0.5, None,
                events.append if events is not None else None)


def retry(target: str, delay_ms: int = 200) -> rpb.NextDelayResponse:
    resp = rpb.NextDelayResponse(decision=types_pb2.DECISION_RETRY, classification="transient:503", target=target)
    resp.delay.FromMilliseconds(delay_ms)
    return resp


def breaker(target: str, state: int, forced: bool = False) -> rpb.WatchBreakersResponse:
    return rpb.WatchBreakersResponse(breaker=types_pb2.Breaker(
        key=types_pb2.BreakerKey(tenant="acme", target=target), state=state, forced=forced))  # type: ignore[arg-type]


def follow(c: Core, *msgs: rpb.WatchBreakersResponse) -> None:
    """Feeds the cache a WatchBreakers snapshot of msgs, no target flow
    controlled, as the stream would."""
    s = WatchSession(c.cache)
    for m in msgs:
        s.feed(m)
    s.feed(rpb.WatchBreakersResponse(snapshot_complete=True))


class Upstream:
    """Answers the loop's effects: Invoke by fail(attempt) (an exception or
    None for success), Admit and Decide by the given functions; records
    every effect."""

    def __init__(self, fail: Callable[[pc.Attempt], Optional[Exception]],
                 admit: Callable[[rpb.AdmitRequest], Any] = lambda r: rpb.AdmitResponse(admitted=True, target=r.attempt_target),
                 decide: Callable[[rpb.NextDelayRequest], Any] = lambda r: DOWN) -> None:
        self.fail, self.admit, self.decide = fail, admit, decide
        self.effects: list[Any] = []

    def __call__(self, e: Any) -> Any:
        self.effects.append(e)
        if isinstance(e, _loop.Admit):
            return self.admit(e.request)
        if isinstance(e, _loop.Decide):
            return self.decide(e.request)
        if isinstance(e, _loop.Invoke):
            err = self.fail(e.attempt)
            return _loop.Invoked(error=err) if err is not None else _loop.Invoked(value=f"ok on {e.attempt.target}")
        return False if isinstance(e, _loop.Sleep) else None

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.effects if isinstance(e, kind)]


def drive(loop: _loop.Loop, answer: Callable[[Any], Any]) -> pc.Result[Any]:
    reply: Any = None
    for _ in range(200):  # a loop that never ends fails here, not by hanging
        try:
            effect = loop.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        reply = answer(effect)
    raise AssertionError("the loop did not end within 200 effects")


def test_the_loop_follows_next_delays_target_and_sends_it_back(clock: FakeClock) -> None:
    events: list[pc.Event] = []
    c = core(clock, events)
    up = Upstream(fail=lambda a: S503 if a.target == "geo" else None,
                  decide=lambda r: retry("geo-b"))
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert (res.ok, res.value, res.attempts, res.target) == (True, "ok on geo-b", 2, "geo-b"), res
    assert [(a.attempt.number, a.attempt.target) for a in up.of(_loop.Invoke)] == [(1, "geo"), (2, "geo-b")]
    # attempt_target: empty for the primary, the fallback's name after.
    assert [(r.request.attempt, r.request.attempt_target) for r in up.of(_loop.Admit)] == [(1, ""), (2, "geo-b")]
    assert [r.request.attempt_target for r in up.of(_loop.Decide)] == [""]
    assert all(r.request.call.target == "geo" for r in up.of(_loop.Admit) + up.of(_loop.Decide))
    final = up.of(_loop.Report)[-1].outcome.pb()
    assert (final.success, final.attempt, final.attempt_target, final.call.target) == (True, 2, "geo-b", "geo")
    moved = [(e.attempt, e.from_target, e.to_target, e.target) for e in events if e.kind is pc.EventKind.FALLBACK_TAKEN]
    assert moved == [(2, "geo", "geo-b", "geo-b")], moved
    # The other events name the attempt's target, as the Go client's do.
    assert [(e.kind.value, e.attempt, e.target) for e in events if e.kind is not pc.EventKind.FALLBACK_TAKEN] == [
        ("attempt_started", 1, "geo"), ("retry_scheduled", 1, "geo"), ("attempt_started", 2, "geo-b")]

    assert c.stats().fallbacks == 1


def test_a_failure_on_the_fallback_is_reported_on_the_fallback(clock: FakeClock) -> None:
    c = core(clock)
    answers = iter([retry("geo-b"), rpb.NextDelayResponse(
        decision=types_pb2.DECISION_STOP, stop_reason=types_pb2.STOP_REASON_ATTEMPTS_EXHAUSTED,
        disposition=types_pb2.DISPOSITION_DEAD_LETTER, classification="transient:503")])
    up = Upstream(fail=lambda a: S503, decide=lambda r: next(answers))
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert (res.disposition, res.attempts, res.target) == (pc.Disposition.DEAD_LETTER, 2, "geo-b")
    assert [r.request.attempt_target for r in up.of(_loop.Decide)] == ["", "geo-b"]
    final = up.of(_loop.Report)[-1].outcome.pb()
    assert (final.attempt, final.attempt_target, final.already_recorded) == (2, "geo-b", True)


def test_admit_routes_the_first_attempt_to_a_fallback(clock: FakeClock) -> None:
    events: list[pc.Event] = []
    c = core(clock, events)
    # The primary's breaker is open and its policy escalates on an open
    # circuit: Admit answers with the fallback it admitted, and its permit.
    up = Upstream(fail=lambda a: None, admit=lambda r: rpb.AdmitResponse(admitted=True, target="geo-b", permit_id="p9"))
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert (res.ok, res.value, res.attempts, res.target) == (True, "ok on geo-b", 1, "geo-b")
    assert [r.request.attempt_target for r in up.of(_loop.Admit)] == [""]
    ok = up.of(_loop.Report)[-1].outcome.pb()
    assert (ok.permit_id, ok.attempt_target) == ("p9", "geo-b")
    assert [(e.attempt, e.from_target, e.to_target) for e in events if e.kind is pc.EventKind.FALLBACK_TAKEN] == [
        (1, "geo", "geo-b")]


def test_the_breaker_cache_is_asked_about_the_attempts_target(clock: FakeClock) -> None:
    c = core(clock, fallbacks={"geo": pc.Fallback(["geo-b"], after_attempts=1)})
    # geo is CLOSED in the cache (no RPC), geo-b is forced OPEN.
    follow(c, breaker("geo-b", types_pb2.BREAKER_STATE_OPEN, forced=True))
    up = Upstream(fail=lambda a: S503, decide=lambda r: retry("geo-b"))
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    # Attempt 1 went on the primary's CLOSED breaker without Admit; attempt 2,
    # on geo-b, was refused by geo-b's breaker, from the cache.
    assert up.of(_loop.Admit) == []
    assert (res.disposition, res.reason, res.attempts, res.target) == (
        pc.Disposition.CIRCUIT_OPEN, "breaker:open", 1, "geo-b")
    assert c.stats().fast_fails == 1


def test_an_open_fallback_asks_admit_once_admit_routed_past_an_open_circuit(clock: FakeClock) -> None:
    c = core(clock)  # no local copy: policyd's answers are all the client knows
    # Admit (the cache not yet live) sent a call of geo on to geo-b.
    up = Upstream(fail=lambda a: None, admit=lambda r: rpb.AdmitResponse(admitted=True, target="geo-b"))
    drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert c.chains.escalates_on_open("geo", clock.now())
    # Now the cache knows geo-b OPEN and NextDelay sends attempt 2 there:
    # Admit is asked about geo-b (it might route on), and refuses.
    follow(c, breaker("geo-b", types_pb2.BREAKER_STATE_OPEN, forced=True))
    up = Upstream(fail=lambda a: S503, decide=lambda r: retry("geo-b"),
                  admit=lambda r: rpb.AdmitResponse(admitted=False, reason="breaker:open"))
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert [(r.request.attempt, r.request.attempt_target) for r in up.of(_loop.Admit)] == [(2, "geo-b")]
    assert (res.disposition, res.reason, res.attempts, res.target) == (
        pc.Disposition.CIRCUIT_OPEN, "breaker:open", 1, "geo-b")
    final = up.of(_loop.Report)[-1].outcome.pb()
    assert (final.final_disposition, final.attempt_target) == (types_pb2.DISPOSITION_CIRCUIT_OPEN, "geo-b")
    # The memory fades: past it, an open breaker in the cache fails at once.
    clock.advance(601)
    up = Upstream(fail=lambda a: S503, decide=lambda r: retry("geo-b"))
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert (res.disposition, res.attempts, up.of(_loop.Admit)) == (pc.Disposition.CIRCUIT_OPEN, 1, [])



def test_an_open_primary_in_the_cache_routes_by_the_local_copy(clock: FakeClock) -> None:
    events: list[pc.Event] = []
    c = core(clock, events, fallbacks={"geo": pc.Fallback(["geo-b", "geo-c"], on_circuit_open=True)})
    follow(c, breaker("geo", types_pb2.BREAKER_STATE_OPEN, forced=True),
           breaker("geo-b", types_pb2.BREAKER_STATE_OPEN, forced=True))
    up = Upstream(fail=lambda a: None)
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    # geo and geo-b are known OPEN: the first attempt goes to geo-c (CLOSED),
    # with no RPC at all.
    assert (res.ok, res.value, res.target) == (True, "ok on geo-c", "geo-c")
    assert up.of(_loop.Admit) == [] and c.stats().fast_fails == 0
    assert [(e.from_target, e.to_target, e.local) for e in events if e.kind is pc.EventKind.FALLBACK_TAKEN] == [
        ("geo", "geo-c", True)]



def test_an_open_primary_without_a_local_copy(clock: FakeClock) -> None:
    c = core(clock)
    follow(c, breaker("geo", types_pb2.BREAKER_STATE_OPEN, forced=True))
    up = Upstream(fail=lambda a: None, admit=lambda r: rpb.AdmitResponse(admitted=True, target="geo-b"))
    # Nothing says the primary escalates on an open circuit: refused from
    # the cache, no RPC (as before escalation existed), also after NextDelay
    # escalated a call by the chain.
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert (res.disposition, res.attempts, up.of(_loop.Admit)) == (pc.Disposition.CIRCUIT_OPEN, 0, [])
    c.chains.learn("geo", "geo", "geo-b", 2, False, clock.now())
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert (res.disposition, up.of(_loop.Admit)) == (pc.Disposition.CIRCUIT_OPEN, [])


def test_the_chain_seen_is_followed_while_policyd_is_away(clock: FakeClock) -> None:
    c = core(clock)  # no local copy
    # policyd sends attempt 2 to geo-b, attempt 3 to geo-c: a chain of
    # after_attempts 1, seen.
    answers = iter([retry("geo-b"), retry("geo-c")])
    up = Upstream(fail=lambda a: S503 if a.number < 3 else None, decide=lambda r: next(answers))
    drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert c.chains.seen("geo") == pc.Fallback(("geo-b", "geo-c"), after_attempts=1)
    assert c.chains.seen("geo-b") is None
    # policyd goes away: the next call escalates by the chain seen.
    up = Upstream(fail=lambda a: S503, admit=lambda r: DOWN)
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert res.local and [a.attempt.target for a in up.of(_loop.Invoke)] == ["geo", "geo-b", "geo-c"]



@pytest.mark.parametrize("after, want", [
    (1, ["geo", "geo-b", "geo-c"]),
    (2, ["geo", "geo", "geo-b"]),
    (0, ["geo", "geo", "geo"]),
])
def test_local_decisions_follow_the_chain_rule(clock: FakeClock, after: int, want: list[str]) -> None:
    events: list[pc.Event] = []
    c = core(clock, events, fallbacks={"geo": pc.Fallback(["geo-b", "geo-c"], after_attempts=after)})
    up = Upstream(fail=lambda a: S503, admit=lambda r: DOWN)  # policyd away from the start
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert res.local and res.attempts == 3 and res.disposition is pc.Disposition.DEAD_LETTER
    assert [a.attempt.target for a in up.of(_loop.Invoke)] == want
    # Each failure decided locally is reported on the target it failed on.
    assert [r.outcome.pb().attempt_target for r in up.of(_loop.Report)] == ["" if t == "geo" else t for t in want]
    assert all(e.local for e in events if e.kind is pc.EventKind.FALLBACK_TAKEN)


def test_without_a_local_copy_a_local_decision_keeps_the_target(clock: FakeClock) -> None:
    c = core(clock)
    answers = iter([retry("geo-b"), DOWN])
    up = Upstream(fail=lambda a: S503 if a.number < 3 else None, decide=lambda r: next(answers))
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    # policyd sent attempt 2 to geo-b, then went away: attempt 3 stays there.
    assert res.ok and res.local and [a.attempt.target for a in up.of(_loop.Invoke)] == ["geo", "geo-b", "geo-b"]


def test_the_chain_rule() -> None:
    # attempt n goes to chain[min((n-1)//K, len-1)], chain = [primary] +
    # targets without the primary; K = 0 keeps the primary.
    for targets, k, n in itertools.product([["b"], ["b", "c"], ["b", "a", "c"], ["b", "c", "d", "e"]], range(4), range(1, 12)):
        fb = pc.Fallback(targets, after_attempts=k)
        chain = ["a"] + [t for t in targets if t != "a"]
        want = "a" if k == 0 else chain[min((n - 1) // k, len(chain) - 1)]
        assert fb.target_of("a", n) == want, (targets, k, n)


@pytest.mark.parametrize("fallbacks, message", [
    ({"geo": pc.Fallback([])}, r"fallbacks\['geo'\].targets must name 1 to 4 targets"),
    ({"geo": pc.Fallback(["a", "b", "c", "d", "e"])}, r"fallbacks\['geo'\].targets must name 1 to 4 targets, got 5"),
    ({"geo": pc.Fallback(["geo-b", "geo"])}, r"fallbacks\['geo'\].targets\[1\] must not be the primary"),
    ({"geo": pc.Fallback(["geo-b", "geo-b"])}, r"fallbacks\['geo'\].targets\[1\] repeats 'geo-b'"),
    ({"geo": pc.Fallback(["geo-b", ""])}, r"fallbacks\['geo'\].targets\[1\] must be a non-empty target name"),
    ({"geo": pc.Fallback("geo-b")}, r"fallbacks\['geo'\].targets must be a sequence of target names, not a string"),
    ({"geo": pc.Fallback(["geo-b"], after_attempts=-1)}, r"fallbacks\['geo'\].after_attempts must be an integer >= 0"),
    ({"": pc.Fallback(["geo-b"])}, r"fallbacks must be keyed by non-empty target names"),
])
def test_bad_fallbacks_are_refused_naming_the_field(fallbacks: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings("acme", fallbacks=fallbacks).checked()


def test_a_fallback_that_is_not_a_fallback_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"fallbacks\['geo'\] must be a Fallback, got list"):
        pc.Client("127.0.0.1:9", tenant="acme", fallbacks={"geo": ["geo-b"]})  # type: ignore[dict-item]


def test_a_callers_later_change_does_not_reach_the_client() -> None:
    targets = ["geo-b"]
    given = {"geo": pc.Fallback(targets, after_attempts=1)}
    s = Settings("acme", fallbacks=given).checked()
    targets.append("geo-c")
    given["other"] = pc.Fallback(["x"])
    assert dict(s.fallbacks) == {"geo": pc.Fallback(("geo-b",), after_attempts=1)}
