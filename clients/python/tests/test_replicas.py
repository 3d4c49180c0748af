"""Clients of several policyd replicas, real daemon processes each on its
own state file: calls spread over the replicas and go on when one is
killed, none decided locally (a decision past the decision timeout would
be), and the breaker watch resumes on another replica from its snapshot."""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any, Callable

import grpc
import pytest

from retrypolicy.v1 import admin_service_pb2 as apb
from retrypolicy.v1 import retry_policy_service_pb2 as rpb
from retrypolicy.v1 import types_pb2

import policyd_client as pc
from policyd_client._core import BreakerCache, WatchSession

from conftest import Daemon, FakeClock, script

S503 = pc.HTTPStatusError(503)
OPEN = types_pb2.BREAKER_STATE_OPEN


def targets_decided(d: Daemon, tenant: str) -> set[str]:
    """The targets whose breakers d knows for tenant: those it decided."""
    resp = d.admin_call("ListBreakers", apb.ListBreakersRequest(tenant=tenant, page_size=1000))
    return {b.key.target for b in resp.breakers}


def test_list_of_addresses_is_checked() -> None:
    for bad, why in [([], "empty"), (["policyd:7070"], "ip:port"), (["127.0.0.1:1", "[::1]:2"], "all IPv4 or all IPv6")]:
        with pytest.raises(ValueError, match=why):
            pc.Client(bad, tenant="acme")


def test_calls_go_on_when_a_replica_is_killed(dedicated: Callable[..., Daemon], tenant: str, clock: FakeClock) -> None:
    ds = [dedicated() for _ in range(3)]
    c = pc.Client([d.address for d in ds], tenant=tenant, sleep=clock.sleep, now=clock.now, decision_timeout=2.0)
    try:
        assert c.ready(timeout=15)
        workers, per_phase = 4, 10
        lock = threading.Condition()
        done = [0]
        deciding = [False] * workers  # between the first attempt's 503 and the second attempt
        killed = threading.Event()
        results: list[tuple[str, bool, pc.Result[Any]]] = []

        def work(w: int) -> None:
            def fn(a: pc.Attempt) -> str:
                with lock:
                    deciding[w] = a.number == 1
                    lock.notify_all()
                if a.number == 1:
                    raise S503
                return "ok"

            after = 0
            i = 0
            while after < per_phase:
                # A target per call: the 503s must not open a breaker.
                target, late = f"geo-{w}-{i}", killed.is_set()
                res = c.call(pc.Call(target=target, idempotent=True), fn)
                with lock:
                    results.append((target, late, res))
                    done[0] += 1
                after += late
                i += 1

        threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        with lock:
            assert lock.wait_for(lambda: done[0] >= 2 * workers, timeout=30)
        # Stopped, replica 0 holds the decisions sent to it; once every
        # worker waits for a decision, SIGKILL cuts those in flight.
        ds[0].proc.send_signal(signal.SIGSTOP)
        with lock:
            assert lock.wait_for(lambda: all(deciding), timeout=30)
        ds[0].proc.kill()
        ds[0].proc.wait()
        killed.set()
        for t in threads:
            t.join(60)

        bad = [(tg, r.disposition, r.attempts, r.local) for tg, _, r in results if not r.ok or r.attempts != 2 or r.local]
        assert not bad, f"calls not decided by policyd: {bad}"
        assert c.stats().local_decisions == 0
        late = {tg for tg, after_kill, _ in results if after_kill}
        assert len(late) == workers * per_phase
        survivors = [targets_decided(d, tenant) & late for d in ds[1:]]
        assert survivors[0] | survivors[1] == late
        assert survivors[0] and survivors[1], "the calls after the kill were not spread over both survivors"
    finally:
        c.close()


def test_async_calls_go_on_when_a_replica_is_killed(dedicated: Callable[..., Daemon], tenant: str,
                                                     clock: FakeClock) -> None:
    ds = [dedicated() for _ in range(3)]
    n = 30

    async def main() -> list[pc.Result[Any]]:
        async with pc.AsyncClient([d.address for d in ds], tenant=tenant, sleep=clock.asleep, now=clock.now,
                                  decision_timeout=2.0) as c:
            assert await c.ready(timeout=15)
            moved = asyncio.Condition()
            deciding: set[str] = set()
            done = [0]

            async def one(target: str) -> pc.Result[Any]:
                async def fn(a: pc.Attempt) -> str:
                    async with moved:
                        (deciding.add if a.number == 1 else deciding.discard)(target)
                        moved.notify_all()
                    if a.number == 1:
                        raise S503
                    return "ok"

                res = await c.call(pc.Call(target=target, idempotent=True), fn)
                async with moved:
                    done[0] += 1
                    moved.notify_all()
                return res

            # Stopped, replica 1 holds what is sent to it: decisions, or the
            # outcome batch every decision waits for (the one reporter task
            # may be the one stuck); once every other call is done, SIGKILL
            # cuts what is in flight.
            ds[1].proc.send_signal(signal.SIGSTOP)
            first = asyncio.gather(*(one(f"early-{i}") for i in range(n)))
            async with moved:
                await asyncio.wait_for(moved.wait_for(lambda: deciding and done[0] + len(deciding) == n), 30)
            ds[1].proc.kill()
            ds[1].proc.wait()
            results = list(await first)
            results += await asyncio.gather(*(one(f"late-{i}") for i in range(n)))
            assert c.stats().local_decisions == 0
            return results

    results = asyncio.run(main())
    bad = [(r.disposition, r.attempts, r.local) for r in results if not r.ok or r.attempts != 2 or r.local]
    assert not bad, f"calls not decided by policyd: {bad}"


def test_watch_resumes_on_another_replica_from_its_snapshot(dedicated: Callable[..., Daemon], tenant: str,
                                                            clock: FakeClock) -> None:
    ds = [dedicated() for _ in range(3)]
    for i, d in enumerate(ds):
        d.force_breaker(tenant, f"only-on-{i}", OPEN)
    c = pc.Client([d.address for d in ds], tenant=tenant, sleep=clock.sleep, now=clock.now, decision_timeout=2.0)
    try:
        assert c.ready(timeout=15)
        watched = [i for i in range(3) if c.breaker_state(f"only-on-{i}") == pc.BreakerState.OPEN]
        assert len(watched) == 1, watched
        w = watched[0]
        ds[w].proc.kill()
        ds[w].proc.wait()
        survivors = [i for i in range(3) if i != w]
        for i in survivors:
            ds[i].force_breaker(tenant, "forced-after-kill", OPEN)
        # Known from the next replica only: by its snapshot, or as a change
        # right after it.
        assert c.wait_breaker_state("forced-after-kill", pc.BreakerState.OPEN, timeout=15)
        states = {i: c.breaker_state(f"only-on-{i}") for i in range(3)}
        assert states[w] == pc.BreakerState.CLOSED, f"the stopped replica's breaker stayed in the cache: {states}"
        assert {states[i] for i in survivors} == {pc.BreakerState.CLOSED, pc.BreakerState.OPEN}, states
        admits = c.stats().admit_rpcs
        fn, seen = script()
        res = c.call(pc.Call(target="forced-after-kill", idempotent=True), fn)
        assert res.disposition == pc.Disposition.CIRCUIT_OPEN and not seen
        assert c.stats().admit_rpcs == admits
    finally:
        c.close()


def _breaker_msg(target: str, token: str) -> Any:
    return rpb.WatchBreakersResponse(
        breaker=types_pb2.Breaker(key=types_pb2.BreakerKey(tenant="acme", target=target), state=OPEN),
        resume_token=token)


def test_watch_session_resumes_from_the_last_token() -> None:
    """The sans-I/O watch session: a stream's request carries the resume
    token of the last message applied; a resumed stream keeps the states
    held and applies the changes after it; a stream that was not resumed
    replaces them with its snapshot; a refused token is dropped."""
    cache = BreakerCache("acme")
    s = WatchSession(cache)
    assert s.request("acme").resume_token == ""
    s.feed(_breaker_msg("a", ""))  # the snapshot
    s.feed(rpb.WatchBreakersResponse(snapshot_complete=True, resume_token="t1"))
    s.feed(_breaker_msg("b", "t2"))
    assert cache.resume_token == "t2"
    cache.down()

    s = WatchSession(cache)
    assert s.request("acme").resume_token == "t2"
    s.feed(rpb.WatchBreakersResponse(snapshot_complete=True, resumed=True, resume_token="t2"))
    s.feed(_breaker_msg("c", "t3"))
    assert {t: cache.state(t) for t in "abc"} == {t: pc.BreakerState.OPEN for t in "abc"}
    assert cache.resume_token == "t3"
    cache.down()

    s = WatchSession(cache)
    s.feed(_breaker_msg("d", ""))
    s.feed(rpb.WatchBreakersResponse(snapshot_complete=True, resumed=False, resume_token="u1"))
    assert [t for t in "abcd" if cache.state(t) == pc.BreakerState.OPEN] == ["d"]
    s.failed(grpc.StatusCode.INVALID_ARGUMENT)
    assert WatchSession(cache).request("acme").resume_token == ""
