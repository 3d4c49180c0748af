"""Fleet-wide ceilings in the sans-I/O loop, driven by hand: a target with
a ceiling asks Admit for a lease even while CLOSED, returns the lease with
NextDelay and with the outcome, and waits out a full ceiling or a rate
ceiling without counting an attempt."""

from __future__ import annotations

from typing import Any

from retrypolicy.v1 import retry_policy_service_pb2 as rpb
from retrypolicy.v1 import types_pb2

import policyd_client as pc
from policyd_client import _loop
from policyd_client._core import Core, Settings

from conftest import FakeClock

S503 = pc.HTTPStatusError(503)


def core(clock: FakeClock) -> Core:
    return Core(Settings("acme", watch=False).checked(), clock.now, lambda: 0.5, None)


def drive(loop: _loop.Loop, answer: Any) -> tuple[list[str], pc.Result[Any]]:
    seen: list[str] = []
    reply: Any = None
    while True:
        try:
            effect = loop.send(reply)
        except StopIteration as done:
            return seen, done.value
        seen.append(type(effect).__name__)
        reply = answer(effect)


def test_leases_are_taken_and_returned(clock: FakeClock) -> None:
    c = core(clock)
    st = c.begin(pc.Call(target="portal", idempotent=True), lambda a: None)
    sleeps: list[float] = []
    admits = iter([
        rpb.AdmitResponse(admitted=False, reason="concurrency:full", flow_controlled=True),
        rpb.AdmitResponse(admitted=True, lease_id="L1", flow_controlled=True),
        rpb.AdmitResponse(admitted=False, reason="rate:limited", flow_controlled=True),
        rpb.AdmitResponse(admitted=True, lease_id="L2", flow_controlled=True),
    ])
    reported: list[rpb.Outcome] = []

    def answer(e: Any) -> Any:
        if isinstance(e, _loop.Admit):
            resp = next(admits)
            if not resp.admitted:
                resp.retry_after.FromMilliseconds(500 if resp.reason == "concurrency:full" else 125)
            return resp
        if isinstance(e, _loop.Invoke):
            return _loop.Invoked(error=S503) if e.attempt.number == 1 else _loop.Invoked(value="ok")
        if isinstance(e, _loop.Decide):
            assert e.request.lease_id == "L1"
            resp = rpb.NextDelayResponse(decision=types_pb2.DECISION_RETRY, flow_controlled=True)
            resp.delay.FromMilliseconds(1000)
            return resp
        if isinstance(e, _loop.Sleep):
            sleeps.append(e.seconds)
            return False
        if isinstance(e, _loop.Report):
            reported.append(e.outcome.pb())
        return None

    seen, res = drive(_loop.run(c, st), answer)
    assert seen == ["Admit", "Sleep", "Admit", "Invoke", "Decide", "Sleep", "Admit", "Sleep", "Admit", "Invoke", "Report"]
    assert (res.ok, res.attempts) == (True, 2)
    # The full ceiling's wait is spread like a cool-down; the rate's is exact.
    assert 0.5 <= sleeps[0] <= 0.75 and sleeps[1:] == [1.0, 0.125]
    assert [o.lease_id for o in reported] == ["L2"]
    assert c.cache.flow_controlled("portal")


def test_a_target_without_a_ceiling_is_learnt(clock: FakeClock) -> None:
    c = core(clock)
    assert c.cache.flow_controlled("geo"), "before anything is known, Admit must tell"
    st = c.begin(pc.Call(target="geo", idempotent=True), lambda a: None)

    def answer(e: Any) -> Any:
        if isinstance(e, _loop.Admit):
            return rpb.AdmitResponse(admitted=True)
        if isinstance(e, _loop.Invoke):
            return _loop.Invoked(value="ok")
        return None

    drive(_loop.run(c, st), answer)
    assert not c.cache.flow_controlled("geo")
    snap = rpb.WatchBreakersResponse(snapshot_complete=True, flow_controlled_targets=["portal"],
                                     uncontrolled_targets=["geo"], other_targets_flow_controlled=False)
    c.cache.flow_snapshot(snap)
    assert (c.cache.flow_controlled("portal"), c.cache.flow_controlled("geo"), c.cache.flow_controlled("x")) == (True, False, False)


def test_a_silent_policyd_holds_a_known_ceiling(clock: FakeClock) -> None:
    """Admit unanswered for a target policyd said has a ceiling: the loop
    waits (equal jitter over 0.1 s * 2^n, capped) and asks again, never past
    the last instant an attempt still fits, and ends the call a dead letter
    (DEADLINE, flow:unavailable) without an attempt. An unknown target
    keeps the local fallback; ReportOutcome's answer teaches the ceiling."""
    from conftest import FakeRpcError
    import grpc

    c = core(clock)
    silent = FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED)
    # Unknown target: admitted locally after the unanswered Admit.
    st = c.begin(pc.Call(target="geo", idempotent=True), lambda a: None)
    seen, res = drive(_loop.run(c, st), lambda e: silent if isinstance(e, _loop.Admit) else
                      (_loop.Invoked(value="ok") if isinstance(e, _loop.Invoke) else None))
    assert seen == ["Admit", "Invoke", "Report"] and res.ok
    # The ceiling is learnt from a report's answer.
    c.cache.flow_reported([st.succeed(1, "", 0.0, "ok")._replace(target="portal")],
                          rpb.ReportOutcomeResponse(flow_controlled_targets=["portal"]))
    assert c.cache.ceiling_known("portal") and not c.cache.ceiling_known("geo")
    st = c.begin(pc.Call(target="portal", idempotent=True, deadline=clock.now() + 10.0 + 1.0), lambda a: None)
    sleeps: list[float] = []
    reported: list[rpb.Outcome] = []

    timeouts: list[Any] = []

    def answer(e: Any) -> Any:
        if isinstance(e, _loop.Admit):
            timeouts.append(e.timeout)
            return silent
        if isinstance(e, _loop.Sleep):
            sleeps.append(e.seconds)
            clock.advance(e.seconds)
            return False
        if isinstance(e, _loop.Report):
            reported.append(e.outcome.pb())
        assert not isinstance(e, _loop.Invoke), "an attempt without a lease"
        return None

    seen, res = drive(_loop.run(c, st), answer)
    assert (res.disposition, res.stop_reason, res.reason, res.attempts) == (
        pc.Disposition.DEAD_LETTER, pc.StopReason.DEADLINE, "flow:unavailable", 0)
    # rand() is 0.5: 3/4 of min(1 s, 0.1 s * 2^n), the last cut to the room left.
    assert [round(s, 6) for s in sleeps] == [0.075, 0.15, 0.3, 0.475], sleeps
    assert seen.count("Admit") == 5
    # Its Admits wait up to retry_unreachable_after (1 s) for an answer, not
    # past the room left, and the decision timeout at least.
    assert [round(t, 6) for t in timeouts] == [1.0, 0.925, 0.775, 0.475, 0.25], timeouts
    assert [o.final_disposition for o in reported] == [types_pb2.DISPOSITION_DEAD_LETTER]
