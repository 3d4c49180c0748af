"""A flaky upstream for the adapter tests: a real HTTP server on loopback,
in a thread, that answers each request with the next step of a script
(a status with headers, or a connection reset) and then 200, and records
what it was sent. Import the ``flaky`` fixture into a test module."""

from __future__ import annotations

import http.server
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Iterator, Optional, Union

import pytest

import policyd_client as pc

from conftest import FakeClock

#: A connection reset instead of an answer.
RESET = "reset"


@dataclass(frozen=True)
class Reply:
    """One scripted answer."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


Step = Union[Reply, str]


@dataclass(frozen=True)
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    #: The client's port: the same for requests on one connection.
    port: int = 0


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that gives up on a connection (a timeout, a closed
        # response) is part of the tests; anything else is printed.
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class Flaky:
    """The server: ``script(*steps)`` sets what the next requests get; past
    the script every request gets 200 with body ``ok after <n>`` (n counts
    the requests since the script was set). ``seen`` lists the requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: list[Step] = []
        self.seen: list[Seen] = []
        flaky = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                step = flaky._next(Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                                        self.client_address[1]))
                if step == RESET:
                    # An RST, not a FIN: the client sees a connection reset.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                assert isinstance(step, Reply)
                self.send_response(step.status)
                for k, v in step.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(step.body)))
                self.end_headers()
                self.wfile.write(step.body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="flaky-upstream", daemon=True)
        self._thread.start()

    def script(self, *steps: Step) -> None:
        with self._lock:
            self._steps = list(steps)
            self.seen = []

    def _next(self, seen: Seen) -> Step:
        with self._lock:
            self.seen.append(seen)
            if self._steps:
                return self._steps.pop(0)
            return Reply(200, {"Content-Type": "text/plain"}, f"ok after {len(self.seen)}".encode())

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def busy(n: int, retry_after: Optional[str] = None) -> Reply:
    """A 503 with body ``busy <n>`` and, if given, a Retry-After."""
    return Reply(503, {"Retry-After": retry_after} if retry_after else {}, f"busy {n}".encode())


@pytest.fixture
def flaky() -> Iterator[Flaky]:
    f = Flaky()
    yield f
    f.close()


def assert_retry_delays(events: list[pc.Event], clock: FakeClock, *bounds: tuple[float, float]) -> None:
    """Asserts the delays policyd gave the retries, each within its bounds,
    and that the client waited them (on the fake clock). Other waits may
    come between: a hint starts a fleet-wide cool-down on policyd's wall
    clock, which the fake clock lags by the test's run time, and what is
    left of it is waited out before the next attempt."""
    delays = [e.delay for e in events if e.kind is pc.EventKind.RETRY_SCHEDULED]
    assert len(delays) == len(bounds) and all(lo <= d <= hi for d, (lo, hi) in zip(delays, bounds)), (delays, bounds)
    it = iter(clock.waits)
    assert all(d in it for d in delays), (delays, clock.waits)  # in order
