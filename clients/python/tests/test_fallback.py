"""The local fallback: policyd unreachable from the start, too slow, or
stopped in the middle of a batch. Every call still ends, decided by the
local copy of the default policy."""

from __future__ import annotations

import signal
import socket
import threading
from typing import Any

import pytest

from retrypolicy.v1 import admin_service_pb2 as apb
from retrypolicy.v1 import types_pb2

import policyd_client as pc
from policyd_client.fallback import LocalBudget, LocalPolicy

from conftest import FakeClock, script

S503 = pc.HTTPStatusError(503)


@pytest.fixture
def nowhere() -> str:
    """An address nothing listens on: policyd is unreachable."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_unreachable_policyd_decides_locally(nowhere: str, make_client: Any, clock: FakeClock) -> None:
    c = make_client(nowhere, "acme", decision_timeout=0.25)
    res = c.call(pc.Call(target="geo", idempotent=True), script(S503, S503)[0])
    assert res.ok and res.local and res.attempts == 3 and res.reason == "transient:503"
    # The default policy's FULL jitter: within 0.5 s, then 1 s.
    assert 0 <= clock.waits[0] <= 0.5 and 0 <= clock.waits[1] <= 1.0
    assert c.stats().local_decisions == 2


@pytest.mark.parametrize(
    "errors, idempotent, want",
    [
        ([pc.HTTPStatusError(422)], True, (pc.Disposition.FAILED_TERMINAL, pc.StopReason.TERMINAL, "terminal:422", 1)),
        ([S503] * 3, True, (pc.Disposition.DEAD_LETTER, pc.StopReason.ATTEMPTS_EXHAUSTED, "transient:503", 3)),
        ([S503], False, (pc.Disposition.DEAD_LETTER, pc.StopReason.NOT_IDEMPOTENT, "unsafe:not_idempotent", 1)),
        ([ConnectionRefusedError()], False, (pc.Disposition.SUCCEEDED, None, "transport:connection_refused", 2)),
        ([ValueError("?")], True, (pc.Disposition.FAILED_TERMINAL, pc.StopReason.TERMINAL, "unclassified:ValueError", 1)),
    ],
)
def test_local_decision_paths(nowhere: str, make_client: Any, errors: list[Exception], idempotent: bool, want: Any) -> None:
    c = make_client(nowhere, "acme")
    res = c.call(pc.Call(target="geo", idempotent=idempotent), script(*errors)[0])
    assert (res.disposition, res.stop_reason, res.reason, res.attempts) == want


def test_local_retry_after_is_never_undercut(nowhere: str, make_client: Any, clock: FakeClock) -> None:
    c = make_client(nowhere, "acme")
    res = c.call(pc.Call(target="geo", idempotent=True), script(pc.HTTPStatusError(429, {"Retry-After": "7"}))[0])
    assert res.ok and res.local
    assert 7 <= clock.waits[0] <= 7.7, clock.waits


def test_local_deadline_reserves_the_attempt_timeout(nowhere: str, make_client: Any, clock: FakeClock) -> None:
    c = make_client(nowhere, "acme", attempt_timeout=10.0)
    res = c.call(pc.Call(target="geo", idempotent=True, deadline=clock.now() + 5), script(S503)[0])
    assert (res.disposition, res.stop_reason, res.local) == (pc.Disposition.DEAD_LETTER, pc.StopReason.DEADLINE, True)
    assert clock.waits == []  # it did not sleep for an attempt that could not happen


def test_local_budget(nowhere: str, make_client: Any) -> None:
    c = make_client(nowhere, "acme", local_budget=1.5, local_budget_per_second=0)
    assert c.call(pc.Call(target="geo", idempotent=True), script(S503)[0]).ok  # costs 1
    res = c.call(pc.Call(target="geo", idempotent=True), script(S503)[0])
    assert (res.disposition, res.stop_reason) == (pc.Disposition.DEAD_LETTER, pc.StopReason.BUDGET_EXHAUSTED)
    # A success deposits 0.2; a retry after a timeout costs 2.
    res = c.call(pc.Call(target="geo", idempotent=True), script(TimeoutError())[0])
    assert res.stop_reason is pc.StopReason.BUDGET_EXHAUSTED


def test_slow_policyd_falls_back_within_the_decision_timeout(dedicated: Any, clock: FakeClock) -> None:
    d = dedicated()
    c = pc.Client(d.address, tenant="acme", sleep=clock.sleep, now=clock.now, watch=False,
                  decision_timeout=0.1, retry_unreachable_after=1.0)
    try:
        assert c.call(pc.Call(target="geo", idempotent=True), script()[0]).ok  # connected
        d.proc.send_signal(signal.SIGSTOP)  # up, connected, and answering nothing
        try:
            res = c.call(pc.Call(target="geo", idempotent=True), script(S503)[0])
            assert res.ok and res.local
            st = c.stats()
            assert (st.local_decisions, st.admit_rpcs) == (1, 2)  # the stalled Admit, then nothing asked
        finally:
            d.proc.send_signal(signal.SIGCONT)
        # Past retry_unreachable_after the client asks policyd again.
        clock.advance(1.5)
        res = c.call(pc.Call(target="geo", idempotent=True), script(S503)[0])
        assert res.ok and not res.local
    finally:
        c.close(timeout=2)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_policyd_stopped_mid_batch(dedicated: Any, clock: FakeClock, sig: int) -> None:
    d = dedicated("--grace", "500ms")
    tenant = "acme"
    # Breakers that do not trip and a budget that does not run out, so every
    # call needs decisions and every call can succeed.
    d.admin_call("SetPolicy", apb.SetPolicyRequest(
        tenant=tenant, policy=types_pb2.Policy(breaker=types_pb2.BreakerSettings(consecutive_failures=10000))))
    d.set_budget(tenant, 1e6)
    c = pc.Client(d.address, tenant=tenant, sleep=clock.sleep, now=clock.now, decision_timeout=0.5,
                  local_budget=1e6)
    assert c.ready(timeout=15)
    workers, calls, after = 16, 25, 3
    lock = threading.Lock()
    done = 0
    quarter = threading.Event()
    gone = threading.Event()
    results: list[pc.Result[Any]] = []
    late: list[pc.Result[Any]] = []

    def work(w: int) -> None:
        nonlocal done
        for _ in range(calls):
            res = c.call(pc.Call(target=f"t{w % 4}", idempotent=True), script(S503)[0])
            with lock:
                results.append(res)
                done += 1
                if done == workers * calls // 4:
                    quarter.set()
        # policyd is gone for good now: these are decided locally.
        assert gone.wait(timeout=60)
        for _ in range(after):
            late.append(c.call(pc.Call(target=f"t{w % 4}", idempotent=True), script(S503)[0]))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    try:
        assert quarter.wait(timeout=60)
        d.proc.send_signal(sig)  # policyd goes away in the middle of the batch
        d.proc.wait(timeout=30)
    finally:
        gone.set()
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert len(results) == workers * calls and len(late) == workers * after
    assert all(r.ok for r in results + late), [r for r in results + late if not r.ok][:3]
    assert all(r.local for r in late)
    st = c.stats()
    assert st.local_decisions >= len(late)
    # The outcomes of the local calls cannot reach a stopped policyd; close
    # says so instead of hanging.
    lost = c.close(timeout=0.3)
    assert lost > 0 and c.stats().outcomes_dropped >= lost


# Pushback at the edges, as policy/hints.go has it: every valid hint is
# honoured up to the policy's max_hint (1 h by default), never ignored for
# its size; a negative grpc-retry-pushback-ms stops, "-0" is zero.
@pytest.mark.parametrize(
    "headers, want",
    [
        ({"Retry-After": "99999999999"}, ("retry", 3600.0)),
        ({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, ("retry", 3600.0)),
        ({"X-RateLimit-Reset": "9999999999"}, ("retry", 3600.0)),
        ({"grpc-retry-pushback-ms": "9223372036854775807"}, ("retry", 3600.0)),
        ({"x-amz-retry-after": "1000000000000000000"}, ("retry", 3600.0)),
        ({"grpc-retry-pushback-ms": "-0"}, ("retry", 0.0)),
        ({"grpc-retry-pushback-ms": "-1"}, ("stop", "SERVER_PUSHBACK")),
        ({"grpc-retry-pushback-ms": "-1", "Retry-After": "5"}, ("stop", "SERVER_PUSHBACK")),
        ({"Retry-After": "5", "x-amz-retry-after": "9000"}, ("retry", 9.0)),  # the largest wins
        ({"Retry-After": "soon"}, ("retry", None)),  # ignored: jittered backoff only
    ],
)
def test_local_policy_honours_large_hints_up_to_the_cap(headers: dict[str, str], want: tuple[str, object]) -> None:
    p = LocalPolicy(10.0, LocalBudget(20, 2), rand=lambda: 0.0)
    f = pc.classify_exception(pc.HTTPStatusError(503, headers))
    d = p.decide(1_000_000.0, None, 1, f, True, False)
    if want[0] == "stop":
        assert (d.retry, types_pb2.StopReason.Name(d.stop_reason)) == (False, "STOP_REASON_" + str(want[1])), d
        assert d.disposition == types_pb2.DISPOSITION_DEAD_LETTER
        return
    assert d.retry, d
    if want[1] is None:
        assert d.delay == 0.0  # rand 0: FULL jitter gives 0, no hint to honour
    else:
        # rand 0: the hint itself, spread by nothing.
        assert d.delay == want[1], d
