"""Fixtures: a real policyd built from this repository and run on loopback,
admin access to it, and a fake clock so that no test waits.

The session builds ``cmd/policyd`` once with ``go build``, starts it on a
free loopback port with its state in a temporary directory, waits for the
gRPC health check to say SERVING (``wait_for_ready`` with a deadline, no
polling), and stops it with SIGTERM at the end. Tests that stop a daemon
start a dedicated one with :func:`start_daemon`.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import grpc
import pytest
from google.protobuf import timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from retrypolicy.v1 import admin_service_pb2 as apb
from retrypolicy.v1 import admin_service_pb2_grpc as apb_grpc
from retrypolicy.v1 import types_pb2

import policyd_client as pc

REPO = Path(__file__).resolve().parents[3]
VECTORS = REPO / "testdata" / "vectors.json"

# Reconnect quickly while the daemon starts, so wait_for_ready returns as
# soon as it listens rather than at the next default (1 s) backoff.
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 20),
    ("grpc.min_reconnect_backoff_ms", 20),
    ("grpc.max_reconnect_backoff_ms", 100),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    """A policyd process on loopback, with admin access."""

    proc: subprocess.Popen[bytes]
    address: str
    db: Path
    log: Path
    admin_token: str
    channel: grpc.Channel
    admin: apb_grpc.AdminServiceStub = field(init=False)

    def __post_init__(self) -> None:
        self.admin = apb_grpc.AdminServiceStub(self.channel)

    @property
    def admin_md(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", "Bearer " + self.admin_token),)

    def admin_call(self, method: str, request: Any) -> Any:
        """Calls an AdminService method with the admin token."""
        return getattr(self.admin, method)(request, metadata=self.admin_md, timeout=10)

    def force_breaker(self, tenant: str, target: str, state: int) -> None:
        self.admin_call("ForceBreaker", apb.ForceBreakerRequest(
            key=types_pb2.BreakerKey(tenant=tenant, target=target), state=state))

    def set_budget(self, tenant: str, capacity: float) -> None:
        self.admin_call("SetTenantBudget", apb.SetTenantBudgetRequest(
            budget=types_pb2.TenantBudget(tenant=tenant, capacity=capacity)))

    def open_run(self, run_id: str, tenant: str, pool: int, cutoff_in: int = 3600) -> None:
        cutoff = timestamp_pb2.Timestamp()
        cutoff.FromSeconds(int(time.time()) + cutoff_in)
        self.admin_call("OpenRun", apb.OpenRunRequest(run_id=run_id, tenant=tenant, retry_pool=pool, cutoff_time=cutoff))

    def run(self, run_id: str) -> types_pb2.Run:
        return self.admin_call("GetRun", apb.GetRunRequest(run_id=run_id)).run

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Signals the daemon and waits for it to exit; returns its code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.channel.close()

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start_daemon(binary: Path, workdir: Path, *extra: str, credentials: Optional[grpc.ChannelCredentials] = None,
                 address: str = "") -> Daemon:
    """Starts policyd on address (default a free loopback port) and returns
    once its health check says SERVING (over TLS with credentials)."""
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "policyd.db"
    log = workdir / "policyd.log"
    address = address or f"127.0.0.1:{free_port()}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(binary), "serve", "--listen", address, "--db", str(db), "--grace", "2s", "--log-level", "warn", *extra],
            stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
        )
    if credentials is not None:
        channel = grpc.secure_channel(address, credentials, options=FAST_RECONNECT)
    else:
        channel = grpc.insecure_channel(address, options=FAST_RECONNECT)
    try:
        resp = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), wait_for_ready=True, timeout=30)
    except grpc.RpcError as e:
        proc.kill()
        proc.wait()
        channel.close()
        raise RuntimeError(f"policyd did not come up on {address}: {e}\n{log.read_text(errors='replace')}") from e
    if resp.status != health_pb2.HealthCheckResponse.SERVING:
        proc.kill()
        raise RuntimeError(f"policyd health: {resp.status}")
    token_file = Path(str(db) + ".admin-token")
    token = token_file.read_text().strip() if token_file.exists() else ""
    return Daemon(proc=proc, address=address, db=db, log=log, admin_token=token, channel=channel)


@pytest.fixture(scope="session")
def policyd_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bin") / "policyd"
    subprocess.run(["go", "build", "-o", str(out), "./cmd/policyd"], cwd=REPO, check=True)
    return out


@pytest.fixture(scope="session")
def policyd(policyd_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(policyd_binary, tmp_path_factory.mktemp("policyd"))
    yield d
    code = d.stop(signal.SIGTERM)
    assert code == 0, f"policyd exited {code} on SIGTERM:\n{d.logs()}"


@pytest.fixture
def dedicated(policyd_binary: Path, tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Starts daemons of the test's own, to be stopped by the test; any
    still running at the end are killed."""
    started: list[Daemon] = []

    def start(*extra: str, credentials: Optional[grpc.ChannelCredentials] = None) -> Daemon:
        d = start_daemon(policyd_binary, tmp_path / f"d{len(started)}", *extra, credentials=credentials)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        d.channel.close()


@pytest.fixture
def tenant() -> str:
    """A tenant of the test's own: breakers and budgets start fresh."""
    return "t-" + uuid.uuid4().hex[:12]


class FakeClock:
    """The clients' clock in tests: sleep records the wait and moves the
    clock on at once, so no test waits. Starts at the wall clock, so that
    policyd (which reads the wall clock) sees sane origin times."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = time.time()
        self.waits: list[float] = []

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, d: float) -> None:
        with self._lock:
            self._now += d

    def sleep(self, d: float, cancel: threading.Event) -> None:
        with self._lock:
            self.waits.append(d)
            self._now += d

    async def asleep(self, d: float) -> None:
        self.sleep(d, threading.Event())
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_client(clock: FakeClock) -> Iterator[Callable[..., pc.Client]]:
    """Returns a factory of sync clients on the fake clock, ready (following
    the breakers) unless watch=False; they are closed at the end."""
    clients: list[tuple[pc.Client, float]] = []

    def make(daemon: Daemon | str, tenant: str, **kw: Any) -> pc.Client:
        address = daemon if isinstance(daemon, str) else daemon.address
        kw.setdefault("decision_timeout", 5.0)
        c = pc.Client(address, tenant=tenant, sleep=clock.sleep, now=clock.now, **kw)
        # A client of an unreachable policyd cannot flush: do not wait long.
        clients.append((c, 0.2 if isinstance(daemon, str) else 5.0))
        if kw.get("watch", True) and not isinstance(daemon, str):
            assert c.ready(timeout=15), "the client never followed policyd's breakers"
        return c

    yield make
    for c, timeout in clients:
        c.close(timeout=timeout)


def load_vectors() -> dict[str, Any]:
    return json.loads(VECTORS.read_text())


def failure_pb(spec: dict[str, Any]) -> types_pb2.Failure:
    """The Failure message a vector's failure spec names."""
    if "http_status" in spec:
        return types_pb2.Failure(http_status=spec["http_status"])
    if "grpc_code" in spec:
        return types_pb2.Failure(grpc_code=spec["grpc_code"])
    if "transport_error" in spec:
        return types_pb2.Failure(transport_error=types_pb2.TransportError.Value("TRANSPORT_ERROR_" + spec["transport_error"]))
    if "local_error" in spec:
        return types_pb2.Failure(local_error=types_pb2.LocalError.Value("LOCAL_ERROR_" + spec["local_error"]))
    raise ValueError(f"no failure in {spec}")


class FakeRpcError(grpc.RpcError):
    """A gRPC error as a grpc stub raises it: code() and trailers."""

    def __init__(self, code: grpc.StatusCode, trailers: Optional[tuple[tuple[str, str], ...]] = None) -> None:
        super().__init__(f"rpc failed: {code.name}")
        self._code = code
        self._trailers = trailers or ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "upstream said no"

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailers


_GRPC_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


def native_error(spec: dict[str, Any]) -> Exception:
    """The Python exception a vector's failure spec stands for, as an
    upstream call would raise it."""
    import ssl

    if "http_status" in spec:
        return pc.HTTPStatusError(spec["http_status"], spec.get("headers"))
    if "grpc_code" in spec:
        return FakeRpcError(_GRPC_BY_NUMBER[spec["grpc_code"]])
    if "transport_error" in spec:
        return {
            "TIMEOUT": lambda: TimeoutError("timed out"),
            "CONNECTION_RESET": lambda: ConnectionResetError(104, "Connection reset by peer"),
            "CONNECTION_REFUSED": lambda: ConnectionRefusedError(111, "Connection refused"),
            "DNS": lambda: socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
            "TLS": lambda: ssl.SSLCertVerificationError(1, "certificate verify failed"),
        }[spec["transport_error"]]()
    if "local_error" in spec:
        return {"PARSE": pc.ParseError, "VALIDATION": pc.ValidationError}[spec["local_error"]]("bad response")
    if "unclassified" in spec:
        return ValueError(spec["unclassified"])
    raise ValueError(f"no failure in {spec}")


def script(*errors: Optional[Exception]) -> tuple[Callable[[pc.Attempt], str], list[pc.Attempt]]:
    """A fake upstream: attempt n raises errors[n-1] (None: success); past
    the list it succeeds. Returns the function and the attempts it saw."""
    seen: list[pc.Attempt] = []

    def fn(a: pc.Attempt) -> str:
        seen.append(a)
        if a.number - 1 < len(errors) and errors[a.number - 1] is not None:
            raise errors[a.number - 1]  # type: ignore[misc]
        return f"ok after {a.number}"

    return fn, seen


def ascript(*errors: Optional[Exception]) -> tuple[Callable[[pc.Attempt], Any], list[pc.Attempt]]:
    """script, as a coroutine function."""
    fn, seen = script(*errors)

    async def afn(a: pc.Attempt) -> str:
        await asyncio.sleep(0)
        return fn(a)

    return afn, seen
