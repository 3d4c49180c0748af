"""The asyncio client against a real policyd: many concurrent tasks on one
event loop, the per-attempt timeout, cancellation, the breaker cache, the
decorator and the local fallback."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Awaitable, Callable, TypeVar

import grpc
import grpc.aio
import pytest

from retrypolicy.v1 import types_pb2

import policyd_client as pc

from conftest import Daemon, FakeClock, ascript

S503 = pc.HTTPStatusError(503)
T = TypeVar("T")


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(coro_fn())  # type: ignore[arg-type]


def aclient(d: Daemon | str, tenant: str, clock: FakeClock, **kw: Any) -> pc.AsyncClient:
    kw.setdefault("decision_timeout", 5.0)
    address = d if isinstance(d, str) else d.address
    return pc.AsyncClient(address, tenant=tenant, sleep=clock.asleep, now=clock.now, **kw)


class InFlight(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Counts the unary RPCs to policyd in flight at once."""

    def __init__(self) -> None:
        self.now = 0
        self.max = 0
        self.total = 0

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.now += 1
        self.total += 1
        self.max = max(self.max, self.now)
        try:
            call = await continuation(details, request)
            return await call
        finally:
            self.now -= 1


def test_300_concurrent_tasks_without_blocking_the_loop(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    policyd.set_budget(tenant, 10000)
    run_id = "async-" + tenant
    policyd.open_run(run_id, tenant, pool=1000)
    n = 300

    async def main() -> None:
        rpcs = InFlight()
        channel = grpc.aio.insecure_channel(policyd.address, interceptors=[rpcs])
        async with pc.AsyncClient(channel=channel, tenant=tenant, sleep=clock.asleep, now=clock.now,
                                  decision_timeout=10.0, batch_size=100) as c:
            assert await c.ready(timeout=15)
            ticks = 0
            stop = asyncio.Event()

            async def heartbeat() -> None:
                # Counts the loop's turns while an RPC to policyd is pending:
                # a client that blocked the loop on its RPCs would leave none.
                nonlocal ticks
                while not stop.is_set():
                    if rpcs.now > 0:
                        ticks += 1
                    await asyncio.sleep(0)

            async def worker(i: int) -> pc.Result[str]:
                fn, _ = ascript(S503)  # one NextDelay each
                return await c.call(pc.Call(target=f"t{i}", idempotent=True, run_id=run_id, call_id=f"c{i}"), fn)

            # One call learns the run's cut-off (its Admit); from then on
            # the CLOSED breakers cost no Admit.
            warm, _ = ascript()
            assert (await c.call(pc.Call(target="t0", idempotent=True, run_id=run_id, call_id="warm"), warm)).ok
            hb = asyncio.create_task(heartbeat())
            results = await asyncio.gather(*(worker(i) for i in range(n)))
            stop.set()
            await hb
            assert all(r.ok and r.attempts == 2 and not r.local for r in results), [r for r in results if not r.ok][:3]
            assert c.stats().admit_rpcs == 1
            assert rpcs.total >= n  # the NextDelays, and outcome batches
            assert rpcs.max > 1, "never more than one RPC in flight: the loop was blocked"
            assert ticks >= 50, ticks
        assert c.stats().outcomes_dropped == 0
        await channel.close()

    run(main)
    r = policyd.run(run_id)
    assert (r.ledger.succeeded, r.retries_spent) == (n + 1, n)


@pytest.mark.parametrize(
    "errors, idempotent, want",
    [
        ([S503, S503], True, (pc.Disposition.SUCCEEDED, None, "transient:503", 3)),
        ([pc.HTTPStatusError(422)], True, (pc.Disposition.FAILED_TERMINAL, pc.StopReason.TERMINAL, "terminal:422", 1)),
        ([KeyError("k")], True, (pc.Disposition.FAILED_TERMINAL, pc.StopReason.TERMINAL, "unclassified:KeyError", 1)),
        ([S503] * 3, True, (pc.Disposition.DEAD_LETTER, pc.StopReason.ATTEMPTS_EXHAUSTED, "transient:503", 3)),
        ([S503], False, (pc.Disposition.DEAD_LETTER, pc.StopReason.NOT_IDEMPOTENT, "unsafe:not_idempotent", 1)),
    ],
)
def test_decision_paths(policyd: Daemon, tenant: str, clock: FakeClock, errors: list[Exception], idempotent: bool, want: Any) -> None:
    async def main() -> pc.Result[str]:
        async with aclient(policyd, tenant, clock) as c:
            fn, seen = ascript(*errors)
            res = await c.call(pc.Call(target="geo", idempotent=idempotent), fn)
            assert len(seen) == res.attempts
            return res

    res = run(main)
    assert (res.disposition, res.stop_reason, res.reason, res.attempts) == want and not res.local


def test_attempt_timeout_is_enforced(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    async def main() -> pc.Result[str]:
        async with aclient(policyd, tenant, clock, attempt_timeout=0.05) as c:
            never = asyncio.Event()

            async def fn(a: pc.Attempt) -> str:
                if a.number == 1:
                    await never.wait()  # hangs: the attempt timeout cancels it
                return "ok"

            return await c.call(pc.Call(target="geo", idempotent=True), fn)

    res = run(main)
    assert res.ok and res.attempts == 2 and res.reason == "transport:timeout"


def test_cancelling_the_task_reports_a_dead_letter_deadline(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    run_id = "cancel-" + tenant
    policyd.open_run(run_id, tenant, pool=10)

    async def main() -> None:
        async with aclient(policyd, tenant, clock) as c:
            started = asyncio.Event()

            async def fn(a: pc.Attempt) -> str:
                started.set()
                await asyncio.Event().wait()
                return "never"

            task = asyncio.create_task(c.call(pc.Call(target="geo", idempotent=True, run_id=run_id), fn))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(main)
    assert policyd.run(run_id).ledger.dead_letter_deadline == 1


def test_open_breaker_fails_fast(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    async def main() -> None:
        async with aclient(policyd, tenant, clock) as c:
            assert await c.ready(timeout=15)
            policyd.force_breaker(tenant, "geo", types_pb2.BREAKER_STATE_OPEN)
            assert await c.wait_breaker_state("geo", pc.BreakerState.OPEN, timeout=15)
            fn, seen = ascript()
            res = await c.call(pc.Call(target="geo", idempotent=True), fn)
            assert (res.disposition, res.attempts, res.reason, seen) == (pc.Disposition.CIRCUIT_OPEN, 0, "breaker:open", [])
            assert c.stats().admit_rpcs == 0 and c.stats().fast_fails == 1

    run(main)


def test_decorator(policyd: Daemon, tenant: str, clock: FakeClock) -> None:
    async def main() -> None:
        async with aclient(policyd, tenant, clock) as c:
            @c.retry(target="geo", idempotent=True)
            async def geocode(q: str) -> str:
                a = pc.current_attempt()
                assert a is not None
                if a.number == 1:
                    raise TimeoutError()
                return q.upper()

            assert await geocode("paris") == "PARIS"

            @c.retry(target="geo", idempotent=True)
            async def gone(q: str) -> str:
                raise pc.ValidationError("no such place")

            with pytest.raises(pc.RetryError) as exc:
                await gone("atlantis")
            assert exc.value.result.reason == "local:validation"

    run(main)


def test_unreachable_policyd_decides_locally(clock: FakeClock) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{s.getsockname()[1]}"

    async def main() -> None:
        c = aclient(nowhere, "acme", clock, decision_timeout=0.25)
        try:
            results = await asyncio.gather(*(c.call(pc.Call(target="geo", idempotent=True), ascript(S503)[0]) for _ in range(10)))
            assert all(r.ok and r.local for r in results)
        finally:
            assert await c.close(timeout=0.2) > 0  # nowhere to report them

    run(main)
