"""Scenarios of clients made before os.fork(), each run by test_fork.py in a
fresh interpreter (grpc.aio's per-process state must be untouched by other
tests): ``python fork_scenarios.py NAME ADDRESS TENANT RUN_ID``. The parent
makes (and maybe uses) a client, forks CHILDREN children with
multiprocessing's 'fork' start method, and prints one JSON object: what each
child saw, and what the parent saw afterwards."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import policyd_client as pc

from conftest import FakeClock, ascript, script

S503 = pc.HTTPStatusError(503)
CHILDREN = 3


def fork_children(target: Callable[[int], dict[str, Any]]) -> list[Any]:
    """Runs target(i) in CHILDREN forked processes; returns what each
    returned, or a string saying how it failed."""
    out = Path(tempfile.mkdtemp())

    def run(i: int) -> None:
        (out / f"{i}.json").write_text(json.dumps(target(i)))

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=run, args=(i,)) for i in range(CHILDREN)]
    for p in procs:
        p.start()
    got: list[Any] = []
    for i, p in enumerate(procs):
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join()
            got.append("hung for 30 s")
        elif p.exitcode != 0:
            got.append(f"exited {p.exitcode}")
        else:
            got.append(json.loads((out / f"{i}.json").read_text()))
    return got


def sync_used(address: str, tenant: str, run_id: str) -> dict[str, Any]:
    # The parent uses the client (channel, reporter, watch stream all live)
    # and leaves an outcome queued when it forks (only close flushes).
    clock = FakeClock()
    c = pc.Client(address, tenant=tenant, sleep=clock.sleep, now=clock.now, decision_timeout=5, flush_interval=3600)
    assert c.ready(timeout=15)
    assert c.call(pc.Call(target="geo", idempotent=True, run_id=run_id, call_id="parent-0"), script()[0]).ok

    def child(i: int) -> dict[str, Any]:
        # Ready first, as a worker started by gunicorn or Celery would be:
        # the child's fresh channel connects before its first decision, so
        # a slow connect on a loaded machine is not taken for policyd away.
        ready = c.ready(timeout=15)
        res = c.call(pc.Call(target="geo", idempotent=True, run_id=run_id, call_id=f"child-{i}"), script(S503)[0])
        lost = c.close(timeout=5)
        return {"ok": res.ok, "local": res.local, "attempts": res.attempts, "ready": ready, "lost": lost,
                "sent": c.stats().outcomes_sent}

    children = fork_children(child)
    after = c.call(pc.Call(target="geo", idempotent=True, run_id=run_id, call_id="parent-1"), script()[0]).ok
    return {"children": children, "parent_ok": after, "parent_lost": c.close()}


def sync_preload(address: str, tenant: str, run_id: str) -> dict[str, Any]:
    # gunicorn --preload: the client is made at import in the master, which
    # never calls it; the workers do.
    clock = FakeClock()
    c = pc.Client(address, tenant=tenant, sleep=clock.sleep, now=clock.now, decision_timeout=5)

    def child(i: int) -> dict[str, Any]:
        res = c.call(pc.Call(target="geo", idempotent=True, run_id=run_id, call_id=f"child-{i}"), script(S503)[0])
        return {"ok": res.ok, "local": res.local, "attempts": res.attempts, "ready": c.ready(timeout=15),
                "lost": c.close(timeout=5), "sent": c.stats().outcomes_sent}

    return {"children": fork_children(child), "parent_ok": True, "parent_lost": c.close()}


async def async_child(c: pc.AsyncClient, run_id: str, i: int) -> dict[str, Any]:
    """What child i of an async scenario does with c and reports."""
    res = await c.call(pc.Call(target="geo", idempotent=True, run_id=run_id, call_id=f"child-{i}"), ascript(S503)[0])
    return {"ok": res.ok, "local": res.local, "attempts": res.attempts, "ready": await c.ready(timeout=15),
            "lost": await c.close(timeout=5), "sent": c.stats().outcomes_sent}


def async_created(address: str, tenant: str, run_id: str) -> dict[str, Any]:
    # Celery prefork or gunicorn --preload with asyncio workers: the client
    # is made in the parent (which talks to policyd itself, through a sync
    # client) and starts on each child's own event loop.
    clock = FakeClock()
    sync = pc.Client(address, tenant=tenant, sleep=clock.sleep, now=clock.now, decision_timeout=5)
    assert sync.ready(timeout=15)
    c = pc.AsyncClient(address, tenant=tenant, sleep=clock.asleep, now=clock.now, decision_timeout=5)

    def child(i: int) -> dict[str, Any]:
        return asyncio.run(async_child(c, run_id, i))

    return {"children": fork_children(child), "parent_ok": True, "parent_lost": sync.close()}


def async_after_aio(address: str, tenant: str, run_id: str) -> dict[str, Any]:
    # The parent ran grpc.aio itself (an AsyncClient, closed before the
    # fork: with grpc.aio's poller still running at fork, gRPC's children
    # may crash inside gRPC), so grpc.aio cannot run in the children: there
    # the client talks over a blocking channel in worker threads.
    clock = FakeClock()
    warm = pc.AsyncClient(address, tenant=tenant, sleep=clock.asleep, now=clock.now, decision_timeout=5)

    async def parent() -> int:
        assert (await warm.call(pc.Call(target="geo", idempotent=True, run_id=run_id), ascript()[0])).ok
        return await warm.close()

    lost = asyncio.run(parent())
    c = pc.AsyncClient(address, tenant=tenant, sleep=clock.asleep, now=clock.now, decision_timeout=5)

    def child(i: int) -> dict[str, Any]:
        return asyncio.run(async_child(c, run_id, i))

    return {"children": fork_children(child), "parent_ok": True, "parent_lost": lost}


if __name__ == "__main__":
    name, address, tenant, run_id = sys.argv[1:5]
    print(json.dumps(globals()[name](address, tenant, run_id)))
