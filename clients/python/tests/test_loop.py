"""The sans-I/O retry loop both clients drive (policyd_client._loop), driven
here by hand: the effects it yields for a given script of answers, with no
channel, thread or event loop, so the protocol itself is pinned down."""

from __future__ import annotations

from typing import Any

import grpc

from retrypolicy.v1 import retry_policy_service_pb2 as rpb
from retrypolicy.v1 import types_pb2

import policyd_client as pc
from policyd_client import _loop
from policyd_client._core import Core, Settings

from conftest import FakeClock, FakeRpcError

S503 = pc.HTTPStatusError(503)


def core(clock: FakeClock) -> Core:
    return Core(Settings("acme", watch=False).checked(), clock.now, lambda: 0.5, None)


def drive(loop: _loop.Loop, answer: Any) -> tuple[list[str], pc.Result[Any]]:
    """Runs loop to its end, answering each effect with answer(effect);
    returns the effects' names and the result."""
    seen: list[str] = []
    reply: Any = None
    while True:
        try:
            effect = loop.send(reply)
        except StopIteration as done:
            return seen, done.value
        seen.append(type(effect).__name__)
        reply = answer(effect)


def test_policyd_decides_and_the_loop_sleeps_what_it_said(clock: FakeClock) -> None:
    c = core(clock)
    st = c.begin(pc.Call(target="geo", idempotent=True), lambda a: None)
    sleeps: list[float] = []

    def answer(e: Any) -> Any:
        if isinstance(e, _loop.Admit):
            return rpb.AdmitResponse(admitted=True, permit_id="p1")
        if isinstance(e, _loop.Invoke):
            return _loop.Invoked(error=S503) if e.attempt.number == 1 else _loop.Invoked(value="ok")
        if isinstance(e, _loop.Decide):
            assert e.request.permit_id == "p1" and e.request.failure.http_status == 503
            resp = rpb.NextDelayResponse(decision=types_pb2.DECISION_RETRY, classification="transient:503")
            resp.delay.FromMilliseconds(1500)
            return resp
        if isinstance(e, _loop.Sleep):
            sleeps.append(e.seconds)
            return False
        return None

    seen, res = drive(_loop.run(c, st), answer)
    assert seen == ["Admit", "Invoke", "Decide", "Sleep", "Admit", "Invoke", "Report"]
    assert (res.ok, res.value, res.attempts, res.local, sleeps) == (True, "ok", 2, False, [1.5])


def test_unanswered_decisions_fall_back_to_the_local_policy(clock: FakeClock) -> None:
    c = core(clock)
    st = c.begin(pc.Call(target="geo", idempotent=True), lambda a: None)
    down = FakeRpcError(grpc.StatusCode.UNAVAILABLE)

    def answer(e: Any) -> Any:
        if isinstance(e, (_loop.Admit, _loop.Decide)):
            return down
        if isinstance(e, _loop.Invoke):
            return _loop.Invoked(error=S503)
        return False if isinstance(e, _loop.Sleep) else None

    seen, res = drive(_loop.run(c, st), answer)
    # Admit failed: policyd is away for retry_unreachable_after, so neither
    # Admit nor NextDelay is asked again meanwhile; each failure decided
    # locally is reported (policyd has not seen it), then the final one.
    assert seen == ["Admit", "Invoke", "Report", "Sleep", "Invoke", "Report", "Sleep", "Invoke", "Report"], seen
    assert (res.disposition, res.stop_reason, res.local, res.attempts) == (
        pc.Disposition.DEAD_LETTER, pc.StopReason.ATTEMPTS_EXHAUSTED, True, 3)


def test_a_cancel_thrown_in_reports_a_dead_letter_deadline(clock: FakeClock) -> None:
    c = core(clock)
    st = c.begin(pc.Call(target="geo", idempotent=True), lambda a: None)
    loop = _loop.run(c, st)
    assert isinstance(loop.send(None), _loop.Admit)
    assert isinstance(loop.send(rpb.AdmitResponse(admitted=True)), _loop.Invoke)
    report = loop.throw(_loop.CallCancelled())  # the task running the call was cancelled
    assert isinstance(report, _loop.Report)
    assert (report.outcome.final, report.outcome.stop, report.outcome.attempt) == (
        types_pb2.DISPOSITION_DEAD_LETTER, types_pb2.STOP_REASON_DEADLINE, 1)
    # The caller's own deadline, the moment of the cancel, goes with it.
    assert report.outcome.pb().call.deadline_time.ToNanoseconds() == int(round(clock.now() * 1e9))
    try:
        loop.send(None)
    except StopIteration as done:
        res = done.value
    assert res.disposition is pc.Disposition.DEAD_LETTER and isinstance(res.error, pc.Cancelled)


def test_a_keyed_non_idempotent_call_claims_and_completes(clock: FakeClock) -> None:
    c = core(clock)
    st = c.begin(pc.Call(target="geo", submission_id="doc-1"), lambda a: None)

    def answer(effect: Any) -> Any:
        if isinstance(effect, _loop.Admit):
            return rpb.AdmitResponse(admitted=True)
        if isinstance(effect, _loop.Claim):
            return rpb.ClaimKeyResponse(state=types_pb2.KEY_STATE_NEW, lease_id="a1")
        if isinstance(effect, _loop.Invoke):
            return _loop.Invoked(value="rec-1")
        if isinstance(effect, _loop.Complete):
            assert (effect.request.lease_id, effect.request.outcome, effect.request.result_ref) == (
                "a1", types_pb2.KEY_OUTCOME_SUCCEEDED, "rec-1")
        return None

    seen, res = drive(_loop.run(c, st), answer)
    assert seen == ["Admit", "Claim", "Invoke", "Complete", "Report"], seen
    assert res.ok and res.value == "rec-1"

    st = c.begin(pc.Call(target="geo", submission_id="doc-1", call_id="again"), lambda a: None)
    seen, res = drive(_loop.run(c, st), lambda e: rpb.AdmitResponse(admitted=True) if isinstance(e, _loop.Admit)
                      else rpb.ClaimKeyResponse(state=types_pb2.KEY_STATE_SUCCEEDED, result_ref="rec-1"))
    assert seen == ["Admit", "Claim", "Report"] and res.deduplicated and res.value == "rec-1", (seen, res)
