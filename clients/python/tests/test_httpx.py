"""policyd_client.httpx against a flaky upstream on loopback and a real
policyd: retries, Retry-After honoured, bodies replayed (streams refused),
the final response readable, the idempotency key stable across attempts;
the sync Transport and the AsyncTransport alike, on the fake clock."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Iterator

import httpx
import pytest

from retrypolicy.v1 import admin_service_pb2 as apb
from retrypolicy.v1 import types_pb2

import policyd_client as pc
from policyd_client.httpx import AsyncTransport, BodyNotReplayable, Transport

from conftest import Daemon, FakeClock
from flaky import RESET, Flaky, Reply, assert_retry_delays, busy, flaky  # noqa: F401  (the fixture)


def sync_http(c: pc.Client, **kw: Any) -> httpx.Client:
    return httpx.Client(transport=Transport(c, **kw))


def dedupes_by_key(d: Daemon, tenant: str, target: str = "") -> None:
    """Sets the policy of tenant (and target) to say the upstream
    deduplicates by key: a keyed write whose outcome was lost is retried."""
    d.admin_call("SetPolicy", apb.SetPolicyRequest(
        tenant=tenant, target=target, policy=types_pb2.Policy(upstream_dedupes_by_key=True)))


def test_retries_after_the_servers_retry_after(policyd: Daemon, tenant: str, make_client: Any, clock: FakeClock,
                                                flaky: Flaky) -> None:
    flaky.script(busy(1, retry_after="7"))
    events: list[pc.Event] = []
    with sync_http(make_client(policyd, tenant, on_event=events.append)) as http:
        resp = http.get(flaky.url + "/search", params={"q": "Paris"})
    assert (resp.status_code, resp.text) == (200, "ok after 2")
    assert len(flaky.seen) == 2 and flaky.seen[0].path == flaky.seen[1].path == "/search?q=Paris"
    assert flaky.seen[0].port == flaky.seen[1].port  # the 503's small body was read: its connection reused
    # policyd never retries earlier than the server asked (spread above it).
    assert_retry_delays(events, clock, (7, 7.75))


def test_a_write_with_a_submission_id_is_replayed_with_one_key(policyd: Daemon, tenant: str, make_client: Any,
                                                                flaky: Flaky) -> None:
    dedupes_by_key(policyd, tenant)  # the reset's outcome is unknown: replayed only to an upstream that dedupes
    flaky.script(busy(1), RESET)
    body = b'{"applicant": "doc-17"}'
    with sync_http(make_client(policyd, tenant)) as http:
        resp = http.post(flaky.url + "/applications", content=body,
                         extensions={"policyd_submission_id": "doc-17"})
    assert (resp.status_code, resp.text) == (200, "ok after 3")
    want = pc.idempotency_key("doc-17", body)
    assert [s.headers.get("idempotency-key") for s in flaky.seen] == [want] * 3
    assert [s.body for s in flaky.seen] == [body] * 3


def test_a_reset_write_is_dead_lettered_unless_the_upstream_dedupes(policyd: Daemon, tenant: str, make_client: Any,
                                                                     flaky: Flaky) -> None:
    # The default: a reset leaves unknown whether the write was applied, so
    # the ledger refuses the retry and the upstream sees the request once.
    flaky.script(RESET)
    events: list[pc.Event] = []
    with sync_http(make_client(policyd, tenant, on_event=events.append)) as http:
        with pytest.raises(httpx.TransportError):
            http.post(flaky.url + "/applications", content=b"{}", extensions={"policyd_submission_id": "doc-18"})
    stopped = [(e.disposition, e.reason) for e in events if e.kind is pc.EventKind.STOPPED]
    assert stopped == [(pc.Disposition.DEAD_LETTER, "idempotency:unknown")], stopped
    assert len(flaky.seen) == 1


def test_the_callers_key_and_header_name_are_kept(policyd: Daemon, tenant: str, make_client: Any,
                                                  flaky: Flaky) -> None:
    flaky.script(busy(1))
    with sync_http(make_client(policyd, tenant), key_header="X-Request-Key", target="grants") as http:
        resp = http.post(flaky.url + "/a", json={"a": 1}, headers={"X-Request-Key": "mine-1"})
    assert resp.status_code == 200
    assert [s.headers.get("x-request-key") for s in flaky.seen] == ["mine-1"] * 2
    assert all("idempotency-key" not in s.headers for s in flaky.seen)


def test_the_response_policyd_stops_on_is_returned_readable(policyd: Daemon, tenant: str, make_client: Any,
                                                             flaky: Flaky) -> None:
    flaky.script(busy(1), busy(2), busy(3))
    with sync_http(make_client(policyd, tenant)) as http:
        resp = http.get(flaky.url + "/x")
        assert (resp.status_code, resp.text, len(flaky.seen)) == (503, "busy 3", 3)  # attempts exhausted
        flaky.script(Reply(422, body=b"bad field: name"))
        resp = http.put(flaky.url + "/x", content=b"{}")
        assert (resp.status_code, resp.text, len(flaky.seen)) == (422, "bad field: name", 1)  # terminal
        with http.stream("GET", flaky.url + "/x") as streamed:  # a streamed response too
            assert streamed.read() == b"ok after 2"
        with pytest.raises(httpx.HTTPStatusError):
            flaky.script(Reply(404))
            http.get(flaky.url + "/gone").raise_for_status()


def test_a_post_without_a_key_is_not_retried(policyd: Daemon, tenant: str, make_client: Any, flaky: Flaky) -> None:
    flaky.script(busy(1))
    events: list[pc.Event] = []
    with sync_http(make_client(policyd, tenant, on_event=events.append)) as http:
        resp = http.post(flaky.url + "/charge", content=b"5 EUR")
    assert (resp.status_code, resp.text, len(flaky.seen)) == (503, "busy 1", 1)
    stopped = [e for e in events if e.kind is pc.EventKind.STOPPED]
    assert [(e.stop_reason, e.reason) for e in stopped] == [(pc.StopReason.NOT_IDEMPOTENT, "unsafe:not_idempotent")]
    assert "idempotency-key" not in flaky.seen[0].headers


def test_a_streaming_body_is_refused_before_any_attempt(policyd: Daemon, tenant: str, make_client: Any,
                                                        flaky: Flaky) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"part 1"
        yield b"part 2"

    with sync_http(make_client(policyd, tenant)) as http:
        with pytest.raises(BodyNotReplayable, match="cannot be sent again"):
            http.post(flaky.url + "/upload", content=chunks())
        assert flaky.seen == []
        # A multipart body is read into memory once and replayed.
        flaky.script(busy(1))
        resp = http.put(flaky.url + "/upload", files={"f": ("a.txt", b"hello")})
    assert resp.status_code == 200 and len(flaky.seen) == 2
    assert flaky.seen[0].body == flaky.seen[1].body and b"hello" in flaky.seen[0].body


def test_a_connection_refused_ends_with_the_transport_error(policyd: Daemon, tenant: str, make_client: Any,
                                                            flaky: Flaky) -> None:
    url = flaky.url
    flaky.close()
    with sync_http(make_client(policyd, tenant)) as http:
        with pytest.raises(httpx.ConnectError):
            http.get(url + "/x")


def test_a_call_the_breaker_refuses_raises_retry_error(policyd: Daemon, tenant: str, make_client: Any,
                                                       flaky: Flaky) -> None:
    from retrypolicy.v1 import types_pb2

    c = make_client(policyd, tenant)
    policyd.force_breaker(tenant, "geo", types_pb2.BREAKER_STATE_OPEN)
    assert c.wait_breaker_state("geo", pc.BreakerState.OPEN, timeout=10)
    with sync_http(c, target="geo") as http:
        with pytest.raises(pc.RetryError) as err:
            http.get(flaky.url + "/x")
    assert err.value.result.disposition is pc.Disposition.CIRCUIT_OPEN and flaky.seen == []


# -- asyncio ------------------------------------------------------------------


def aclient(d: Daemon, tenant: str, clock: FakeClock, **kw: Any) -> pc.AsyncClient:
    return pc.AsyncClient(d.address, tenant=tenant, sleep=clock.asleep, now=clock.now, decision_timeout=5.0, **kw)


def test_async_retries_replays_and_keeps_one_key(policyd: Daemon, tenant: str, clock: FakeClock, flaky: Flaky) -> None:
    body = b'{"applicant": "doc-9"}'
    events: list[pc.Event] = []
    dedupes_by_key(policyd, tenant, "127.0.0.1:" + flaky.url.rsplit(":", 1)[1])

    async def main() -> None:
        async with aclient(policyd, tenant, clock, on_event=events.append) as c:
            assert await c.ready(timeout=15)
            async with httpx.AsyncClient(transport=AsyncTransport(c)) as http:
                flaky.script(busy(1, retry_after="3"), RESET)
                resp = await http.post(flaky.url + "/applications", content=body,
                                       extensions={"policyd_submission_id": "doc-9"})
                assert (resp.status_code, resp.text) == (200, "ok after 3")
                want = pc.idempotency_key("doc-9", body)
                assert [s.headers.get("idempotency-key") for s in flaky.seen] == [want] * 3
                assert [s.body for s in flaky.seen] == [body] * 3
                assert clock.waits[0] >= 3

                # Without upstream_dedupes_by_key (another target), a reset
                # write is dead-lettered: the upstream saw it once.
                flaky.script(RESET)
                async with httpx.AsyncClient(transport=AsyncTransport(c, target="grants")) as other:
                    with pytest.raises(httpx.TransportError):
                        await other.post(flaky.url + "/applications", content=body,
                                         extensions={"policyd_submission_id": "doc-10"})
                assert len(flaky.seen) == 1
                stopped = [(e.target, e.reason) for e in events if e.kind is pc.EventKind.STOPPED]
                assert stopped == [("grants", "idempotency:unknown")], stopped

                flaky.script(busy(1), busy(2), busy(3))
                resp = await http.get(flaky.url + "/x")
                assert (resp.status_code, resp.text, len(flaky.seen)) == (503, "busy 3", 3)

                async def chunks() -> AsyncIterator[bytes]:
                    yield b"part"

                flaky.script()
                with pytest.raises(BodyNotReplayable):
                    await http.post(flaky.url + "/upload", content=chunks())
                assert flaky.seen == []

    asyncio.run(main())


# -- without policyd, timeouts, other processes ------------------------------


def test_with_policyd_away_the_local_policy_honours_retry_after(tenant: str, make_client: Any, clock: FakeClock,
                                                               flaky: Flaky) -> None:
    from conftest import free_port

    c = make_client(f"127.0.0.1:{free_port()}", tenant, watch=False, decision_timeout=0.2)
    flaky.script(busy(1, retry_after="5"))
    with sync_http(c) as http:
        resp = http.get(flaky.url + "/x")
    assert (resp.status_code, resp.text) == (200, "ok after 2")
    assert len(clock.waits) == 1 and 5 <= clock.waits[0] <= 5.5 and c.stats().local_decisions == 1


def test_an_upstream_that_never_answers_times_out_each_attempt(policyd: Daemon, tenant: str, make_client: Any) -> None:
    import socket

    with socket.socket() as hole:  # accepts connections (the backlog), never answers
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        url = "http://127.0.0.1:%d/x" % hole.getsockname()[1]
        events: list[pc.Event] = []
        with httpx.Client(transport=Transport(make_client(policyd, tenant, on_event=events.append)),
                          timeout=0.05) as http:
            with pytest.raises(httpx.ReadTimeout):
                http.get(url)
    assert [e.reason for e in events if e.kind is pc.EventKind.RETRY_SCHEDULED] == ["transport:timeout"] * 2
    assert [e.stop_reason for e in events if e.kind is pc.EventKind.STOPPED] == [pc.StopReason.ATTEMPTS_EXHAUSTED]


SEND_FROM_ANOTHER_PROCESS = """
import sys, httpx, policyd_client as pc
from policyd_client.httpx import Transport
c = pc.Client(sys.argv[1], tenant=sys.argv[2], watch=False)
with httpx.Client(transport=Transport(c)) as http:
    http.post(sys.argv[3], content=b"same body", extensions={"policyd_submission_id": "doc-77"})
c.close()
"""


def test_the_key_is_the_same_in_another_process(policyd: Daemon, tenant: str, make_client: Any, flaky: Flaky) -> None:
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", SEND_FROM_ANOTHER_PROCESS, policyd.address, tenant, flaky.url + "/a"],
                   check=True, timeout=60)
    # The other process's write succeeded: its key is SUCCEEDED in the
    # ledger, so this one is not sent and raises Deduplicated.
    with sync_http(make_client(policyd, tenant)) as http:
        with pytest.raises(pc.Deduplicated) as err:
            http.post(flaky.url + "/a", content=b"same body", extensions={"policyd_submission_id": "doc-77"})
    key = pc.idempotency_key("doc-77", b"same body")
    res = err.value.result
    assert (res.ok, res.deduplicated, res.attempts, res.idempotency_key) == (True, True, 0, key), res
    assert err.value.result_ref == "" and isinstance(err.value, pc.RetryError)
    assert [s.headers.get("idempotency-key") for s in flaky.seen] == [key]


def test_policyds_attempt_timeout_caps_the_clients(tenant: str, make_client: Any) -> None:
    import socket

    from conftest import free_port

    # policyd away: the local policy's attempt timeout (the client's) holds.
    c = make_client(f"127.0.0.1:{free_port()}", tenant, watch=False, decision_timeout=0.2, attempt_timeout=0.05)
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        with httpx.Client(transport=Transport(c), timeout=30) as http:
            with pytest.raises(httpx.ReadTimeout) as err:
                http.get("http://127.0.0.1:%d/x" % hole.getsockname()[1])
    assert err.value.request.extensions["timeout"] == {"connect": 0.05, "read": 0.05, "write": 0.05, "pool": 0.05}
    assert c.stats().attempts == 3
