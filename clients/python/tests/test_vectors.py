"""The shared vectors of testdata/vectors.json, which the Go client checks
too (clients/go/policyclient/vectors_test.go, clients/go/e2e/vectors_test.go): idempotency keys, classification by the
real daemon and by the local fallback, and how scripted calls end through
the real daemon with both clients."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import grpc
import pytest

from retrypolicy.v1 import retry_policy_service_pb2 as rpb
from retrypolicy.v1 import retry_policy_service_pb2_grpc as rpb_grpc
from retrypolicy.v1 import types_pb2

import policyd_client as pc
from policyd_client.fallback import LocalBudget, LocalPolicy

from conftest import Daemon, FakeClock, FakeRpcError, ascript, failure_pb, load_vectors, native_error, script

V = load_vectors()


def _id(v: dict[str, Any]) -> str:
    return str(v["name"])


@pytest.mark.parametrize("v", V["idempotency_keys"], ids=lambda v: repr(v["submission_id"]))
def test_idempotency_key(v: dict[str, Any]) -> None:
    payload = v["payload_utf8"].encode() if "payload_utf8" in v else bytes.fromhex(v["payload_hex"])
    assert pc.idempotency_key(v["submission_id"], payload) == v["key"]
    if "payload_utf8" in v:  # a str payload is its UTF-8 bytes
        assert pc.idempotency_key(v["submission_id"], v["payload_utf8"]) == v["key"]


def test_classification_through_policyd(policyd: Daemon, tenant: str) -> None:
    stub = rpb_grpc.RetryPolicyServiceStub(policyd.channel)
    for v in V["classification"]:
        call = types_pb2.CallRef(tenant=tenant, target="classify", idempotent=v["idempotent"],
                                 idempotency_key="k" if v["has_key"] else "")
        resp = stub.Classify(rpb.ClassifyRequest(call=call, failure=failure_pb(v["failure"])), timeout=10)
        got = (types_pb2.Category.Name(resp.category), resp.reason, resp.retryable)
        want = ("CATEGORY_" + v["category"], v["reason"], v["retryable"])
        assert got == want, f"{v['name']}: policyd's Classify got {got}, want {want}"


@pytest.mark.parametrize("v", V["classification"], ids=_id)
def test_classification_local(v: dict[str, Any]) -> None:
    cat, reason = pc.classify_local(failure_pb(v["failure"]), v["idempotent"], v["has_key"])
    assert (types_pb2.Category.Name(cat), reason) == ("CATEGORY_" + v["category"], v["reason"])


@pytest.mark.parametrize("v", V["classification"], ids=_id)
def test_native_errors_map_to_the_vector_failure(v: dict[str, Any]) -> None:
    # The Python exception standing for each failure becomes that Failure.
    f = pc.classify_exception(native_error(v["failure"]))
    assert not f.unclassified, f.reason
    assert f.failure == failure_pb(v["failure"])


def _spec(v: dict[str, Any], clock: FakeClock) -> pc.Call:
    c = v["call"]
    deadline = clock.now() + c["deadline_in_seconds"] if "deadline_in_seconds" in c else None
    return pc.Call(target="vec-" + v["name"].replace(" ", "-")[:60], idempotent=c["idempotent"],
                   submission_id=c.get("submission_id", ""), payload=c.get("payload", ""), deadline=deadline)


def _check(v: dict[str, Any], res: pc.Result[Any], calls: int, clock: FakeClock) -> None:
    got = (res.disposition.value, res.stop_reason.value if res.stop_reason else "", res.attempts)
    want = (v["disposition"], v["stop_reason"], v["attempts"])
    assert got == want, f"{v['name']}: got {got} ({res.reason}), want {want}"
    assert calls == v["attempts"], f"fn called {calls} times, want {v['attempts']}"
    assert not res.local, "decided locally with policyd up"
    if "min_first_wait_seconds" in v:
        assert clock.waits and clock.waits[0] >= v["min_first_wait_seconds"], f"waits {clock.waits}"


@pytest.mark.parametrize("v", V["stop_reasons"], ids=_id)
def test_stop_reasons_sync(v: dict[str, Any], policyd: Daemon, tenant: str, make_client: Any, clock: FakeClock) -> None:
    client = make_client(policyd, tenant)
    fn, seen = script(*[native_error(s) for s in v["script"]])
    _check(v, client.call(_spec(v, clock), fn), len(seen), clock)


@pytest.mark.parametrize("v", V["stop_reasons"], ids=_id)
def test_stop_reasons_async(v: dict[str, Any], policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    async def run() -> None:
        async with pc.AsyncClient(policyd.address, tenant=tenant, sleep=clock.asleep, now=clock.now,
                                  decision_timeout=5.0) as client:
            assert await client.ready(timeout=15)
            fn, seen = ascript(*[native_error(s) for s in v["script"]])
            _check(v, await client.call(_spec(v, clock), fn), len(seen), clock)

    asyncio.run(run())


@pytest.mark.parametrize("v", V.get("pushback_hints", []), ids=_id)
def test_pushback_hints_local(v: dict[str, Any]) -> None:
    # The local fallback honours the hint policyd would (before spreading),
    # capped at the default max_hint, or stops on a do-not-retry.
    now = datetime.fromisoformat(v["now"].replace("Z", "+00:00")).timestamp()
    f = pc.classify_exception(pc.HTTPStatusError(503, v["headers"]))
    policy = LocalPolicy(10.0, LocalBudget(20, 2), rand=lambda: 0.0)  # no jitter, no spread
    d = policy.decide(now, None, 1, f, True, False)
    if v["do_not_retry"]:
        assert (d.retry, d.stop_reason) == (False, types_pb2.STOP_REASON_SERVER_PUSHBACK), d
    else:
        assert (d.retry, d.delay) == (True, float(v["hint_seconds"])), d


def _check_adapter_verdict(v: dict[str, Any], err: Exception) -> None:
    # How the client reads an adapter's failure (http_responses,
    # grpc_statuses): the local fallback's classification, and its decision
    # after one failure: stop on a do-not-retry or a failure not retryable,
    # else wait the hint (no jitter, no spread; 0 without a hint).
    f = pc.classify_exception(err)
    cat, reason = pc.classify_local(f.failure, v["idempotent"], False)
    assert (types_pb2.Category.Name(cat), reason) == ("CATEGORY_" + v["category"], v["reason"])
    policy = LocalPolicy(10.0, LocalBudget(20, 2), rand=lambda: 0.0)
    d = policy.decide(datetime(2026, 3, 1, 12).timestamp(), None, 1, f, v["idempotent"], False)
    if v["do_not_retry"]:
        assert (d.retry, d.stop_reason) == (False, types_pb2.STOP_REASON_SERVER_PUSHBACK), d
    elif v["retryable"]:
        assert (d.retry, d.delay) == (True, float(v["hint_seconds"])), d
    else:
        assert not d.retry, d


@pytest.mark.parametrize("v", V["http_responses"], ids=_id)
def test_http_responses_local(v: dict[str, Any]) -> None:
    _check_adapter_verdict(v, pc.HTTPStatusError(v["status"], v["headers"]))


_GRPC_CODES = {c.value[0]: c for c in grpc.StatusCode}


@pytest.mark.parametrize("v", V["grpc_statuses"], ids=_id)
def test_grpc_statuses_local(v: dict[str, Any]) -> None:
    _check_adapter_verdict(v, FakeRpcError(_GRPC_CODES[v["code"]], tuple(v["trailers"].items())))
