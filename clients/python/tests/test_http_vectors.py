"""The shared vectors' python_http_adapters and http_responses sections
(testdata/vectors.json), run through each HTTP adapter (httpx Transport, httpx AsyncTransport,
requests HTTPAdapter) against a loopback upstream and a real policyd on the
fake clock: how each response is classified, whether it is retried, how
long the first wait is, and which response comes back."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import requests

import policyd_client as pc
from policyd_client.httpx import AsyncTransport, Transport
from policyd_client.requests import HTTPAdapter

from conftest import Daemon, FakeClock, load_vectors
from flaky import Flaky, Reply, flaky  # noqa: F401  (the fixture)

CASES = load_vectors()["python_http_adapters"]["cases"]
BODY = b'{"doc": 1}'


def send_httpx(c: pc.Client, v: dict[str, Any], url: str) -> int:
    ext = {"policyd_submission_id": "doc-v"} if v["submission"] else {}
    with httpx.Client(transport=Transport(c)) as http:
        return http.request(v["method"], url, content=BODY, extensions=ext).status_code


def send_requests(c: pc.Client, v: dict[str, Any], url: str) -> int:
    with requests.Session() as s:
        s.mount("http://", HTTPAdapter(c, submission_id=lambda r: "doc-v" if v["submission"] else None))
        return s.request(v["method"], url, data=BODY, allow_redirects=False).status_code


def send(adapter: str, v: dict[str, Any], url: str, policyd: Daemon, tenant: str, make_client: Any,
         clock: FakeClock, events: list[pc.Event]) -> int:
    """Sends v's request through the adapter; returns the final status."""
    if adapter == "httpx-async":
        async def main() -> int:
            async with pc.AsyncClient(policyd.address, tenant=tenant, sleep=clock.asleep, now=clock.now,
                                      decision_timeout=5.0, on_event=events.append) as c:
                assert await c.ready(timeout=15)
                ext = {"policyd_submission_id": "doc-v"} if v["submission"] else {}
                async with httpx.AsyncClient(transport=AsyncTransport(c)) as http:
                    return (await http.request(v["method"], url, content=BODY, extensions=ext)).status_code

        return asyncio.run(main())
    c = make_client(policyd, tenant, on_event=events.append)
    return (send_httpx if adapter == "httpx" else send_requests)(c, v, url)


def first_reason(events: list[pc.Event]) -> str:
    failures = [e.reason for e in events if e.kind in (pc.EventKind.RETRY_SCHEDULED, pc.EventKind.STOPPED)]
    return failures[0] if failures else ""


ADAPTERS = ["httpx", "httpx-async", "requests"]


@pytest.mark.parametrize("v", CASES, ids=[v["name"] for v in CASES])
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_http_vector(adapter: str, v: dict[str, Any], policyd: Daemon, tenant: str, make_client: Any,
                     clock: FakeClock, flaky: Flaky) -> None:
    events: list[pc.Event] = []
    flaky.script(Reply(v["status"], v["headers"], b"scripted"))
    status = send(adapter, v, flaky.url + "/v", policyd, tenant, make_client, clock, events)
    got = (status, len(flaky.seen), first_reason(events))
    assert got == (v["final_status"], v["attempts"], v["reason"]), f"got {got}, want {v}"
    if v["wait"] is None:
        assert clock.waits == [], clock.waits
    else:
        # The first wait is the decision's. A hint also starts a fleet-wide
        # cool-down on policyd's wall clock, which the fake clock lags by
        # the test's own run time: what is left of it may be waited too.
        lo, hi = v["wait"]
        assert clock.waits and lo <= clock.waits[0] <= hi, f"got waits {clock.waits}, want the first in {v['wait']}"
        assert all(w <= hi for w in clock.waits[1:]), clock.waits  # never more than the hint
    keys = {s.headers.get("idempotency-key") for s in flaky.seen}
    assert keys == ({pc.idempotency_key("doc-v", BODY)} if v["submission"] else {None})


RESPONSES = load_vectors()["http_responses"]


@pytest.mark.parametrize("v", RESPONSES, ids=[v["name"] for v in RESPONSES])
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_http_response_vector(adapter: str, v: dict[str, Any], policyd: Daemon, tenant: str, make_client: Any,
                              clock: FakeClock, flaky: Flaky) -> None:
    # An idempotent GET answered with the vector's response, then 200: the
    # adapter retries it when retryable and not do_not_retry, waiting at
    # least hint_seconds (spread above it by max(10 %, 250 ms); FULL jitter
    # under 0.5 s without a hint).
    assert v["idempotent"]
    events: list[pc.Event] = []
    flaky.script(Reply(v["status"], v["headers"], b"scripted"))
    req = {"method": "GET", "submission": False}
    status = send(adapter, req, flaky.url + "/r", policyd, tenant, make_client, clock, events)
    retried = v["retryable"] and not v["do_not_retry"]
    got = (status, len(flaky.seen), first_reason(events))
    want = (200, 2, v["reason"]) if retried else (v["status"], 1, v["reason"])
    assert got == want, f"got {got}, want {want} for {v}"
    if retried:
        hint = float(v["hint_seconds"])
        hi = max(hint + max(hint / 10, 0.25), 0.5) if hint > 0 else 0.5
        assert clock.waits and hint <= clock.waits[0] <= hi, f"got waits {clock.waits}, want the first in [{hint}, {hi}]"
    else:
        assert clock.waits == [], clock.waits
