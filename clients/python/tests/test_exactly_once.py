"""Exactly once from the Python clients' side, against real policyd
processes: a call that uses the idempotency ledger makes no attempt
without a claim once the ledger has a reason to refuse one (an attempt's
outcome was lost, or another worker holds the key), nor at all with
``require_claim``; and a claim a replica cannot answer goes to another.
Each case runs through the sync client and through the asyncio one (the
same loop, driven twice)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import pytest

from retrypolicy.v1 import retry_policy_service_pb2 as rpb
from retrypolicy.v1 import retry_policy_service_pb2_grpc as rpb_grpc
from retrypolicy.v1 import types_pb2

import policyd_client as pc

from conftest import Daemon, FakeClock, free_port

DRIVERS = ["sync", "async"]


class Upstream:
    """A fake upstream that applies every write it is sent; its first
    answer is lost (a 504 after applying it) when ``lose_first``."""

    def __init__(self, lose_first: bool = False) -> None:
        self.writes: list[int] = []
        self.lose_first = lose_first

    def write(self, a: pc.Attempt) -> str:
        self.writes.append(a.number)
        if self.lose_first and len(self.writes) == 1:
            raise pc.HTTPStatusError(504)
        return "rec-1"


def call(driver: str, address: "str | list[str]", tenant: str, clock: FakeClock, c: pc.Call, up: Upstream,
         on_sleep: Callable[[], object] = lambda: None, **kw: Any) -> pc.Result[Any]:
    """Runs one call through a client of the driver; on_sleep runs at the
    start of every wait the client makes."""
    kw.setdefault("decision_timeout", 2.0)
    kw.setdefault("watch", False)

    def sleep(d: float, cancel: Any) -> None:
        on_sleep()
        clock.sleep(d, cancel)

    if driver == "sync":
        sc = pc.Client(address, tenant=tenant, sleep=sleep, now=clock.now, **kw)
        try:
            return sc.call(c, up.write)
        finally:
            sc.close(timeout=0.2)

    async def asleep(d: float) -> None:
        on_sleep()
        await clock.asleep(d)

    async def main() -> pc.Result[Any]:
        ac = pc.AsyncClient(address, tenant=tenant, sleep=asleep, now=clock.now, **kw)
        try:
            async def write(a: pc.Attempt) -> str:
                return up.write(a)

            return await ac.call(c, write)
        finally:
            await ac.close(timeout=0.2)

    return asyncio.run(main())


def dead_letter(res: pc.Result[Any]) -> tuple[Any, Any, str]:
    return res.disposition, res.stop_reason, res.reason


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_lost_outcome_is_not_sent_again_without_a_claim_while_policyd_is_away(
        driver: str, tenant: str, clock: FakeClock) -> None:
    # No policyd on the port: the attempt goes without the ledger (the
    # availability-first fallback), its 504 leaves unknown whether the
    # upstream applied it, and nothing can say a second write is safe.
    up = Upstream(lose_first=True)
    res = call(driver, f"127.0.0.1:{free_port()}", tenant, clock, pc.Call(target="grants", idempotency_key="doc-1"), up)
    assert up.writes == [1], f"upstream written {len(up.writes)} times, want once: a write was sent without a claim"
    assert dead_letter(res) == (pc.Disposition.DEAD_LETTER, pc.StopReason.NOT_IDEMPOTENT, "idempotency:unknown"), res


@pytest.mark.parametrize("held", [False, True], ids=["lost outcome", "key held by another worker"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_no_unclaimed_attempt_once_policyd_is_gone_before_the_next_claim(
        driver: str, held: bool, dedicated: Callable[..., Daemon], tenant: str, clock: FakeClock) -> None:
    # policyd answers the first claim, then is SIGKILLed at the client's
    # first wait: after it recorded the lost outcome and said RETRY, or
    # after it said another worker holds the key (IN_FLIGHT). The next
    # claim cannot be made, and the call is dead-lettered instead of
    # writing without one.
    d = dedicated()
    if held:
        other = rpb_grpc.RetryPolicyServiceStub(d.channel).ClaimKey(rpb.ClaimKeyRequest(
            call=types_pb2.CallRef(tenant=tenant, target="grants", call_id="other-worker", idempotency_key="doc-1"),
            attempt=1), timeout=10)
        assert other.state == types_pb2.KEY_STATE_NEW, other
    up = Upstream(lose_first=True)
    res = call(driver, d.address, tenant, clock, pc.Call(target="grants", idempotency_key="doc-1", call_id="doc-1"), up,
               on_sleep=lambda: d.stop(signal.SIGKILL))
    want_writes, want_reason = ([], "idempotency:in_flight") if held else ([1], "idempotency:unknown")
    assert up.writes == want_writes, f"upstream written at attempts {up.writes}, want {want_writes}"
    assert dead_letter(res) == (pc.Disposition.DEAD_LETTER, pc.StopReason.NOT_IDEMPOTENT, want_reason), res
    assert clock.waits, "the client never waited: policyd was not stopped where the case says"


@pytest.mark.parametrize("require", [False, True], ids=["default", "require_claim"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_require_claim(driver: str, require: bool, tenant: str, clock: FakeClock) -> None:
    # policyd away: by default the write goes on without the ledger; with
    # require_claim the call is dead-lettered without calling the upstream.
    up = Upstream()
    res = call(driver, f"127.0.0.1:{free_port()}", tenant, clock, pc.Call(target="grants", idempotency_key="doc-1"), up,
               require_claim=require)
    if require:
        assert up.writes == [], up.writes
        assert dead_letter(res) == (pc.Disposition.DEAD_LETTER, pc.StopReason.NOT_IDEMPOTENT, "idempotency:unavailable"), res
    else:
        assert up.writes == [1] and res.ok, res



@pytest.fixture
def paused_redis(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server on a free loopback port, without persistence; the
    test may SIGSTOP it. Ready once it says so on its log (no polling);
    continued and stopped at the end."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/test installs it)")
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    for line in proc.stdout:
        if b"Ready to accept connections" in line:
            break
    else:
        raise RuntimeError(f"redis-server exited {proc.wait()} before it was ready")
    try:
        yield f"127.0.0.1:{port}", proc
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_claim_a_replica_cannot_answer_goes_to_another(
        driver: str, dedicated: Callable[..., Daemon], paused_redis: tuple[str, subprocess.Popen[bytes]],
        tenant: str, clock: FakeClock) -> None:
    # Two replicas: one on a Redis that is then stopped (SIGSTOP), which
    # answers ClaimKey and CompleteKey UNAVAILABLE ("the store is
    # unavailable") while its health stays SERVING, and one on its own
    # bbolt file. Calls spread over both; each claim and completion the
    # first cannot answer is sent again to the second, so every write is
    # made and completed under a claim there, instead of the client going
    # without the ledger.
    redis_addr, redis_proc = paused_redis
    stalled = dedicated("--store", f"redis://{redis_addr}", "--store-timeout", "50ms")
    healthy = dedicated()
    redis_proc.send_signal(signal.SIGSTOP)
    keys = [f"doc-{i}" for i in range(6)]
    replicas = [stalled.address, healthy.address]
    results = [call(driver, replicas, tenant, clock, pc.Call(target="grants", idempotency_key=k, call_id=k), Upstream())
               for k in keys]
    assert all(r.ok and not r.local for r in results), [(r.call_id, r.disposition, r.reason, r.local) for r in results]
    stub = rpb_grpc.RetryPolicyServiceStub(healthy.channel)
    states: dict[str, str] = {}
    for k in keys:
        try:
            got = stub.GetKey(rpb.GetKeyRequest(tenant=tenant, idempotency_key=k), timeout=10)
            states[k] = types_pb2.KeyState.Name(got.record.state)
        except grpc.RpcError as e:
            states[k] = e.code().name
    assert set(states.values()) == {"KEY_STATE_SUCCEEDED"}, (
        f"the healthy replica's records: {states}; want each key written and completed under a claim")
