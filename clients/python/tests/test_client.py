"""The synchronous client against a real policyd: each decision path, the
breaker cache, runs and their ledgers, outcome batching, the decorator."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
from typing import Any

import grpc
import pytest

from retrypolicy.v1 import admin_service_pb2 as apb
from retrypolicy.v1 import types_pb2

import policyd_client as pc

from conftest import Daemon, FakeClock, FakeRpcError, ascript, script

S503 = pc.HTTPStatusError(503)


def test_success_returns_the_value(policyd: Daemon, tenant: str, make_client: Any) -> None:
    c = make_client(policyd, tenant)
    fn, seen = script()
    res = c.call(pc.Call(target="geo", idempotent=True), fn)
    assert res.ok and res.disposition is pc.Disposition.SUCCEEDED
    assert (res.value, res.attempts, res.stop_reason, res.reason, res.error, res.local) == ("ok after 1", 1, None, "", None, False)
    assert len(res.call_id) == 24 and res.idempotency_key == ""  # a random id, no key
    assert seen[0].timeout == 10.0  # policyd's default attempt timeout


def test_retry_then_success(policyd: Daemon, tenant: str, make_client: Any, clock: FakeClock) -> None:
    c = make_client(policyd, tenant)
    fn, _ = script(S503, FakeRpcError(grpc.StatusCode.UNAVAILABLE))
    res = c.call(pc.Call(target="geo", idempotent=True), fn)
    assert res.ok and res.attempts == 3 and res.reason == "transient:grpc_unavailable"
    # FULL jitter: each wait within its nominal delay (0.5 s, then 1 s).
    assert len(clock.waits) == 2 and 0 <= clock.waits[0] <= 0.5 and 0 <= clock.waits[1] <= 1.0


def test_terminal_and_unclassified(policyd: Daemon, tenant: str, make_client: Any) -> None:
    c = make_client(policyd, tenant)
    err = pc.HTTPStatusError(422)
    res = c.call(pc.Call(target="geo", idempotent=True), script(err)[0])
    assert (res.disposition, res.stop_reason, res.reason, res.attempts) == (
        pc.Disposition.FAILED_TERMINAL, pc.StopReason.TERMINAL, "terminal:422", 1)
    assert res.error is err
    mystery = ValueError("mystery")
    res = c.call(pc.Call(target="geo", idempotent=True), script(mystery)[0])
    assert (res.disposition, res.stop_reason, res.reason, res.error) == (
        pc.Disposition.FAILED_TERMINAL, pc.StopReason.TERMINAL, "unclassified:ValueError", mystery)


def test_attempts_exhausted_and_not_idempotent(policyd: Daemon, tenant: str, make_client: Any) -> None:
    c = make_client(policyd, tenant)
    res = c.call(pc.Call(target="a", idempotent=True), script(S503, S503, S503)[0])
    assert (res.disposition, res.stop_reason, res.attempts) == (pc.Disposition.DEAD_LETTER, pc.StopReason.ATTEMPTS_EXHAUSTED, 3)
    res = c.call(pc.Call(target="b"), script(S503)[0])
    assert (res.disposition, res.stop_reason, res.reason) == (
        pc.Disposition.DEAD_LETTER, pc.StopReason.NOT_IDEMPOTENT, "unsafe:not_idempotent")


def test_submission_id_makes_a_write_retryable_with_a_stable_key(policyd: Daemon, tenant: str, make_client: Any) -> None:
    c = make_client(policyd, tenant)
    fn, seen = script(S503, S503)
    res = c.call(pc.Call(target="grants", submission_id="doc-42", payload=b'{"a":1}'), fn)
    want = pc.idempotency_key("doc-42", b'{"a":1}')
    assert res.ok and res.attempts == 3
    assert [a.idempotency_key for a in seen] == [want] * 3 and res.idempotency_key == want
    assert [a.call_id for a in seen] == ["doc-42"] * 3 and res.call_id == "doc-42"
    # policyd's audit trail knows the call by its submission id.
    assert c.close() == 0
    audit = policyd.admin_call("QueryAudit", apb.QueryAuditRequest(call_id="doc-42", tenant=tenant))
    events = [types_pb2.AuditEvent.Name(r.event) for r in audit.records]
    assert events.count("AUDIT_EVENT_DECISION") == 2 and "AUDIT_EVENT_FINAL" in events, events


def test_retry_after_is_never_undercut(policyd: Daemon, tenant: str, make_client: Any, clock: FakeClock) -> None:
    c = make_client(policyd, tenant)
    fn, _ = script(pc.HTTPStatusError(429, {"Retry-After": "7"}))
    res = c.call(pc.Call(target="geo", idempotent=True), fn)
    assert res.ok and res.attempts == 2
    # Never earlier than asked; spread above the hint by at most max(10%, 250ms).
    assert len(clock.waits) == 1 and 7 <= clock.waits[0] <= 7.7, clock.waits


def test_policyd_attempt_timeout_reaches_fn(policyd: Daemon, tenant: str, make_client: Any) -> None:
    policyd.admin_call("SetPolicy", apb.SetPolicyRequest(
        tenant=tenant, policy=types_pb2.Policy(attempt_timeout={"seconds": 2})))
    c = make_client(policyd, tenant, attempt_timeout=3.0)
    fn, seen = script(S503)
    assert c.call(pc.Call(target="geo", idempotent=True), fn).ok
    assert [a.timeout for a in seen] == [3.0, 2.0]


def test_overrunning_the_attempt_timeout_is_a_timeout(policyd: Daemon, tenant: str, make_client: Any, clock: FakeClock) -> None:
    c = make_client(policyd, tenant, attempt_timeout=1.0)

    def slow(a: pc.Attempt) -> str:
        if a.number == 1:
            clock.advance(1.5)  # the attempt took longer than its timeout
            raise RuntimeError("read failed")
        return "ok"

    res = c.call(pc.Call(target="geo", idempotent=True), slow)
    assert res.ok and res.attempts == 2 and res.reason == "transport:timeout"


def test_deadline_caps_the_attempt_timeout(policyd: Daemon, tenant: str, make_client: Any, clock: FakeClock) -> None:
    c = make_client(policyd, tenant)
    fn, seen = script()
    assert c.call(pc.Call(target="geo", idempotent=True, deadline=clock.now() + 4), fn).ok
    assert seen[0].timeout == pytest.approx(4.0)


def test_closed_breaker_costs_no_rpc_and_open_fails_fast(policyd: Daemon, tenant: str, make_client: Any) -> None:
    c = make_client(policyd, tenant)
    ok, _ = script()
    for _ in range(10):
        assert c.call(pc.Call(target="geo", idempotent=True), ok).ok
    assert c.stats().admit_rpcs == 0
    assert c.breaker_state("geo") is pc.BreakerState.CLOSED
    policyd.force_breaker(tenant, "geo", types_pb2.BREAKER_STATE_OPEN)
    # The cache learns of it from the stream; from then on calls are refused
    # without calling fn or policyd (a forced OPEN has no open_until).
    assert c.wait_breaker_state("geo", pc.BreakerState.OPEN, timeout=15)
    fn, seen = script()
    res = c.call(pc.Call(target="geo", idempotent=True), fn)
    assert (res.disposition, res.stop_reason, res.reason, res.attempts) == (
        pc.Disposition.CIRCUIT_OPEN, pc.StopReason.CIRCUIT_OPEN, "breaker:open", 0)
    assert seen == []
    st = c.stats()
    assert st.admit_rpcs == 0 and st.fast_fails == 1
    # Other targets flow.
    assert c.call(pc.Call(target="other", idempotent=True), ok).ok


def test_open_breaker_refused_by_admit_without_the_cache(policyd: Daemon, tenant: str, make_client: Any) -> None:
    policyd.force_breaker(tenant, "geo", types_pb2.BREAKER_STATE_OPEN)
    c = make_client(policyd, tenant, watch=False)
    fn, seen = script()
    res = c.call(pc.Call(target="geo", idempotent=True), fn)
    assert (res.disposition, res.stop_reason, res.attempts, seen) == (pc.Disposition.CIRCUIT_OPEN, pc.StopReason.CIRCUIT_OPEN, 0, [])
    assert res.reason.startswith("breaker:") and c.stats().admit_rpcs == 1


def test_breaker_trips_fleet_wide(policyd: Daemon, tenant: str, make_client: Any) -> None:
    # Two workers of one tenant: the failures of one open the breaker for both.
    a, b = make_client(policyd, tenant), make_client(policyd, tenant)
    for _ in range(2):
        a.call(pc.Call(target="geo", idempotent=True), script(S503, S503, S503)[0])
    assert b.wait_breaker_state("geo", pc.BreakerState.OPEN, timeout=15)
    fn, seen = script()
    res = b.call(pc.Call(target="geo", idempotent=True), fn)
    assert res.disposition is pc.Disposition.CIRCUIT_OPEN and seen == []


def test_run_pool_and_ledger(policyd: Daemon, tenant: str, make_client: Any) -> None:
    run_id = "run-" + tenant
    policyd.open_run(run_id, tenant, pool=5)
    c = make_client(policyd, tenant)
    results = []
    for i in range(10):  # each wants two retries: 20 wanted, 5 in the pool
        fn, _ = script(S503, S503)
        results.append(c.call(pc.Call(target=f"t{i}", idempotent=True, run_id=run_id, call_id=f"c{i}"), fn))
    assert sum(r.attempts - 1 for r in results) == 5
    assert [r.disposition for r in results].count(pc.Disposition.SUCCEEDED) == 2
    budget = [r for r in results if r.stop_reason is pc.StopReason.BUDGET_EXHAUSTED]
    assert len(budget) == 8 and all(r.disposition is pc.Disposition.DEAD_LETTER for r in budget)
    assert c.close() == 0
    run = policyd.run(run_id)
    assert run.retries_spent == 5
    assert (run.ledger.succeeded, run.ledger.dead_letter_budget) == (2, 8), run.ledger


def test_outcomes_are_batched_and_none_lost_on_close(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    run_id = "batch-" + tenant
    policyd.open_run(run_id, tenant, pool=10)
    # Only size and close flush.
    c = pc.Client(policyd.address, tenant=tenant, sleep=clock.sleep, now=clock.now, watch=False,
                  batch_size=64, flush_interval=3600)
    ok, _ = script()
    n = 500
    for i in range(n):
        assert c.call(pc.Call(target="geo", idempotent=True, run_id=run_id, call_id=str(i)), ok).ok
    assert c.close() == 0
    assert policyd.run(run_id).ledger.succeeded == n
    st = c.stats()
    assert (st.outcomes_sent, st.outcomes_dropped) == (n, 0)
    assert st.report_batches_sent >= n // 64


def test_an_outcome_policyd_refuses_does_not_block_the_others(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    run_id = "good-" + tenant
    policyd.open_run(run_id, tenant, pool=10)
    c = pc.Client(policyd.address, tenant=tenant, sleep=clock.sleep, now=clock.now, watch=False, flush_interval=3600)
    ok, _ = script()
    c.call(pc.Call(target="geo", idempotent=True, run_id="no-such-run"), ok)  # policyd: NOT_FOUND
    for i in range(3):
        c.call(pc.Call(target="geo", idempotent=True, run_id=run_id, call_id=str(i)), ok)
    assert c.close() == 0
    assert policyd.run(run_id).ledger.succeeded == 3
    st = c.stats()
    assert (st.outcomes_sent, st.outcomes_dropped) == (3, 1)


def test_decorator(policyd: Daemon, tenant: str, make_client: Any) -> None:
    c = make_client(policyd, tenant)
    seen: list[pc.Attempt] = []

    @c.retry(target="geo", submission=lambda doc, body: (doc, body))
    def put(doc: str, body: bytes) -> str:
        a = pc.current_attempt()
        assert a is not None
        seen.append(a)
        if a.number == 1:
            raise S503
        return f"stored {doc}"

    assert put("doc-7", b"body") == "stored doc-7"
    assert put.__name__ == "put"
    assert [a.idempotency_key for a in seen] == [pc.idempotency_key("doc-7", b"body")] * 2
    assert pc.current_attempt() is None

    @c.retry(target="geo", idempotent=True)
    def broken() -> None:
        raise pc.HTTPStatusError(404)

    with pytest.raises(pc.RetryError) as exc:
        broken()
    assert exc.value.result.disposition is pc.Disposition.FAILED_TERMINAL
    assert isinstance(exc.value.__cause__, pc.HTTPStatusError)


def test_cancel_ends_the_call_at_its_wait(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    cancel = threading.Event()

    def sleep(d: float, ev: threading.Event) -> None:
        cancel.set()  # cancelled while it waits
        clock.sleep(d, ev)

    c = pc.Client(policyd.address, tenant=tenant, sleep=sleep, now=clock.now, watch=False, decision_timeout=5)
    try:
        res = c.call(pc.Call(target="geo", idempotent=True), script(S503)[0], cancel=cancel)
        assert (res.disposition, res.stop_reason, res.attempts) == (pc.Disposition.DEAD_LETTER, pc.StopReason.DEADLINE, 1)
        assert isinstance(res.error, pc.Cancelled)
    finally:
        c.close()


def test_a_call_cancelled_before_its_deadline_is_dead_lettered(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    """policyd told the call its deadline (the policy's call_deadline, an
    hour away) when it answered RETRY; the caller cancels it in the wait.
    The final DEAD_LETTER (DEADLINE) carries the caller's own deadline, the
    moment it ended the call, so policyd takes it into the run's ledger
    (it refused it as "needs the call's deadline to have passed")."""
    policyd.admin_call("SetPolicy", apb.SetPolicyRequest(
        tenant=tenant, policy=types_pb2.Policy(call_deadline={"seconds": 3600})))
    run_id = "cancel-wait-" + tenant
    policyd.open_run(run_id, tenant, pool=10)
    cancel = threading.Event()

    def sleep(d: float, ev: threading.Event) -> None:
        cancel.set()  # cancelled while it waits; the clock stays where the daemon's is

    c = pc.Client(policyd.address, tenant=tenant, sleep=sleep, now=clock.now, watch=False, decision_timeout=5)
    try:
        res = c.call(pc.Call(target="geo", idempotent=True, run_id=run_id), script(S503)[0], cancel=cancel)
        assert (res.disposition, res.stop_reason, res.attempts) == (pc.Disposition.DEAD_LETTER, pc.StopReason.DEADLINE, 1)
    finally:
        c.close()
    assert c.stats().outcomes_dropped == 0
    assert policyd.run(run_id).ledger.dead_letter_deadline == 1


def test_misuse(policyd: Daemon, tenant: str) -> None:
    with pytest.raises(ValueError):
        pc.Client(policyd.address, tenant="")
    with pytest.raises(ValueError):
        pc.Client(policyd.address, tenant=tenant, decision_timeout=-1)
    with pytest.raises(ValueError):
        pc.Client(tenant=tenant)
    with pc.Client(policyd.address, tenant=tenant, watch=False) as c:
        with pytest.raises(ValueError):
            c.call(pc.Call(target=""), lambda a: None)
        with pytest.raises(TypeError):
            c.call(pc.Call(target="t"), None)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            c.call(pc.Call(target="t", submission_id="a\x00b"), lambda a: None)
        assert c.stats().calls == 0
    with pytest.raises(RuntimeError):
        c.call(pc.Call(target="t"), lambda a: None)


def test_fleet_cooldown_is_waited_out_spread_or_cut_by_the_deadline(policyd: Daemon, tenant: str, make_client: Any) -> None:
    # One worker is told Retry-After: 7; policyd holds every worker of the
    # tenant and target back for that long.
    a = make_client(policyd, tenant)
    assert a.call(pc.Call(target="geo", idempotent=True), script(pc.HTTPStatusError(429, {"Retry-After": "7"}))[0]).ok
    # Another worker (its own clock, no cache: Admit answers) waits the
    # cool-down, spread like a hint; the second refusal would take it past
    # its deadline, so it stops there instead of sleeping for nothing.
    clock = FakeClock()
    b = pc.Client(policyd.address, tenant=tenant, sleep=clock.sleep, now=clock.now, watch=False, decision_timeout=5)
    try:
        fn, seen = script()
        res = b.call(pc.Call(target="geo", idempotent=True, deadline=clock.now() + 20), fn)
        assert (res.disposition, res.stop_reason, res.reason, res.attempts, seen) == (
            pc.Disposition.DEAD_LETTER, pc.StopReason.DEADLINE, "cooldown:pushback", 0, [])
        assert len(clock.waits) == 1 and 6 <= clock.waits[0] <= 7.7, clock.waits
    finally:
        b.close()


def test_successes_reach_the_breaker_before_the_next_failure(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    # A breaker that trips after 2 failures in a row, and outcomes that are
    # only sent when a decision needs them: each call fails once and then
    # succeeds, so no two failures are ever in a row.
    policyd.admin_call("SetPolicy", apb.SetPolicyRequest(
        tenant=tenant, policy=types_pb2.Policy(breaker=types_pb2.BreakerSettings(consecutive_failures=2))))
    c = pc.Client(policyd.address, tenant=tenant, sleep=clock.sleep, now=clock.now, watch=False,
                  decision_timeout=5, flush_interval=3600)
    try:
        for _ in range(4):
            res = c.call(pc.Call(target="geo", idempotent=True), script(S503)[0])
            assert res.ok and res.attempts == 2, res
    finally:
        c.close()
    b = policyd.admin_call("GetBreaker", apb.GetBreakerRequest(key=types_pb2.BreakerKey(tenant=tenant, target="geo"))).breaker
    assert b.state == types_pb2.BREAKER_STATE_CLOSED


def test_tls_and_token(dedicated: Any, tmp_path: Any, clock: FakeClock) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=policyd",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    tokens = tmp_path / "tenant-tokens"
    tokens.write_text("acme s3cret\n")
    tokens.chmod(0o600)
    creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    d = dedicated("--tls-cert", str(cert), "--tls-key", str(key), "--tenant-tokens-file", str(tokens), credentials=creds)
    with pc.Client(d.address, tenant="acme", token="s3cret", credentials=creds, sleep=clock.sleep, now=clock.now,
                   decision_timeout=5) as c:
        assert c.ready(timeout=15)
        res = c.call(pc.Call(target="geo", idempotent=True), script(S503)[0])
        assert res.ok and not res.local

    async def run_async() -> pc.Result[str]:
        async with pc.AsyncClient(d.address, tenant="acme", token="s3cret", credentials=creds, sleep=clock.asleep,
                                  now=clock.now, decision_timeout=5) as ac:
            assert await ac.ready(timeout=15)
            return await ac.call(pc.Call(target="geo", idempotent=True), ascript(S503)[0])

    res = asyncio.run(run_async())
    assert res.ok and not res.local


def test_worker_token(dedicated: Any, tmp_path: Any, clock: FakeClock) -> None:
    tokens = tmp_path / "tenant-tokens"
    tokens.write_text("acme s3cret\n")
    tokens.chmod(0o600)
    d = dedicated("--tenant-tokens-file", str(tokens))
    with pc.Client(d.address, tenant="acme", token="s3cret", sleep=clock.sleep, now=clock.now, decision_timeout=5) as c:
        assert c.ready(timeout=15)
        res = c.call(pc.Call(target="geo", idempotent=True), script(S503)[0])
        assert res.ok and not res.local
    # Without the token policyd refuses: the client decides locally, and
    # keeps asking (a refusal is not an outage).
    with pc.Client(d.address, tenant="acme", sleep=clock.sleep, now=clock.now, watch=False, decision_timeout=5) as c:
        res = c.call(pc.Call(target="geo", idempotent=True), script(S503)[0])
        assert res.ok and res.local
        res = c.call(pc.Call(target="geo", idempotent=True), script(S503)[0])
        assert res.local and c.stats().admit_rpcs == 4  # every attempt asked


def test_a_runs_cutoff_holds_without_an_admit_per_call(policyd: Daemon, tenant: str) -> None:
    # The first call of the run learns its cut-off from Admit; once the
    # client's clock passes it, a call ends DEADLINE_CUT without its
    # function being called and without asking Admit again, and the ledger
    # counts it. (policyd's own clock is not past the cut-off yet: it
    # accepts the cut within --max-clock-skew.)
    run_id = "cutoff-" + tenant
    policyd.open_run(run_id, tenant, pool=10, cutoff_in=60)
    clock = FakeClock()
    c = pc.Client(policyd.address, tenant=tenant, sleep=clock.sleep, now=clock.now, decision_timeout=5)
    try:
        fn, seen = script()
        first = c.call(pc.Call(target="geo", idempotent=True, run_id=run_id, call_id="before"), fn)
        assert first.ok and len(seen) == 1
        clock.advance(61)
        for i in range(3):
            res = c.call(pc.Call(target="geo", idempotent=True, run_id=run_id, call_id=f"after-{i}"), fn)
            assert (res.disposition, res.stop_reason, res.reason, res.attempts) == (
                pc.Disposition.DEADLINE_CUT, pc.StopReason.DEADLINE, "run:cutoff", 0)
        assert len(seen) == 1, seen
        assert c.stats().admit_rpcs == 1
    finally:
        c.close()
    ledger = policyd.run(run_id).ledger
    assert (ledger.succeeded, ledger.deadline_cut) == (1, 3), ledger


def test_the_idempotency_ledger_answers_a_second_worker(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    # A non-idempotent call with a key claims it: the first worker's
    # success is kept with its result reference (the string fn returns),
    # and a second worker submitting the same document gets it without
    # calling fn. A 504 after the upstream may have applied the write
    # leaves the outcome unknown: the retry does not happen, the call is
    # dead-lettered (the policy does not say the upstream deduplicates).
    run_id = "ledger-" + tenant
    policyd.open_run(run_id, tenant, pool=10)
    c = pc.Client(policyd.address, tenant=tenant, sleep=clock.sleep, now=clock.now, decision_timeout=5)
    try:
        calls: list[int] = []

        def submit(a: pc.Attempt) -> str:
            calls.append(a.number)
            return "rec-17"

        first = c.call(pc.Call(target="grants", submission_id="doc-17", payload=b"{}", run_id=run_id, call_id="w1"), submit)
        second = c.call(pc.Call(target="grants", submission_id="doc-17", payload=b"{}", run_id=run_id, call_id="w2"), submit)
        assert first.ok and not first.deduplicated and first.value == "rec-17"
        assert second.ok and second.deduplicated and second.value == "rec-17" and second.attempts == 0
        assert calls == [1] and c.stats().deduplicated == 1

        def lost(a: pc.Attempt) -> str:
            calls.append(a.number)
            raise pc.HTTPStatusError(504)

        res = c.call(pc.Call(target="grants", submission_id="doc-18", payload=b"{}", run_id=run_id, call_id="w3"), lost)
        assert (res.disposition, res.stop_reason, res.reason) == (
            pc.Disposition.DEAD_LETTER, pc.StopReason.NOT_IDEMPOTENT, "idempotency:unknown")
        assert calls == [1, 1], calls  # the 504'd write was not sent again
    finally:
        c.close()
    ledger = policyd.run(run_id).ledger
    assert (ledger.succeeded, ledger.deduplicated, ledger.dead_letter_not_idempotent) == (2, 1, 1), ledger


def test_origin_anchors_the_deadline(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    # An event almost a call deadline old stops at its first failure
    # (DEAD_LETTER, DEADLINE) where a fresh one retries.
    p = types_pb2.Policy()
    p.call_deadline.FromSeconds(3600)
    policyd.admin_call("SetPolicy", apb.SetPolicyRequest(tenant=tenant, target="grants", policy=p))
    c = pc.Client(policyd.address, tenant=tenant, sleep=clock.sleep, now=clock.now, watch=False, decision_timeout=5)
    try:
        fn, _ = script(S503)
        fresh = c.call(pc.Call(target="grants", idempotent=True, call_id="fresh"), fn)
        fn, _ = script(S503)
        old = c.call(pc.Call(target="grants", idempotent=True, call_id="old", origin=clock.now() - 3595), fn)
        assert fresh.ok
        assert (old.disposition, old.stop_reason) == (pc.Disposition.DEAD_LETTER, pc.StopReason.DEADLINE)
    finally:
        c.close()
