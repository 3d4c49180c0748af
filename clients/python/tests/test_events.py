"""The event hooks of both clients against a real policyd: the same
scenario gives the same events from the sync and the asyncio client."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import pytest

from retrypolicy.v1 import types_pb2

import policyd_client as pc

from conftest import Daemon, FakeClock, ascript, script

S503 = pc.HTTPStatusError(503)
K = pc.EventKind


class Recorder:
    """Collects events; thread safe (breaker changes come from the watch)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[pc.Event] = []

    def __call__(self, e: pc.Event) -> None:
        with self._lock:
            self.events.append(e)

    def calls(self) -> list[tuple[str, int, str]]:
        """The call's events as (kind, attempt, stop reason or reason)."""
        with self._lock:
            return [(e.kind.value, e.attempt, str(e.stop_reason or e.reason)) for e in self.events
                    if e.kind is not K.BREAKER_CHANGED]


WANT_EXHAUSTED = [
    ("attempt_started", 1, ""), ("retry_scheduled", 1, "transient:503"),
    ("attempt_started", 2, ""), ("retry_scheduled", 2, "transient:503"),
    ("attempt_started", 3, ""), ("stopped", 3, "ATTEMPTS_EXHAUSTED"),
]


def test_sync_events(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    rec = Recorder()
    with pc.Client(policyd.address, tenant=tenant, sleep=clock.sleep, now=clock.now, decision_timeout=5,
                   on_event=rec) as c:
        res = c.call(pc.Call(target="geo", idempotent=True, call_id="ev-1"), script(S503, S503, S503)[0])
        assert res.stop_reason is pc.StopReason.ATTEMPTS_EXHAUSTED
        assert rec.calls() == WANT_EXHAUSTED
        # The delays the hook is told are the waits the client made.
        assert [e.delay for e in rec.events if e.kind is K.RETRY_SCHEDULED] == clock.waits
        assert {e.call_id for e in rec.events} == {"ev-1"}
        stopped = rec.events[-1]
        assert (stopped.disposition, stopped.local) == (pc.Disposition.DEAD_LETTER, False)
        # A success emits no stop.
        rec.events.clear()
        assert c.call(pc.Call(target="geo", idempotent=True), script()[0]).ok
        assert rec.calls() == [("attempt_started", 1, "")]
        # A breaker forced OPEN reaches the hook through the watch.
        assert c.ready(timeout=15)
        policyd.force_breaker(tenant, "geo", types_pb2.BREAKER_STATE_OPEN)
        assert c.wait_breaker_state("geo", pc.BreakerState.OPEN, timeout=15)
        changed = [e for e in rec.events if e.kind is K.BREAKER_CHANGED]
        assert [(e.target, e.breaker_state) for e in changed][-1:] == [("geo", pc.BreakerState.OPEN)]


def test_async_events_match_the_sync_ones(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    rec = Recorder()

    async def main() -> None:
        async with pc.AsyncClient(policyd.address, tenant=tenant, sleep=clock.asleep, now=clock.now,
                                  decision_timeout=5, on_event=rec) as c:
            res = await c.call(pc.Call(target="geo", idempotent=True), ascript(S503, S503, S503)[0])
            assert res.stop_reason is pc.StopReason.ATTEMPTS_EXHAUSTED

    asyncio.run(main())
    assert rec.calls() == WANT_EXHAUSTED


def test_local_decisions_are_events_and_a_raising_hook_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{s.getsockname()[1]}"
    seen: list[pc.Event] = []

    def hook(e: pc.Event) -> None:
        seen.append(e)
        raise RuntimeError("a broken hook")

    clock = FakeClock()
    c = pc.Client(nowhere, tenant="acme", sleep=clock.sleep, now=clock.now, watch=False, on_event=hook,
                  close_timeout=0.2)
    res = c.call(pc.Call(target="geo", idempotent=True), script(S503)[0])
    c.close()
    assert res.ok and res.local
    kinds: list[Any] = [e.kind for e in seen]
    assert kinds == [K.ATTEMPT_STARTED, K.LOCAL_DECISION, K.RETRY_SCHEDULED, K.ATTEMPT_STARTED], kinds
    assert seen[1].reason == "transient:503" and seen[2].local
    assert any("on_event hook raised" in r.getMessage() for r in caplog.records)
