"""Clients created before os.fork() (gunicorn --preload, Celery prefork,
multiprocessing's 'fork' start method) in children: each child dials policyd
afresh, runs its own reporter and watch, and its outcomes reach policyd; the
parent goes on as before. Each scenario (fork_scenarios.py) runs in a fresh
interpreter, since grpc.aio's state is per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from retrypolicy.v1 import admin_service_pb2 as apb
from retrypolicy.v1 import types_pb2

from conftest import Daemon

pytestmark = pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="no fork on this platform")

SCENARIOS = Path(__file__).with_name("fork_scenarios.py")


def scenario(name: str, d: Daemon, tenant: str, run_id: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(SCENARIOS), name, d.address, tenant, run_id],
                          capture_output=True, text=True, timeout=120, cwd=SCENARIOS.parent)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stderr}"
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def audit_events(d: Daemon, tenant: str, call_id: str) -> list[str]:
    audit = d.admin_call("QueryAudit", apb.QueryAuditRequest(call_id=call_id, tenant=tenant))
    return [types_pb2.AuditEvent.Name(r.event) for r in audit.records]


@pytest.mark.parametrize("name, parent_calls", [
    ("sync_used", 2), ("sync_preload", 0), ("async_created", 0), ("async_after_aio", 1),
])
def test_children_reach_policyd(policyd: Daemon, tenant: str, name: str, parent_calls: int) -> None:
    run_id = f"{name}-{tenant}"
    policyd.open_run(run_id, tenant, pool=100)
    got = scenario(name, policyd, tenant, run_id)
    for i, child in enumerate(got["children"]):
        # Decided by policyd (not locally), following its breakers, and only
        # its own outcome sent (the success; NextDelay recorded the
        # failure), not one the parent had queued.
        assert isinstance(child, dict), f"child {i}: {child}"
        assert child == {"ok": True, "local": False, "attempts": 2, "ready": True, "lost": 0, "sent": 1}, (i, child)
        events = audit_events(policyd, tenant, f"child-{i}")
        assert "AUDIT_EVENT_DECISION" in events and "AUDIT_EVENT_FINAL" in events, (i, events)
    assert (got["parent_ok"], got["parent_lost"]) == (True, 0)
    assert policyd.run(run_id).ledger.succeeded == parent_calls + len(got["children"])
