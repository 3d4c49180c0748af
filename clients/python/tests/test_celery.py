"""policyd_client.celery with a real Celery worker (a thread, on the
in-memory broker) against a flaky upstream on loopback and a real policyd:
the countdown each retry asks for is policyd's (Retry-After honoured), the
attempt number and the key carry across executions, policyd's stops fail
the task, outcomes reach the audit trail. The recording task asks Celery
to run each retry at once and keeps the countdown policyd gave, so nothing
waits."""

from __future__ import annotations

from typing import Any, Iterator

import celery
import pytest
import requests
from celery.contrib.testing.worker import start_worker

from retrypolicy.v1 import admin_service_pb2 as apb
from retrypolicy.v1 import types_pb2

import policyd_client as pc
from policyd_client.celery import HEADER, CallRefused, PolicydTask

from conftest import Daemon
from flaky import RESET, Flaky, Reply, busy, flaky  # noqa: F401  (the fixture)

app = celery.Celery("policyd-test", broker="memory://", backend="cache+memory://")
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])


class Recording(PolicydTask):
    """Keeps the countdown policyd gave each retry; runs the retry at once."""

    countdowns: list[float] = []

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        type(self).countdowns.append(float(kwargs["countdown"]))
        kwargs["countdown"] = 0
        return super().retry(*args, **kwargs)


seen: list[tuple[int, str, str]] = []  # (attempt, call id, key) as the task saw them
carried: list[Any] = []  # the policyd header each execution got


@app.task(bind=True, base=Recording, policyd_target="grants",
          policyd_submission=lambda url, doc_id: (doc_id, url.encode()))
def submit(self: Recording, url: str, doc_id: str) -> str:
    a = pc.current_attempt()
    assert a is not None
    seen.append((a.number, a.call_id, a.idempotency_key))
    carried.append(self.request.get(HEADER))
    resp = requests.post(url, data=doc_id, headers={"Idempotency-Key": a.idempotency_key}, timeout=a.timeout)
    resp.raise_for_status()
    return resp.text


@pytest.fixture(scope="module")
def worker() -> Iterator[None]:
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        yield


@pytest.fixture
def recording(policyd: Daemon, tenant: str, make_client: Any) -> Iterator[pc.Client]:
    c = make_client(policyd, tenant)
    submit.policyd_client = c
    Recording.countdowns = []
    seen.clear()
    carried.clear()
    yield c
    submit.policyd_client = None


def test_retries_with_policyds_countdown(worker: None, recording: pc.Client, policyd: Daemon, tenant: str,
                                         flaky: Flaky) -> None:
    # The reset's outcome is unknown: the write is replayed only to an
    # upstream that deduplicates by key.
    policyd.admin_call("SetPolicy", apb.SetPolicyRequest(
        tenant=tenant, target="grants", policy=types_pb2.Policy(upstream_dedupes_by_key=True)))
    flaky.script(busy(1, retry_after="7"), RESET)
    r = submit.delay(flaky.url + "/applications", "doc-31")
    assert r.get(timeout=60) == "ok after 3"
    cd = Recording.countdowns
    # The hint, then what is left of the fleet-wide cool-down it started
    # (policyd keeps it on the wall clock, and Celery ran the retry at once).
    assert len(cd) == 2 and 7 <= cd[0] <= 7.75 and 5 <= cd[1] <= 7.75, cd
    key = pc.idempotency_key("doc-31", (flaky.url + "/applications").encode())
    assert seen == [(1, r.id, key), (2, r.id, key), (3, r.id, key)]
    assert [s.headers["idempotency-key"] for s in flaky.seen] == [key] * 3
    # The first execution's origin time and each retry's delay travel along.
    assert carried[0] is None and carried[1]["origin"] == carried[2]["origin"]
    assert [c["prev"] for c in carried[1:]] == cd
    assert recording.close() == 0
    audit = policyd.admin_call("QueryAudit", apb.QueryAuditRequest(call_id=r.id, tenant=tenant))
    events = [types_pb2.AuditEvent.Name(x.event) for x in audit.records]
    assert events.count("AUDIT_EVENT_DECISION") == 2 and "AUDIT_EVENT_FINAL" in events, events


def test_a_reset_write_is_dead_lettered_unless_the_upstream_dedupes(worker: None, recording: pc.Client,
                                                                     flaky: Flaky) -> None:
    # The default: the reset leaves the write's outcome unknown, so the
    # retry's claim of the key is refused and the task fails unrun.
    flaky.script(RESET)
    r = submit.delay(flaky.url + "/applications", "doc-36")
    with pytest.raises(CallRefused, match="ended dead_letter") as err:
        r.get(timeout=60)
    assert (err.value.disposition, err.value.reason) == ("dead_letter", "idempotency:unknown")
    assert [n for n, _, _ in seen] == [1] and len(flaky.seen) == 1
    # A success of the key is kept: the same document again is not sent,
    # and the task returns the first one's result.
    flaky.script()
    assert submit.delay(flaky.url + "/a", "doc-37").get(timeout=60) == "ok after 1"
    assert submit.delay(flaky.url + "/a", "doc-37").get(timeout=60) == "ok after 1"
    assert len(flaky.seen) == 1


def test_policyds_stops_fail_the_task(worker: None, recording: pc.Client, flaky: Flaky) -> None:
    # Attempts exhausted: the attempt number travels with each retry.
    flaky.script(busy(1), busy(2), busy(3))
    r = submit.delay(flaky.url + "/a", "doc-32")
    with pytest.raises(requests.HTTPError, match="503"):
        r.get(timeout=60)
    assert [n for n, _, _ in seen] == [1, 2, 3] and len(Recording.countdowns) == 2
    # Terminal: no retry at all.
    flaky.script(Reply(422, body=b"bad field"))
    seen.clear()
    r = submit.delay(flaky.url + "/a", "doc-33")
    with pytest.raises(requests.HTTPError, match="422"):
        r.get(timeout=60)
    assert [n for n, _, _ in seen] == [1] and len(Recording.countdowns) == 2


def test_an_open_breaker_fails_the_task_unrun(worker: None, recording: pc.Client, policyd: Daemon, tenant: str,
                                              flaky: Flaky) -> None:
    policyd.force_breaker(tenant, "grants", types_pb2.BREAKER_STATE_OPEN)
    assert recording.wait_breaker_state("grants", pc.BreakerState.OPEN, timeout=10)
    r = submit.delay(flaky.url + "/a", "doc-34")
    with pytest.raises(CallRefused, match="ended circuit_open") as err:
        r.get(timeout=60)
    assert (err.value.disposition, err.value.reason) == ("circuit_open", "breaker:open")
    assert seen == [] and flaky.seen == []


def test_a_task_without_a_client_names_itself() -> None:
    assert submit.policyd_client is None
    with pytest.raises(TypeError, match="task test_celery.submit has no policyd_client"):
        submit("http://127.0.0.1:9/unused", "doc-35")  # called directly: no worker, no request sent


routes: dict[str, str] = {}  # where each target's attempts go, for fetch_grant


@app.task(bind=True, base=Recording, policyd_target="grants", policyd_idempotent=True)
def fetch_grant(self: Recording, path: str) -> str:
    a = pc.current_attempt()
    assert a is not None
    seen.append((a.number, a.call_id, a.target))
    carried.append(self.request.get(HEADER))
    resp = requests.get(routes[a.target] + path, timeout=a.timeout)
    resp.raise_for_status()
    return resp.text


def test_a_retry_escalated_to_a_fallback_runs_there(worker: None, recording: pc.Client, policyd: Daemon, tenant: str,
                                                    flaky: Flaky) -> None:
    policyd.admin_call("SetPolicy", apb.SetPolicyRequest(tenant=tenant, target="grants", policy=types_pb2.Policy(
        fallback=types_pb2.FallbackSettings(targets=["grants-b"], after_attempts=1))))
    backup = Flaky()
    try:
        routes.update({"grants": flaky.url, "grants-b": backup.url})
        fetch_grant.policyd_client = recording
        flaky.script(busy(1), busy(2), busy(3))
        r = fetch_grant.delay("/g/7")
        assert r.get(timeout=60) == "ok after 1"
        # The second execution (a Celery retry) is told the fallback, which
        # the header carried from the first.
        assert [(n, t) for n, _, t in seen] == [(1, "grants"), (2, "grants-b")]
        assert carried[0] is None and carried[1]["target"] == "grants-b"
        assert ([s.path for s in flaky.seen], [s.path for s in backup.seen]) == (["/g/7"], ["/g/7"])
    finally:
        fetch_grant.policyd_client = None
        backup.close()
