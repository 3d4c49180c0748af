"""The fallback chains policyd tells the client: the WatchBreakers snapshot
(fallback_chains, other_targets_fallback) and every ReportOutcome answer
(fallback_chains of the batch's primaries). A fresh client whose primary is
known OPEN asks Admit (one RPC) when the primary's chain escalates on an
open circuit to a target not known OPEN, and fails fast otherwise; while
policyd is away, local admission and local decisions route each attempt
along the chain on the breakers last seen. Against a real policyd process
(answering, then stopped), sync and asyncio, and by hand through the
sans-I/O loop; the shared vectors (testdata/vectors.json, fallback_chains)
run in both."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional

import pytest

from retrypolicy.v1 import admin_service_pb2 as apb
from retrypolicy.v1 import retry_policy_service_pb2 as rpb
from retrypolicy.v1 import types_pb2

import policyd_client as pc
from policyd_client import _loop
from policyd_client._core import PendingOutcome, WatchSession

from conftest import Daemon, FakeClock, load_vectors
from test_loop_targets import DOWN, S503, Upstream, breaker, core, drive

OPEN = types_pb2.BREAKER_STATE_OPEN


def settings_pb(fb: dict[str, Any]) -> types_pb2.FallbackSettings:
    return types_pb2.FallbackSettings(targets=fb["targets"], after_attempts=fb.get("after_attempts", 0),
                                      on_circuit_open=fb.get("on_circuit_open", False))


def set_chain(d: Daemon, tenant: str, primary: str, fb: types_pb2.FallbackSettings) -> None:
    """Stores the policy of (tenant, primary): three attempts, escalating by fb."""
    d.admin_call("SetPolicy", apb.SetPolicyRequest(tenant=tenant, target=primary, policy=types_pb2.Policy(
        max_attempts=3, fallback=fb)))


def recording(fail: Optional[Exception] = None) -> tuple[Callable[[pc.Attempt], str], list[str]]:
    """A function that records each attempt's target and raises fail (None:
    succeeds)."""
    targets: list[str] = []

    def fn(a: pc.Attempt) -> str:
        targets.append(a.target)
        if fail is not None:
            raise fail
        return "ok on " + a.target

    return fn, targets


def end(res: pc.Result[Any]) -> str:
    return f"{res.disposition.value}/{res.stop_reason.name if res.stop_reason is not None else ''}"


def told(c: Any, chains: dict[str, types_pb2.FallbackSettings], *breakers: rpb.WatchBreakersResponse,
         other: Optional[types_pb2.FallbackSettings] = None) -> None:
    """Feeds the core a WatchBreakers snapshot of breakers that tells
    chains (each target named by a policy, without a ceiling) and other
    (the tenant's chain), as the stream would."""
    s = WatchSession(c.cache, c.chains)
    for m in breakers:
        s.feed(m)
    msg = rpb.WatchBreakersResponse(snapshot_complete=True, uncontrolled_targets=list(chains),
                                    fallback_chains=[rpb.FallbackChain(target=t, fallback=fb) for t, fb in chains.items()])
    if other is not None:
        msg.other_targets_fallback.CopyFrom(other)
    s.feed(msg)


ON_OPEN = types_pb2.FallbackSettings(targets=["geo-b"], on_circuit_open=True)


# -- the sans-I/O loop, driven by hand ---------------------------------------


def test_a_told_chain_makes_an_open_primary_worth_one_admit(clock: FakeClock) -> None:
    c = core(clock)
    told(c, {"geo": ON_OPEN, "plain": types_pb2.FallbackSettings()}, breaker("geo", OPEN, forced=True),
         breaker("plain", OPEN, forced=True), breaker("other", OPEN, forced=True),
         other=types_pb2.FallbackSettings(targets=["z"], after_attempts=1))
    up = Upstream(fail=lambda a: None, admit=lambda r: rpb.AdmitResponse(admitted=True, target="geo-b"))
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert (res.ok, res.target, [a.attempt.target for a in up.of(_loop.Invoke)]) == (True, "geo-b", ["geo-b"])
    assert [(r.request.attempt, r.request.attempt_target) for r in up.of(_loop.Admit)] == [(1, "")]
    # A target a policy names without a fallback, and one under the
    # tenant's chain that does not escalate on an open circuit: refused from
    # the cache, without an RPC.
    for target in ("plain", "other"):
        up = Upstream(fail=lambda a: None)
        res = drive(_loop.run(c, c.begin(pc.Call(target=target, idempotent=True), up)), up)
        assert (res.disposition, res.attempts, up.of(_loop.Admit)) == (pc.Disposition.CIRCUIT_OPEN, 0, []), target


def test_an_open_chain_with_every_target_open_fails_fast(clock: FakeClock) -> None:
    c = core(clock)
    told(c, {"geo": ON_OPEN}, breaker("geo", OPEN, forced=True), breaker("geo-b", OPEN, forced=True))
    up = Upstream(fail=lambda a: None)
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert (res.disposition, res.reason, res.attempts, up.of(_loop.Admit)) == (
        pc.Disposition.CIRCUIT_OPEN, "breaker:open", 0, [])
    assert c.stats().fast_fails == 1


def test_the_local_copy_wins_over_the_told_chain(clock: FakeClock) -> None:
    # The caller's copy says geo does not escalate on an open circuit:
    # refused from the cache, although policyd told an on-open chain.
    c = core(clock, fallbacks={"geo": pc.Fallback(["geo-c"], after_attempts=1)})
    told(c, {"geo": ON_OPEN}, breaker("geo", OPEN, forced=True))
    up = Upstream(fail=lambda a: None)
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert (res.disposition, up.of(_loop.Admit)) == (pc.Disposition.CIRCUIT_OPEN, [])
    # While policyd is away, its rule places the attempts, not the told one.
    c = core(clock, fallbacks={"geo": pc.Fallback(["geo-c"], after_attempts=1)})
    told(c, {"geo": types_pb2.FallbackSettings(targets=["geo-b"], after_attempts=1)})
    c.cache.down()
    up = Upstream(fail=lambda a: S503, admit=lambda r: DOWN)
    res = drive(_loop.run(c, c.begin(pc.Call(target="geo", idempotent=True), up)), up)
    assert [a.attempt.target for a in up.of(_loop.Invoke)] == ["geo", "geo-c", "geo-c"], res


def test_away_the_tenants_chain_routes_the_targets_no_policy_names(clock: FakeClock) -> None:
    c = core(clock)
    told(c, {"plain": types_pb2.FallbackSettings()}, breaker("plain", OPEN, forced=True),
         other=types_pb2.FallbackSettings(targets=["z"], after_attempts=1))
    c.cache.down()
    for target, want in (("unnamed", ["unnamed", "z", "z"]), ("plain", ["plain", "plain", "plain"])):
        # plain, named without a fallback, has no chain: its calls stay on
        # it (the cache, down, refuses nothing), as the Go client's do.
        up = Upstream(fail=lambda a: S503, admit=lambda r: DOWN)
        res = drive(_loop.run(c, c.begin(pc.Call(target=target, idempotent=True), up)), up)
        assert ([a.attempt.target for a in up.of(_loop.Invoke)], res.local) == (want, True), target


def test_a_report_tells_the_chains_of_the_batchs_primaries(clock: FakeClock) -> None:
    c = core(clock)
    told(c, {"b": ON_OPEN})
    info = c.begin(pc.Call(target="a", idempotent=True), lambda a: None).info
    batch = [PendingOutcome(info, 1, success=True), PendingOutcome(info, 2, success=True),
             PendingOutcome(c.begin(pc.Call(target="b", idempotent=True), lambda a: None).info, 1, success=True),
             PendingOutcome(c.begin(pc.Call(target="x", idempotent=True), lambda a: None).info, 1, success=True,
                            target="b")]
    c.chains.reported(batch, rpb.ReportOutcomeResponse(fallback_chains=[rpb.FallbackChain(target="a", fallback=ON_OPEN)]))
    assert c.chains.told("a") == pc.Fallback(("geo-b",), on_circuit_open=True)
    # b is a primary of the batch the answer does not list: it has no chain
    # now. An attempt on b for a call of x says nothing of b's chain.
    assert c.chains.told("b") == pc.Fallback(())
    assert c.chains.told("x") == pc.Fallback(())  # the tenant's (none), as before


def test_the_flush_learns_from_the_report_answer(clock: FakeClock) -> None:
    from policyd_client._core import OutcomeQueue, flush

    c = core(clock)
    told(c, {})
    q = OutcomeQueue(c)
    q.add(PendingOutcome(c.begin(pc.Call(target="geo", idempotent=True), lambda a: None).info, 1, success=True))
    steps = flush(c, q)
    batch = steps.send(None)
    assert [o.call.target for o in batch] == ["geo"]
    with pytest.raises(StopIteration):
        steps.send(rpb.ReportOutcomeResponse(fallback_chains=[rpb.FallbackChain(target="geo", fallback=ON_OPEN)]))
    assert c.chains.told("geo") == pc.Fallback(("geo-b",), on_circuit_open=True)
    assert c.stats().outcomes_sent == 1


@pytest.mark.parametrize("v", load_vectors()["fallback_chains"], ids=lambda v: v["name"])
def test_fallback_chain_vectors_local_route(clock: FakeClock, v: dict[str, Any]) -> None:
    # The chain and the breakers from a snapshot; then the watch and
    # policyd are gone: the local policy routes every attempt.
    c = core(clock)
    told(c, {v["primary"]: settings_pb(v["fallback"])}, *(breaker(t, OPEN, forced=True) for t in v["open"]))
    c.cache.down()
    up = Upstream(fail=lambda a: S503, admit=lambda r: DOWN, decide=lambda r: DOWN)
    res = drive(_loop.run(c, c.begin(pc.Call(target=v["primary"], idempotent=True), up)), up)
    got = [a.attempt.target for a in up.of(_loop.Invoke)]
    assert (got, end(res)) == (v["targets"], f"{v['disposition']}/{v['stop_reason']}")
    assert res.local or not got


# -- a real policyd ----------------------------------------------------------


def test_a_fresh_client_escalates_past_a_known_open_primary(policyd: Daemon, tenant: str, make_client: Any) -> None:
    set_chain(policyd, tenant, "geo", ON_OPEN)
    policyd.force_breaker(tenant, "geo", OPEN)
    policyd.force_breaker(tenant, "geo-x", OPEN)
    c = make_client(policyd, tenant)  # ready: it has the snapshot
    fn, targets = recording()
    res = c.call(pc.Call(target="geo", submission_id="doc-1", idempotent=True), fn)
    assert (res.ok, res.target, targets, res.local) == (True, "geo-b", ["geo-b"], False), res
    assert c.stats().admit_rpcs == 1
    # An open target without such a chain still fails fast, without an RPC.
    fn, targets = recording()
    res = c.call(pc.Call(target="geo-x", idempotent=True), fn)
    assert (res.disposition, targets, c.stats().admit_rpcs) == (pc.Disposition.CIRCUIT_OPEN, [], 1)


def test_async_a_fresh_client_escalates_past_a_known_open_primary(policyd: Daemon, tenant: str,
                                                                  clock: FakeClock) -> None:
    set_chain(policyd, tenant, "geo", ON_OPEN)
    policyd.force_breaker(tenant, "geo", OPEN)
    policyd.force_breaker(tenant, "geo-x", OPEN)

    async def main() -> None:
        async with pc.AsyncClient(policyd.address, tenant=tenant, sleep=clock.asleep, now=clock.now,
                                  decision_timeout=5.0) as c:
            assert await c.ready(timeout=15)
            targets: list[str] = []

            async def fn(a: pc.Attempt) -> str:
                targets.append(a.target)
                return "ok"

            res = await c.call(pc.Call(target="geo", submission_id="doc-1", idempotent=True), fn)
            assert (res.ok, res.target, targets) == (True, "geo-b", ["geo-b"]), res
            assert c.stats().admit_rpcs == 1
            res = await c.call(pc.Call(target="geo-x", idempotent=True), fn)
            assert (res.disposition, targets, c.stats().admit_rpcs) == (pc.Disposition.CIRCUIT_OPEN, ["geo-b"], 1)

    asyncio.run(main())


def test_a_chain_set_after_the_snapshot_is_learnt_within_one_report(policyd: Daemon, tenant: str,
                                                                   make_client: Any) -> None:
    c = make_client(policyd, tenant)
    set_chain(policyd, tenant, "geo", ON_OPEN)  # after the client's snapshot
    fn, _ = recording()
    assert c.call(pc.Call(target="geo", idempotent=True), fn).ok
    # A failure elsewhere: its NextDelay first sends the queued outcomes,
    # geo's success among them, and the report's answer names the chain.
    fails = [S503]

    def elsewhere(a: pc.Attempt) -> str:
        if fails:
            raise fails.pop()
        return "ok"

    assert c.call(pc.Call(target="elsewhere", idempotent=True), elsewhere).ok
    policyd.force_breaker(tenant, "geo", OPEN)
    assert c.wait_breaker_state("geo", pc.BreakerState.OPEN, timeout=15)
    admits = c.stats().admit_rpcs
    fn, targets = recording()
    res = c.call(pc.Call(target="geo", idempotent=True), fn)
    assert (res.ok, targets, c.stats().admit_rpcs - admits) == (True, ["geo-b"], 1), res


def test_async_a_chain_set_after_the_snapshot_is_learnt_within_one_report(policyd: Daemon, tenant: str,
                                                                         clock: FakeClock) -> None:
    async def main() -> None:
        async with pc.AsyncClient(policyd.address, tenant=tenant, sleep=clock.asleep, now=clock.now,
                                  decision_timeout=5.0) as c:
            assert await c.ready(timeout=15)
            set_chain(policyd, tenant, "geo", ON_OPEN)
            targets: list[str] = []
            fails = [S503]

            async def fn(a: pc.Attempt) -> str:
                targets.append(a.target)
                if a.target == "elsewhere" and fails:
                    raise fails.pop()
                return "ok"

            assert (await c.call(pc.Call(target="geo", idempotent=True), fn)).ok
            assert (await c.call(pc.Call(target="elsewhere", idempotent=True), fn)).ok
            policyd.force_breaker(tenant, "geo", OPEN)
            assert await c.wait_breaker_state("geo", pc.BreakerState.OPEN, timeout=15)
            admits, targets[:] = c.stats().admit_rpcs, []
            res = await c.call(pc.Call(target="geo", idempotent=True), fn)
            assert (res.ok, targets, c.stats().admit_rpcs - admits) == (True, ["geo-b"], 1), res

    asyncio.run(main())


CHAIN = types_pb2.FallbackSettings(targets=["geo-b", "geo-c"], after_attempts=1, on_circuit_open=True)


def test_with_policyd_stopped_local_decisions_follow_the_chain(dedicated: Callable[..., Daemon], tenant: str,
                                                               make_client: Any) -> None:
    d = dedicated()
    set_chain(d, tenant, "geo", CHAIN)
    d.force_breaker(tenant, "geo", OPEN)
    c = make_client(d, tenant)
    fn, targets = recording()
    res = c.call(pc.Call(target="geo", submission_id="doc-1", idempotent=True), fn)
    assert (res.ok, targets, res.local, c.stats().admit_rpcs) == (True, ["geo-b"], False, 1), res
    assert d.stop() == 0
    fn, targets = recording(S503)
    res = c.call(pc.Call(target="geo", submission_id="doc-2", idempotent=True), fn)
    assert (targets, end(res), res.local) == (["geo-b", "geo-b", "geo-c"], "dead_letter/ATTEMPTS_EXHAUSTED", True), res
    c.close(timeout=0.2)  # doc-2's outcomes cannot reach a stopped policyd


def test_async_with_policyd_stopped_local_decisions_follow_the_chain(dedicated: Callable[..., Daemon], tenant: str,
                                                                     clock: FakeClock) -> None:
    d = dedicated()
    set_chain(d, tenant, "geo", CHAIN)
    d.force_breaker(tenant, "geo", OPEN)

    async def main() -> None:
        c = pc.AsyncClient(d.address, tenant=tenant, sleep=clock.asleep, now=clock.now, decision_timeout=5.0)
        try:
            assert await c.ready(timeout=15)
            targets: list[str] = []

            async def fn(a: pc.Attempt) -> str:
                targets.append(a.target)
                raise S503

            assert d.stop() == 0
            res = await c.call(pc.Call(target="geo", submission_id="doc-2", idempotent=True), fn)
            assert (targets, end(res), res.local) == (["geo-b", "geo-b", "geo-c"], "dead_letter/ATTEMPTS_EXHAUSTED", True)
        finally:
            await c.close(timeout=0.2)

    asyncio.run(main())


VECTORS = load_vectors()["fallback_chains"]


@pytest.mark.parametrize("v", VECTORS, ids=lambda v: v["name"])
def test_fallback_chain_vectors_policyd(policyd: Daemon, tenant: str, make_client: Any, v: dict[str, Any]) -> None:
    set_chain(policyd, tenant, v["primary"], settings_pb(v["fallback"]))
    for t in v["open"]:
        policyd.force_breaker(tenant, t, OPEN)
    c = make_client(policyd, tenant)
    fn, targets = recording(S503)
    res = c.call(pc.Call(target=v["primary"], submission_id="doc-1", idempotent=True), fn)
    assert (targets, end(res), res.local) == (v["targets"], f"{v['disposition']}/{v['stop_reason']}", False), res


def test_fallback_chain_vectors_policyd_stopped(dedicated: Callable[..., Daemon], make_client: Any) -> None:
    # One daemon for every vector, each under a tenant of its own; the
    # clients learn the chains and the breakers from their snapshots, then
    # the daemon stops and the local policy routes every call.
    d = dedicated()
    clients = []
    for i, v in enumerate(VECTORS):
        tenant = f"vec-{i}"
        set_chain(d, tenant, v["primary"], settings_pb(v["fallback"]))
        for t in v["open"]:
            d.force_breaker(tenant, t, OPEN)
        c = make_client(d.address, tenant)  # an address: closed without waiting for the outcomes
        assert c.ready(timeout=15)
        clients.append(c)
    assert d.stop() == 0
    failed = []
    for v, c in zip(VECTORS, clients):
        fn, targets = recording(S503)
        res = c.call(pc.Call(target=v["primary"], submission_id="doc-1", idempotent=True), fn)
        got, want = (targets, end(res)), (v["targets"], f"{v['disposition']}/{v['stop_reason']}")
        if got != want or (targets and not res.local):
            failed.append(f"{v['name']}: {got} local={res.local}, want {want}")
    assert not failed, "\n".join(failed)
