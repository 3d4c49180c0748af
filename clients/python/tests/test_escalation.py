"""Escalation to fallback providers end to end: a real policyd whose policy
names a fallback, two real flaky upstreams on loopback (a primary failing
503, a healthy fallback), and the client, its httpx transports, its
requests adapter and its tenacity policy sending each attempt where policyd
says; then the same chain rule from the client's local copy while policyd
is away, and the refusal of a fallback target the adapter has no host
for. Sync and asyncio alike, on the fake clock."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import httpx
import pytest
import requests
import tenacity

from retrypolicy.v1 import admin_service_pb2 as apb
from retrypolicy.v1 import types_pb2

import policyd_client as pc
from policyd_client.httpx import AsyncTransport, Transport
from policyd_client.requests import HTTPAdapter
from policyd_client.tenacity import Policy

from conftest import Daemon, FakeClock, free_port
from flaky import Flaky, busy, flaky  # noqa: F401  (the fixture)


@pytest.fixture
def fallback() -> Iterator[Flaky]:
    """The fallback provider: a second flaky upstream, healthy unless
    scripted."""
    f = Flaky()
    yield f
    f.close()


def escalate(d: Daemon, tenant: str, *targets: str, after: int = 0, on_open: bool = False) -> None:
    """Sets the policy of (tenant, geo) to escalate to targets."""
    d.admin_call("SetPolicy", apb.SetPolicyRequest(tenant=tenant, target="geo", policy=types_pb2.Policy(
        fallback=types_pb2.FallbackSettings(targets=list(targets), after_attempts=after, on_circuit_open=on_open))))


def moves(events: list[pc.Event]) -> list[tuple[int, str, str]]:
    return [(e.attempt, e.from_target, e.to_target) for e in events if e.kind is pc.EventKind.FALLBACK_TAKEN]


def nowhere() -> str:
    """An address nothing listens on: policyd is away."""
    return f"127.0.0.1:{free_port()}"


# -- policyd escalates -------------------------------------------------------


def test_the_second_attempt_goes_to_the_fallback(policyd: Daemon, tenant: str, make_client: Any, flaky: Flaky,
                                                 fallback: Flaky) -> None:
    escalate(policyd, tenant, "geo-b", after=1)
    flaky.script(busy(1), busy(2), busy(3))
    events: list[pc.Event] = []
    c = make_client(policyd, tenant, on_event=events.append)
    with httpx.Client(transport=Transport(c, target="geo", hosts={"geo-b": fallback.url})) as http:
        resp = http.get(flaky.url + "/search", params={"q": "Paris"}, headers={"X-Trace": "t1"})
    assert (resp.status_code, resp.text) == (200, "ok after 1")
    assert [s.path for s in flaky.seen] == ["/search?q=Paris"]  # attempt 1, on the primary
    sent = fallback.seen  # attempt 2, on the fallback: same path, query and headers
    assert [(s.path, s.headers.get("x-trace"), s.headers.get("host")) for s in sent] == [
        ("/search?q=Paris", "t1", fallback.url.removeprefix("http://"))]
    assert moves(events) == [(2, "geo", "geo-b")]


def test_the_function_is_told_each_attempts_target(policyd: Daemon, tenant: str, make_client: Any) -> None:
    escalate(policyd, tenant, "geo-b", "geo-c", after=1)
    seen: list[tuple[int, str]] = []

    def fn(a: pc.Attempt) -> str:
        seen.append((a.number, a.target))
        if a.target != "geo-c":
            raise pc.HTTPStatusError(503)
        return "ok"

    c = make_client(policyd, tenant)
    res = c.call(pc.Call(target="geo", idempotent=True, call_id="esc-1"), fn)
    assert (res.ok, res.target, seen) == (True, "geo-c", [(1, "geo"), (2, "geo-b"), (3, "geo-c")]), res
    # Each decision and the final outcome reached policyd on its attempt's
    # target: the audit trail has them under the fallback, the primary beside.
    assert c.close() == 0
    audit = policyd.admin_call("QueryAudit", apb.QueryAuditRequest(call_id="esc-1", tenant=tenant))
    got = [(types_pb2.AuditEvent.Name(r.event), r.attempt, r.target, r.primary_target) for r in audit.records]
    assert ("AUDIT_EVENT_DECISION", 1, "geo", "") in got and ("AUDIT_EVENT_DECISION", 2, "geo-b", "geo") in got, got
    assert [g for g in got if g[0] == "AUDIT_EVENT_FINAL"] == [("AUDIT_EVENT_FINAL", 3, "geo-c", "geo")], got



def test_requests_second_attempt_goes_to_the_fallback(policyd: Daemon, tenant: str, make_client: Any, flaky: Flaky,
                                                      fallback: Flaky) -> None:
    escalate(policyd, tenant, "geo-b", after=1)
    flaky.script(busy(1), busy(2), busy(3))
    with requests.Session() as s:
        s.mount("http://", HTTPAdapter(make_client(policyd, tenant), target="geo", hosts={"geo-b": fallback.url + "/v2"}))
        resp = s.post(flaky.url + "/apply?x=1", data=b"doc", headers={"Idempotency-Key": "k-1"})
    assert (resp.status_code, resp.text) == (200, "ok after 1")
    assert [(s.path, s.body) for s in flaky.seen] == [("/apply?x=1", b"doc")]
    # A base URL with a path: its prefix goes before the request's path.
    assert [(s.path, s.body, s.headers.get("idempotency-key")) for s in fallback.seen] == [("/v2/apply?x=1", b"doc", "k-1")]


def test_async_second_attempt_goes_to_the_fallback(policyd: Daemon, tenant: str, clock: FakeClock, flaky: Flaky,
                                                   fallback: Flaky) -> None:
    escalate(policyd, tenant, "geo-b", after=1)
    flaky.script(busy(1), busy(2), busy(3))
    events: list[pc.Event] = []

    async def main() -> None:
        async with pc.AsyncClient(policyd.address, tenant=tenant, sleep=clock.asleep, now=clock.now,
                                  decision_timeout=5.0, on_event=events.append) as c:
            async with httpx.AsyncClient(transport=AsyncTransport(c, target="geo", hosts={"geo-b": fallback.url})) as http:
                resp = await http.get(flaky.url + "/search")
                assert (resp.status_code, resp.text) == (200, "ok after 1")

    asyncio.run(main())
    assert (len(flaky.seen), [s.path for s in fallback.seen]) == (1, ["/search"])
    assert moves(events) == [(2, "geo", "geo-b")]


def test_an_open_primary_sends_the_first_attempt_to_the_fallback(policyd: Daemon, tenant: str, make_client: Any,
                                                                 flaky: Flaky, fallback: Flaky) -> None:
    escalate(policyd, tenant, "geo-b", on_open=True)
    policyd.force_breaker(tenant, "geo", types_pb2.BREAKER_STATE_OPEN)
    events: list[pc.Event] = []
    # Without the breaker cache every attempt asks Admit, which routes it.
    c = make_client(policyd, tenant, watch=False, on_event=events.append)
    with httpx.Client(transport=Transport(c, target="geo", hosts={"geo-b": fallback.url})) as http:
        resp = http.get(flaky.url + "/search")
    assert (resp.status_code, len(flaky.seen), len(fallback.seen)) == (200, 0, 1)
    assert moves(events) == [(1, "geo", "geo-b")] and c.stats().admit_rpcs == 1


def test_an_open_primary_in_the_cache_routes_by_the_local_copy(policyd: Daemon, tenant: str, make_client: Any,
                                                              flaky: Flaky, fallback: Flaky) -> None:
    escalate(policyd, tenant, "geo-b", on_open=True)
    c = make_client(policyd, tenant, fallbacks={"geo": pc.Fallback(["geo-b"], on_circuit_open=True)})
    policyd.force_breaker(tenant, "geo", types_pb2.BREAKER_STATE_OPEN)
    assert c.wait_breaker_state("geo", pc.BreakerState.OPEN, timeout=15)
    with httpx.Client(transport=Transport(c, target="geo", hosts={"geo-b": fallback.url})) as http:
        resp = http.get(flaky.url + "/search")
    assert (resp.status_code, len(flaky.seen), len(fallback.seen)) == (200, 0, 1)
    st = c.stats()
    assert (st.fast_fails, st.fallbacks) == (0, 1)  # routed from the cache, not refused


def test_async_open_primary_sends_the_first_attempt_to_the_fallback(policyd: Daemon, tenant: str, clock: FakeClock,
                                                                    flaky: Flaky, fallback: Flaky) -> None:
    escalate(policyd, tenant, "geo-b", on_open=True)
    policyd.force_breaker(tenant, "geo", types_pb2.BREAKER_STATE_OPEN)

    async def main() -> None:
        async with pc.AsyncClient(policyd.address, tenant=tenant, sleep=clock.asleep, now=clock.now,
                                  decision_timeout=5.0, watch=False) as c:
            async with httpx.AsyncClient(transport=AsyncTransport(c, target="geo", hosts={"geo-b": fallback.url})) as http:
                resp = await http.get(flaky.url + "/search")
                assert resp.status_code == 200

    asyncio.run(main())
    assert (len(flaky.seen), len(fallback.seen)) == (0, 1)


def test_tenacity_names_the_next_attempts_target(policyd: Daemon, tenant: str, make_client: Any, clock: FakeClock,
                                                 flaky: Flaky, fallback: Flaky) -> None:
    escalate(policyd, tenant, "geo-b", after=1)
    flaky.script(busy(1), busy(2), busy(3))
    urls = {"geo": flaky.url, "geo-b": fallback.url}
    policy = Policy(make_client(policyd, tenant), target="geo", idempotent=True)
    next_targets: list[str] = []

    def before_sleep(rs: tenacity.RetryCallState) -> None:
        next_targets.append(str(policy.target(rs)))
        policy.before_sleep(rs)

    @tenacity.retry(**{**policy.strategies(), "before_sleep": before_sleep}, sleep=lambda s: clock.advance(s))
    def get(path: str) -> str:
        a = pc.current_attempt()
        assert a is not None
        resp = httpx.get(urls[a.target] + path)
        if resp.status_code >= 400:
            raise pc.HTTPStatusError(resp.status_code, resp.headers)
        return resp.text

    assert get("/x") == "ok after 1"
    assert (next_targets, len(flaky.seen), len(fallback.seen)) == (["geo-b"], 1, 1)


# -- the local copy, while policyd is away -----------------------------------


def test_away_the_local_copy_escalates_by_the_same_rule(make_client: Any, flaky: Flaky, fallback: Flaky) -> None:
    c = make_client(nowhere(), "acme", watch=False, decision_timeout=0.2,
                    fallbacks={"geo": pc.Fallback(["geo-b"], after_attempts=1)})
    flaky.script(busy(1), busy(2), busy(3))
    with httpx.Client(transport=Transport(c, target="geo", hosts={"geo-b": "127.0.0.1:%d" % int(fallback.url.rsplit(":", 1)[1])})) as http:
        resp = http.get(flaky.url + "/search?q=1")
    assert (resp.status_code, resp.text, len(flaky.seen)) == (200, "ok after 1", 1)
    assert [s.path for s in fallback.seen] == ["/search?q=1"]  # a bare host[:port]: scheme and path kept
    assert c.stats().local_decisions == 1


def test_async_away_the_local_copy_escalates(clock: FakeClock, flaky: Flaky, fallback: Flaky) -> None:
    flaky.script(busy(1), busy(2), busy(3))

    async def main() -> None:
        async with pc.AsyncClient(nowhere(), tenant="acme", sleep=clock.asleep, now=clock.now, watch=False,
                                  decision_timeout=0.2, fallbacks={"geo": pc.Fallback(["geo-b"], after_attempts=1)}) as c:
            async with httpx.AsyncClient(transport=AsyncTransport(c, target="geo", hosts={"geo-b": fallback.url})) as http:
                resp = await http.get(flaky.url + "/a")
                assert (resp.status_code, resp.text) == (200, "ok after 1")
            await c.close(timeout=0.2)

    asyncio.run(main())
    assert (len(flaky.seen), len(fallback.seen)) == (1, 1)


def test_a_fallback_without_a_host_is_refused_not_sent_to_the_primary(make_client: Any, flaky: Flaky,
                                                                      fallback: Flaky) -> None:
    events: list[pc.Event] = []
    c = make_client(nowhere(), "acme", watch=False, decision_timeout=0.2, on_event=events.append,
                    fallbacks={"geo": pc.Fallback(["geo-b", "geo-c"], after_attempts=1)})
    flaky.script(busy(1), busy(2), busy(3))
    with httpx.Client(transport=Transport(c, target="geo")) as http:
        with pytest.raises(pc.UnmappedTarget, match="'geo-b'") as err:
            http.get(flaky.url + "/x")
    assert (err.value.target, err.value.primary) == ("geo-b", "geo")
    assert (len(flaky.seen), len(fallback.seen)) == (1, 0)  # attempt 2 was sent nowhere
    stopped = [(e.disposition, e.reason) for e in events if e.kind is pc.EventKind.STOPPED]
    assert stopped == [(pc.Disposition.FAILED_TERMINAL, "unclassified:UnmappedTarget")]
    with requests.Session() as s:
        s.mount("http://", HTTPAdapter(c, target="geo", hosts={"geo-c": fallback.url}))
        flaky.script(busy(1))
        with pytest.raises(pc.UnmappedTarget):
            s.get(flaky.url + "/x")
    assert (len(flaky.seen), len(fallback.seen)) == (1, 0)


@pytest.mark.parametrize("hosts, message", [
    ({"geo-b": ""}, "hosts must map non-empty target names"),
    ({"geo-b": "ftp://geo-b"}, r"hosts\['geo-b'\] = 'ftp://geo-b': a base URL is http\(s\)://host"),
    ({"geo-b": "https://"}, r"a base URL is http\(s\)://host"),
    ({"geo-b": "geo-b.example/v2"}, r"hosts\['geo-b'\] = 'geo-b.example/v2': give host\[:port\]"),
    ({"geo-b": "https://geo-b.example?x=1"}, "a base URL is"),
])
def test_bad_hosts_are_refused_naming_the_target(hosts: dict[str, str], message: str) -> None:
    c = pc.Client(nowhere(), tenant="acme", watch=False)
    with pytest.raises(ValueError, match=message):
        Transport(c, hosts=hosts)
    with pytest.raises(ValueError, match=message):
        HTTPAdapter(c, hosts=hosts)
    c.close()
