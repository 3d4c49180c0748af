"""policyd_client.requests against a flaky upstream on loopback and a real
policyd: retries, Retry-After honoured, bodies replayed (a seekable file
rewound, a generator refused), the final response readable, the
idempotency key stable across attempts, on the fake clock."""

from __future__ import annotations

import io
from typing import Any, Iterator

import pytest
import requests

import policyd_client as pc
from policyd_client.requests import BodyNotReplayable, HTTPAdapter

from conftest import Daemon, FakeClock
from flaky import RESET, Flaky, Reply, assert_retry_delays, busy, flaky  # noqa: F401  (the fixture)


def session(c: pc.Client, **kw: Any) -> requests.Session:
    s = requests.Session()
    s.mount("http://", HTTPAdapter(c, **kw))
    return s


def test_retries_after_the_servers_retry_after(policyd: Daemon, tenant: str, make_client: Any, clock: FakeClock,
                                                flaky: Flaky) -> None:
    flaky.script(busy(1, retry_after="7"), RESET)
    events: list[pc.Event] = []
    with session(make_client(policyd, tenant, on_event=events.append)) as s:
        resp = s.get(flaky.url + "/search", params={"q": "Paris"}, timeout=30)
    assert (resp.status_code, resp.text) == (200, "ok after 3")
    assert [x.path for x in flaky.seen] == ["/search?q=Paris"] * 3
    # The hint, then what is left of the fleet-wide cool-down it started.
    assert_retry_delays(events, clock, (7, 7.75), (0, 7.75))


def test_a_write_with_a_submission_id_is_replayed_with_one_key(policyd: Daemon, tenant: str, make_client: Any,
                                                                flaky: Flaky) -> None:
    flaky.script(busy(1), busy(2))
    body = b'{"applicant": "doc-17"}'
    with session(make_client(policyd, tenant), submission_id=lambda r: r.headers.get("X-Document")) as s:
        resp = s.post(flaky.url + "/applications", data=body, headers={"X-Document": "doc-17"})
        assert (resp.status_code, resp.text) == (200, "ok after 3")
        want = pc.idempotency_key("doc-17", body)
        assert [x.headers.get("idempotency-key") for x in flaky.seen] == [want] * 3
        assert [x.body for x in flaky.seen] == [body] * 3
        assert len({x.port for x in flaky.seen}) == 1  # the 503s' bodies were read: one connection
        # A seekable file is rewound for every attempt.
        flaky.script(busy(1))
        resp = s.put(flaky.url + "/upload", data=io.BytesIO(b"file body"))
    assert resp.status_code == 200 and [x.body for x in flaky.seen] == [b"file body"] * 2


def test_the_ledger_dead_letters_a_reset_write_and_answers_a_succeeded_one(policyd: Daemon, tenant: str,
                                                                            make_client: Any, flaky: Flaky) -> None:
    events: list[pc.Event] = []
    with session(make_client(policyd, tenant, on_event=events.append),
                 submission_id=lambda r: r.headers.get("X-Document")) as s:
        # A reset leaves the write's outcome unknown: not retried (the
        # policy does not say the upstream deduplicates), sent once.
        flaky.script(RESET)
        with pytest.raises(requests.ConnectionError):
            s.post(flaky.url + "/applications", data=b"{}", headers={"X-Document": "doc-20"})
        stopped = [(e.disposition, e.reason) for e in events if e.kind is pc.EventKind.STOPPED]
        assert stopped == [(pc.Disposition.DEAD_LETTER, "idempotency:unknown")] and len(flaky.seen) == 1
        # A succeeded key: the same document again is not sent.
        flaky.script()
        assert s.post(flaky.url + "/applications", data=b"{}", headers={"X-Document": "doc-21"}).status_code == 200
        with pytest.raises(pc.Deduplicated) as err:
            s.post(flaky.url + "/applications", data=b"{}", headers={"X-Document": "doc-21"})
    assert err.value.result.deduplicated and err.value.result.idempotency_key == pc.idempotency_key("doc-21", b"{}")
    assert len(flaky.seen) == 1


def test_the_response_policyd_stops_on_is_returned_readable(policyd: Daemon, tenant: str, make_client: Any,
                                                             flaky: Flaky) -> None:
    with session(make_client(policyd, tenant)) as s:
        flaky.script(busy(1), busy(2), busy(3))
        resp = s.get(flaky.url + "/x")
        assert (resp.status_code, resp.text, len(flaky.seen)) == (503, "busy 3", 3)
        flaky.script(Reply(422, body=b"bad field: name"))
        resp = s.get(flaky.url + "/x", stream=True)
        assert (resp.status_code, resp.raw.read(), len(flaky.seen)) == (422, b"bad field: name", 1)
        flaky.script(busy(1))
        resp = s.post(flaky.url + "/charge", data=b"5 EUR")  # no key: not retried
        assert (resp.status_code, resp.text, len(flaky.seen)) == (503, "busy 1", 1)
        with pytest.raises(requests.HTTPError):
            resp.raise_for_status()


def test_a_generator_body_is_refused_before_any_attempt(policyd: Daemon, tenant: str, make_client: Any,
                                                        flaky: Flaky) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"part"

    with session(make_client(policyd, tenant)) as s:
        with pytest.raises(BodyNotReplayable, match="cannot be sent again"):
            s.put(flaky.url + "/upload", data=chunks())
    assert flaky.seen == []


def test_a_connection_refused_ends_with_the_transport_error(policyd: Daemon, tenant: str, make_client: Any,
                                                            flaky: Flaky, clock: FakeClock) -> None:
    url = flaky.url
    flaky.close()
    with session(make_client(policyd, tenant)) as s:
        with pytest.raises(requests.ConnectionError):
            s.get(url + "/x")
    assert len(clock.waits) == 2  # refused connections are retried: the request never left
