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
