"""A fleet-wide ceiling holds while policyd is silent, in both drivers,
against a real policyd process stopped with SIGSTOP (its connections stay
open; nothing on them is answered).

A target with a concurrency ceiling of 2 has both leases held by two
attempts in progress when policyd stops. The calls that come while it is
silent make no attempt without a lease: they wait, ask Admit again, and end
dead letters (DEADLINE, ``flow:unavailable``) when the deadline leaves no
room, so the upstream never sees more than 2 requests at once. A target
without a ceiling keeps the local fallback. Once policyd runs again their
reports reach it. (Before the fix the silent calls were admitted locally:
the upstream saw 3 and more at once.)

The clients' clock is the real one (policyd's clock agrees with it, which
the dead letters' reports are checked against); their sleep records the
wait and returns at once, so only the real decision timeouts of the
unanswered Admits move time on.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any, Callable

from retrypolicy.v1 import admin_service_pb2 as apb
from retrypolicy.v1 import types_pb2

import policyd_client as pc

from conftest import Daemon

CEILING = 2
ATTEMPT_TIMEOUT = 1.0
SILENT_CALLS = 4


def _signal(d: Daemon, sig: int) -> None:
    """Sends sig to the daemon and, for SIGSTOP and SIGCONT, returns once
    the kernel shows it stopped (or running again): a signal is delivered
    asynchronously, and a request sent right after kill(2) could still be
    answered by a daemon not yet stopped. Without /proc it returns at once."""
    d.proc.send_signal(sig)
    if sig not in (signal.SIGSTOP, signal.SIGCONT):
        return
    deadline = time.monotonic() + 10
    while True:
        try:
            with open(f"/proc/{d.proc.pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return
        state = stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3]
        if (state == b"T") == (sig == signal.SIGSTOP):
            return
        assert time.monotonic() < deadline, f"the daemon's state is {state!r} after {sig}"
        time.sleep(0)


class Upstream:
    """A fake upstream that counts the requests inside it at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.calls = 0

    def enter(self) -> None:
        with self._lock:
            self.inside += 1
            self.calls += 1
            self.most = max(self.most, self.inside)

    def leave(self) -> None:
        with self._lock:
            self.inside -= 1


def _set_ceiling(d: Daemon, tenant: str) -> None:
    d.admin_call("SetPolicy", apb.SetPolicyRequest(tenant=tenant, target="portal", policy=types_pb2.Policy(
        flow=types_pb2.FlowSettings(max_in_flight=CEILING),
        breaker=types_pb2.BreakerSettings(consecutive_failures=10000))))


def _options() -> dict[str, Any]:
    return dict(decision_timeout=0.05, retry_unreachable_after=0.1, attempt_timeout=ATTEMPT_TIMEOUT, watch=False,
                now=time.time)


def _check_silent(results: list[pc.Result[Any]], up: Upstream, waits: list[float]) -> None:
    for i, res in enumerate(results):
        assert (res.disposition, res.stop_reason, res.reason, res.attempts) == (
            pc.Disposition.DEAD_LETTER, pc.StopReason.DEADLINE, "flow:unavailable", 0), f"silent call {i}: {res}"
    assert up.most <= CEILING, f"the upstream saw {up.most} requests at once while policyd was silent; the ceiling is {CEILING}"
    # Each call has 0.6 s of room and its Admits time out after 0.1 s, so
    # it waits and asks again; a loaded machine may leave one call no room
    # to, not all of them.
    assert len(waits) >= 1, "no wait before asking Admit again"


def _check_reported(d: Daemon, stats: pc.Stats, call_id: str) -> None:
    assert stats.outcomes_dropped == 0, f"{stats.outcomes_dropped} outcomes dropped; want every report taken"
    records = d.admin_call("QueryAudit", apb.QueryAuditRequest(call_id=call_id)).records
    assert any(r.disposition == types_pb2.DISPOSITION_DEAD_LETTER for r in records), \
        f"audit of {call_id}: {list(records)}; want its DEAD_LETTER reported once policyd answered"


def test_sync_ceiling_holds_while_policyd_is_silent(dedicated: Callable[..., Daemon], tenant: str) -> None:
    d = dedicated()
    _set_ceiling(d, tenant)
    waits: list[float] = []
    c = pc.Client(d.address, tenant=tenant, sleep=lambda s, cancel: waits.append(s), **_options())
    up = Upstream()
    inside = threading.Semaphore(0)
    release = threading.Event()
    held: list[pc.Result[Any]] = []

    def hold(a: pc.Attempt) -> str:
        up.enter()
        inside.release()
        release.wait(30)
        up.leave()
        return "ok"

    holders = [threading.Thread(target=lambda i=i: held.append(c.call(
        pc.Call(target="portal", submission_id=f"held-{i}", idempotent=True), hold))) for i in range(CEILING)]
    for t in holders:
        t.start()
    for _ in range(CEILING):
        assert inside.acquire(timeout=30)
    try:
        _signal(d, signal.SIGSTOP)
        free = c.call(pc.Call(target="elsewhere", submission_id="free", idempotent=True), lambda a: "ok")
        assert free.ok and free.attempts == 1, f"a target without a ceiling while policyd is silent: {free}"
        results: list[pc.Result[Any]] = [None] * SILENT_CALLS  # type: ignore[list-item]

        def silent(i: int) -> None:
            def fn(a: pc.Attempt) -> str:
                up.enter()
                up.leave()
                return "ok"
            results[i] = c.call(pc.Call(target="portal", submission_id=f"silent-{i}", idempotent=True,
                                        deadline=time.time() + ATTEMPT_TIMEOUT + 0.6), fn)

        workers = [threading.Thread(target=silent, args=(i,)) for i in range(SILENT_CALLS)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(30)
        _check_silent(results, up, waits)
    finally:
        _signal(d, signal.SIGCONT)
        release.set()
        for t in holders:
            t.join(30)
    assert all(r.ok for r in held), held
    assert c.close(timeout=10) == 0, "outcomes left unreported once policyd answered again"
    _check_reported(d, c.stats(), "silent-0")


def test_async_ceiling_holds_while_policyd_is_silent(dedicated: Callable[..., Daemon], tenant: str) -> None:
    d = dedicated()
    _set_ceiling(d, tenant)
    waits: list[float] = []

    async def asleep(s: float) -> None:
        waits.append(s)
        await asyncio.sleep(0)

    async def main() -> tuple[list[pc.Result[Any]], pc.Stats]:
        c = pc.AsyncClient(d.address, tenant=tenant, sleep=asleep, **_options())
        up = Upstream()
        release = asyncio.Event()
        entered = asyncio.Queue[None]()

        async def hold(a: pc.Attempt) -> str:
            up.enter()
            entered.put_nowait(None)
            await release.wait()
            up.leave()
            return "ok"

        holders = [asyncio.create_task(c.call(pc.Call(target="portal", submission_id=f"held-{i}", idempotent=True), hold))
                   for i in range(CEILING)]
        for _ in range(CEILING):
            await asyncio.wait_for(entered.get(), 30)
        try:
            _signal(d, signal.SIGSTOP)

            async def ok(a: pc.Attempt) -> str:
                return "ok"
            free = await c.call(pc.Call(target="elsewhere", submission_id="free", idempotent=True), ok)
            assert free.ok and free.attempts == 1, f"a target without a ceiling while policyd is silent: {free}"

            async def through(a: pc.Attempt) -> str:
                up.enter()
                await asyncio.sleep(0)
                up.leave()
                return "ok"
            results = await asyncio.gather(*(c.call(pc.Call(
                target="portal", submission_id=f"silent-{i}", idempotent=True,
                deadline=time.time() + ATTEMPT_TIMEOUT + 0.6), through) for i in range(SILENT_CALLS)))
            _check_silent(list(results), up, waits)
        finally:
            _signal(d, signal.SIGCONT)
            release.set()
        held = await asyncio.gather(*holders)
        assert all(r.ok for r in held), held
        assert await c.close(timeout=10) == 0, "outcomes left unreported once policyd answered again"
        return list(results), c.stats()

    _, stats = asyncio.run(main())
    _check_reported(d, stats, "silent-0")
