"""policyd_client.tenacity with tenacity's Retrying, @retry and
AsyncRetrying, against a flaky upstream on loopback and a real policyd:
policyd's delays (Retry-After honoured), its stops, admission through the
breaker, outcomes reported to the audit trail, the key stable across
attempts; tenacity sleeps on the fake clock."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

import httpx
import pytest
import requests
import tenacity

from retrypolicy.v1 import admin_service_pb2 as apb
from retrypolicy.v1 import types_pb2

import policyd_client as pc
from policyd_client.tenacity import AsyncPolicy, Policy

from conftest import Daemon, FakeClock
from flaky import RESET, Flaky, Reply, assert_retry_delays, busy, flaky  # noqa: F401  (the fixture)


def tsleep(clock: FakeClock) -> Callable[[float], None]:
    """tenacity's sleep(seconds) on the fake clock."""
    return lambda d: clock.sleep(d, threading.Event())


def fetch(url: str) -> str:
    a = pc.current_attempt()
    assert a is not None, "before did not admit the attempt"
    resp = requests.get(url, headers={"Idempotency-Key": a.idempotency_key}, timeout=a.timeout)
    resp.raise_for_status()  # requests.HTTPError: status and Retry-After read from it
    return resp.text


def test_retry_decorator_waits_what_policyd_says(policyd: Daemon, tenant: str, make_client: Any, clock: FakeClock,
                                                 flaky: Flaky) -> None:
    events: list[pc.Event] = []
    c = make_client(policyd, tenant, on_event=events.append)
    # The reset's outcome is unknown: the write is replayed only to an
    # upstream that deduplicates by key.
    policyd.admin_call("SetPolicy", apb.SetPolicyRequest(
        tenant=tenant, target="geo", policy=types_pb2.Policy(upstream_dedupes_by_key=True)))
    policy = Policy(c, "geo", submission=lambda url, doc: (doc, url))

    @tenacity.retry(**policy.strategies(), sleep=tsleep(clock))
    def get(url: str, doc: str) -> str:
        return fetch(url)

    flaky.script(busy(1, retry_after="7"), RESET)
    assert get(flaky.url + "/x", "doc-5") == "ok after 3"
    assert_retry_delays(events, clock, (7, 7.75), (0, 7.75))  # tenacity waited policyd's delays
    want = pc.idempotency_key("doc-5", flaky.url + "/x")
    assert [s.headers["idempotency-key"] for s in flaky.seen] == [want] * 3
    # Both failures were decided by policyd, and the success reported.
    assert c.close() == 0
    audit = policyd.admin_call("QueryAudit", apb.QueryAuditRequest(call_id="doc-5", tenant=tenant))
    audited = [types_pb2.AuditEvent.Name(r.event) for r in audit.records]
    assert audited.count("AUDIT_EVENT_DECISION") == 2 and "AUDIT_EVENT_FINAL" in audited, audited


def test_a_reset_write_is_dead_lettered_unless_the_upstream_dedupes(policyd: Daemon, tenant: str, make_client: Any,
                                                                     clock: FakeClock, flaky: Flaky) -> None:
    c = make_client(policyd, tenant)
    policy = Policy(c, "geo", submission=lambda url, doc: (doc, url))

    @tenacity.retry(**policy.strategies(), sleep=tsleep(clock))
    def post(url: str, doc: str) -> str:
        return fetch(url)

    flaky.script(RESET)
    with pytest.raises(pc.RetryError) as err:
        post(flaky.url + "/x", "doc-6")
    res = err.value.result
    assert (res.disposition, res.reason, res.attempts) == (pc.Disposition.DEAD_LETTER, "idempotency:unknown", 1), res
    assert len(flaky.seen) == 1
    # A success of the key is kept: the same document again is not sent.
    flaky.script()
    assert post(flaky.url + "/y", "doc-7") == "ok after 1"
    assert post(flaky.url + "/y", "doc-7") == "ok after 1" and len(flaky.seen) == 1


def test_retrying_stops_where_policyd_stops(policyd: Daemon, tenant: str, make_client: Any, clock: FakeClock,
                                            flaky: Flaky) -> None:
    c = make_client(policyd, tenant)
    policy = Policy(c, "geo", idempotent=True)
    for script, disposition, stop, attempts in [
        ((busy(1), busy(2), busy(3)), pc.Disposition.DEAD_LETTER, pc.StopReason.ATTEMPTS_EXHAUSTED, 3),
        ((Reply(422),), pc.Disposition.FAILED_TERMINAL, pc.StopReason.TERMINAL, 1),
    ]:
        flaky.script(*script)
        retrying = tenacity.Retrying(**policy.strategies(), sleep=tsleep(clock))
        with pytest.raises(tenacity.RetryError) as err:
            for attempt in retrying:
                with attempt:
                    fetch(flaky.url + "/x")
        res = policy.result(attempt.retry_state)
        assert res is not None and (res.disposition, res.stop_reason, res.attempts) == (disposition, stop, attempts)
        assert err.value.last_attempt.attempt_number == attempts == len(flaky.seen)


def test_an_open_breaker_refuses_the_attempt(policyd: Daemon, tenant: str, make_client: Any, clock: FakeClock,
                                             flaky: Flaky) -> None:
    c = make_client(policyd, tenant)
    policyd.force_breaker(tenant, "geo", types_pb2.BREAKER_STATE_OPEN)
    assert c.wait_breaker_state("geo", pc.BreakerState.OPEN, timeout=10)
    policy = Policy(c, "geo", idempotent=True)

    @tenacity.retry(**policy.strategies(), sleep=tsleep(clock))
    def get() -> str:
        return fetch(flaky.url + "/x")

    with pytest.raises(pc.RetryError) as err:
        get()
    assert err.value.result.disposition is pc.Disposition.CIRCUIT_OPEN and flaky.seen == []


def test_without_before_the_policy_says_so(policyd: Daemon, tenant: str, make_client: Any, flaky: Flaky) -> None:
    policy = Policy(make_client(policyd, tenant), "geo", idempotent=True)
    flaky.script(busy(1))
    with pytest.raises(TypeError, match="before admits each attempt"):
        tenacity.Retrying(retry=policy.retry, stop=policy.stop, wait=policy.wait)(
            lambda: requests.get(flaky.url).raise_for_status())


def test_async_retrying(policyd: Daemon, tenant: str, clock: FakeClock, flaky: Flaky) -> None:
    async def main() -> None:
        async with pc.AsyncClient(policyd.address, tenant=tenant, sleep=clock.asleep, now=clock.now,
                                  decision_timeout=5.0) as c, httpx.AsyncClient() as http:
            assert await c.ready(timeout=15)
            policy = AsyncPolicy(c, "geo", submission=lambda: ("doc-8", b""))
            keys: list[str] = []

            async def get() -> str:
                a = pc.current_attempt()
                assert a is not None
                keys.append(a.idempotency_key)
                resp = await http.post(flaky.url + "/x", headers={"Idempotency-Key": a.idempotency_key})
                resp.raise_for_status()
                return resp.text

            flaky.script(busy(1, retry_after="4"), busy(2))
            retrying = tenacity.AsyncRetrying(**policy.strategies(), sleep=clock.asleep)
            assert await retrying(get) == "ok after 3"
            assert keys == [pc.idempotency_key("doc-8", b"")] * 3 and clock.waits[0] >= 4

            # doc-8 succeeded: the ledger answers it again without a request.
            flaky.script()
            assert await tenacity.AsyncRetrying(**policy.strategies(), sleep=clock.asleep)(get) == "ok after 3"
            assert flaky.seen == [] and len(keys) == 3
            states: list[tenacity.RetryCallState] = []
            async for attempt in tenacity.AsyncRetrying(**policy.strategies(), sleep=clock.asleep):
                states.append(attempt.retry_state)
                with attempt:
                    await get()
            assert states == [] and flaky.seen == []

            # Another document (its own key) meets a terminal refusal.
            other = AsyncPolicy(c, "geo", submission=lambda: ("doc-9", b""))
            flaky.script(Reply(422))
            with pytest.raises(tenacity.RetryError):
                async for attempt in tenacity.AsyncRetrying(**other.strategies(), sleep=clock.asleep):
                    with attempt:
                        await get()
            res = other.result(attempt.retry_state)
            assert res is not None and res.disposition is pc.Disposition.FAILED_TERMINAL

    asyncio.run(main())


class Interrupted(BaseException):
    """Not an Exception, as KeyboardInterrupt and a task's cancellation are not."""


def test_a_failure_that_is_not_an_exception_dead_letters_the_call(policyd: Daemon, tenant: str, make_client: Any,
                                                          clock: FakeClock) -> None:
    policy = Policy(make_client(policyd, tenant), "geo", idempotent=True)
    with pytest.raises(Interrupted):
        for attempt in tenacity.Retrying(**policy.strategies(), sleep=tsleep(clock)):
            with attempt:
                raise Interrupted()
    res = policy.result(attempt.retry_state)
    assert res is not None and (res.disposition, res.stop_reason, res.attempts) == (
        pc.Disposition.DEAD_LETTER, pc.StopReason.DEADLINE, 1)
    assert clock.waits == []


def test_async_cancellation_dead_letters_the_call(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    async def main() -> None:
        async with pc.AsyncClient(policyd.address, tenant=tenant, sleep=clock.asleep, now=clock.now,
                                  decision_timeout=5.0) as c:
            policy = AsyncPolicy(c, "geo", idempotent=True)
            started = asyncio.Event()
            states: list[tenacity.RetryCallState] = []

            async def hang() -> None:
                started.set()
                await asyncio.Event().wait()  # until cancelled

            async def run() -> None:
                async for attempt in tenacity.AsyncRetrying(**policy.strategies(), sleep=clock.asleep):
                    states.append(attempt.retry_state)
                    with attempt:
                        await hang()

            task = asyncio.create_task(run())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            res = policy.result(states[0])
            assert res is not None and (res.disposition, res.stop_reason) == (
                pc.Disposition.DEAD_LETTER, pc.StopReason.DEADLINE)

    asyncio.run(main())
