"""The shared vectors' python_http_adapters section (testdata/vectors.json),
run through each HTTP adapter (httpx Transport, httpx AsyncTransport,
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


@pytest.mark.parametrize("v", CASES, ids=[v["name"] for v in CASES])
@pytest.mark.parametrize("adapter", ["httpx", "httpx-async", "requests"])
def test_http_vector(adapter: str, v: dict[str, Any], policyd: Daemon, tenant: str, make_client: Any,
                     clock: FakeClock, flaky: Flaky) -> None:
    events: list[pc.Event] = []
    flaky.script(Reply(v["status"], v["headers"], b"scripted"))
    url = flaky.url + "/v"
    if adapter == "httpx-async":
        async def main() -> int:
            async with pc.AsyncClient(policyd.address, tenant=tenant, sleep=clock.asleep, now=clock.now,
                                      decision_timeout=5.0, on_event=events.append) as c:
                assert await c.ready(timeout=15)
                ext = {"policyd_submission_id": "doc-v"} if v["submission"] else {}
                async with httpx.AsyncClient(transport=AsyncTransport(c)) as http:
                    return (await http.request(v["method"], url, content=BODY, extensions=ext)).status_code

        status = asyncio.run(main())
    else:
        c = make_client(policyd, tenant, on_event=events.append)
        status = (send_httpx if adapter == "httpx" else send_requests)(c, v, url)
    failures = [e.reason for e in events if e.kind in (pc.EventKind.RETRY_SCHEDULED, pc.EventKind.STOPPED)]
    got = (status, len(flaky.seen), failures[0] if failures else "")
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
