"""The watch's reconnection schedule and close() with policyd unreachable:
real clients on real sockets, with injected sleeps so that nothing waits."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

import policyd_client as pc

from conftest import Daemon, FakeClock, ascript, script, start_daemon

S503 = pc.HTTPStatusError(503)
TRIES = 10


@pytest.fixture
def refused() -> str:
    """A loopback address where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A loopback listener that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"127.0.0.1:{s.getsockname()[1]}"


def _check_schedule(delays: list[float], base: float, cap: float) -> None:
    # Each wait is within [nominal/2, nominal] of its try, nominal doubling
    # from base up to cap; and the waits are jittered, not a fixed ladder
    # every client of the fleet would climb in lockstep.
    assert len(delays) >= TRIES, delays
    for n, d in enumerate(delays[:TRIES]):
        nominal = min(cap, base * 2**n)
        assert nominal / 2 <= d <= nominal, (n, d, nominal)
    assert len(set(delays[:TRIES])) == TRIES, delays
    assert max(delays) <= cap


def test_sync_watch_reconnects_with_jittered_capped_backoff(refused: str) -> None:
    delays: list[float] = []
    enough = threading.Event()

    def reconnect_sleep(d: float, stop: threading.Event) -> None:
        delays.append(d)
        if len(delays) >= TRIES:
            enough.set()
            stop.wait()  # until close

    c = pc.Client(refused, tenant="acme", reconnect_sleep=reconnect_sleep, reconnect_base=0.1, reconnect_cap=2.0)
    assert not c.ready(timeout=0)  # starts the watch; nothing to follow
    assert enough.wait(60), delays
    assert c.close() == 0
    _check_schedule(delays, 0.1, 2.0)


def test_async_watch_reconnects_with_jittered_capped_backoff(refused: str) -> None:
    delays: list[float] = []

    async def main() -> None:
        enough = asyncio.Event()

        async def reconnect_sleep(d: float) -> None:
            delays.append(d)
            if len(delays) >= TRIES:
                enough.set()
                await asyncio.Event().wait()  # until close cancels the watch
            await asyncio.sleep(0)

        async with pc.AsyncClient(refused, tenant="acme", reconnect_sleep=reconnect_sleep, reconnect_base=0.1,
                                  reconnect_cap=2.0) as c:
            await asyncio.wait_for(enough.wait(), 60)
            assert c.breaker_state("geo") is None

    asyncio.run(main())
    _check_schedule(delays, 0.1, 2.0)


def test_reconnect_options_are_checked() -> None:
    with pytest.raises(ValueError, match="reconnect_cap"):
        pc.Client("127.0.0.1:1", tenant="acme", reconnect_base=1.0, reconnect_cap=0.5)
    with pytest.raises(ValueError, match="close_timeout"):
        pc.Client("127.0.0.1:1", tenant="acme", close_timeout=0)
    with pytest.raises(TypeError, match="unknown option"):
        pc.Client("127.0.0.1:1", tenant="acme", decision_timout=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("where", ["refused", "black_hole"])
def test_close_gives_up_and_says_what_it_could_not_send(where: str, request: pytest.FixtureRequest,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    address = request.getfixturevalue(where)
    clock = FakeClock()
    c = pc.Client(address, tenant="acme", sleep=clock.sleep, now=clock.now, watch=False, flush_interval=3600,
                  close_timeout=0.3)
    for i in range(3):  # decided locally; the failure and the success wait to be reported
        res = c.call(pc.Call(target="geo", idempotent=True, call_id=f"c{i}"), script(S503)[0])
        assert res.ok and res.local
    with caplog.at_level(logging.WARNING, logger="policyd_client"):
        lost = c.close()
    assert lost == 6 and c.stats().outcomes_dropped == 6
    assert any("6 outcomes not reported" in r.getMessage() and "c0, c1, c2" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]


def test_async_close_gives_up_and_says_what_it_could_not_send(black_hole: str) -> None:
    clock = FakeClock()

    async def main() -> int:
        c = pc.AsyncClient(black_hole, tenant="acme", sleep=clock.asleep, now=clock.now, watch=False,
                           flush_interval=3600, close_timeout=0.3)
        res = await c.call(pc.Call(target="geo", idempotent=True), ascript(S503)[0])
        assert res.ok and res.local
        return await c.close()

    assert asyncio.run(main()) == 2


def test_watch_resubscribes_after_a_restart_and_starts_its_backoff_over(
    dedicated: Callable[..., Daemon], policyd_binary: Path, tmp_path: Path
) -> None:
    first = dedicated()
    delays: list[float] = []
    restarted: list[Daemon] = []
    back, done = threading.Event(), threading.Event()
    killed_again = threading.Event()

    def reconnect_sleep(d: float, stop: threading.Event) -> None:
        if killed_again.is_set():
            delays.append(d)
            done.set()
            stop.wait()
            return
        delays.append(d)
        if len(delays) == 4:  # policyd comes back on the same address
            restarted.append(start_daemon(policyd_binary, tmp_path / "again", address=first.address))
            back.set()

    c = pc.Client(first.address, tenant="acme", reconnect_sleep=reconnect_sleep, reconnect_base=0.1, reconnect_cap=2.0)
    try:
        assert c.ready(timeout=15)
        first.stop(signal.SIGKILL)
        assert back.wait(60), delays
        second = restarted[0]
        # Resubscribed (once gRPC's own reconnection lets the channel
        # through): the cache follows the new daemon's breakers.
        second.force_breaker("acme", "geo", 2)  # BREAKER_STATE_OPEN
        assert c.wait_breaker_state("geo", pc.BreakerState.OPEN, timeout=30)
        climbed = len(delays)
        killed_again.set()
        second.stop(signal.SIGKILL)
        assert done.wait(60), delays
    finally:
        c.close(timeout=0.2)
        for d in restarted:
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
    # The failed tries climbed the ladder; the complete snapshot after the
    # restart started it over at reconnect_base.
    assert climbed >= 4
    for n, d in enumerate(delays[:climbed]):
        nominal = min(2.0, 0.1 * 2.0 ** min(n, 64))
        assert nominal / 2 <= d <= nominal, (n, d)
    assert 0.05 <= delays[climbed] <= 0.1, delays
