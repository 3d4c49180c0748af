"""How real Python exceptions become policyd failures, and how the local
policy reads Retry-After. No daemon needed."""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from email.utils import formatdate
from typing import Any, Optional

import grpc
import pytest

from retrypolicy.v1 import types_pb2

import policyd_client as pc

from conftest import FakeRpcError

TIMEOUT = types_pb2.Failure(transport_error=types_pb2.TRANSPORT_ERROR_TIMEOUT)
RESET = types_pb2.Failure(transport_error=types_pb2.TRANSPORT_ERROR_CONNECTION_RESET)
REFUSED = types_pb2.Failure(transport_error=types_pb2.TRANSPORT_ERROR_CONNECTION_REFUSED)
DNS = types_pb2.Failure(transport_error=types_pb2.TRANSPORT_ERROR_DNS)
TLS = types_pb2.Failure(transport_error=types_pb2.TRANSPORT_ERROR_TLS)


def http(code: int) -> types_pb2.Failure:
    return types_pb2.Failure(http_status=code)


def chained(outer: BaseException, cause: BaseException, explicit: bool = True) -> BaseException:
    """outer raised from cause (explicit), or while handling it (implicit)."""
    try:
        try:
            raise cause
        except BaseException as c:
            if explicit:
                raise outer from c
            raise outer
    except BaseException as e:
        return e


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Resp:
    """A response object of no particular library."""

    def __init__(self, status_code: int, headers: Optional[dict[str, str]] = None) -> None:
        self.status_code = status_code
        self.headers = headers or {}


class DuckHTTPError(Exception):
    """An error shaped like requests.HTTPError / httpx.HTTPStatusError."""

    def __init__(self, resp: Any) -> None:
        super().__init__("bad status")
        self.response = resp


class ClientResponseError(Exception):
    """Shaped like aiohttp.ClientResponseError: .status and .headers."""

    def __init__(self, status: int, headers: Any) -> None:
        super().__init__(f"{status}")
        self.status = status
        self.headers = headers


@pytest.mark.parametrize(
    "err, want",
    [
        (TimeoutError("x"), TIMEOUT),
        (socket.timeout("timed out"), TIMEOUT),
        (asyncio.TimeoutError(), TIMEOUT),
        (OSError(errno.ETIMEDOUT, "timed out"), TIMEOUT),
        (ConnectionResetError(errno.ECONNRESET, "reset"), RESET),
        (BrokenPipeError(errno.EPIPE, "broken pipe"), RESET),
        (ConnectionAbortedError(errno.ECONNABORTED, "aborted"), RESET),
        (OSError(errno.ECONNRESET, "reset"), RESET),
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), REFUSED),
        (OSError(errno.ECONNREFUSED, "refused"), REFUSED),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), DNS),
        (ssl.SSLError(1, "handshake failure"), TLS),
        (ssl.SSLCertVerificationError(1, "certificate verify failed"), TLS),
        (pc.ParseError("bad json"), types_pb2.Failure(local_error=types_pb2.LOCAL_ERROR_PARSE)),
        (pc.ValidationError("no id"), types_pb2.Failure(local_error=types_pb2.LOCAL_ERROR_VALIDATION)),
        (FakeRpcError(grpc.StatusCode.UNAVAILABLE), types_pb2.Failure(grpc_code=14)),
        (FakeRpcError(grpc.StatusCode.NOT_FOUND), types_pb2.Failure(grpc_code=5)),
        (pc.HTTPStatusError(503), http(503)),
        (DuckHTTPError(_Resp(502)), http(502)),
        (ClientResponseError(429, None), http(429)),
        # Explicit chaining is followed, like Go's %w.
        (chained(RuntimeError("fetch failed"), pc.ParseError("bad json")),
         types_pb2.Failure(local_error=types_pb2.LOCAL_ERROR_PARSE)),
        (chained(RuntimeError("fetch failed"), ConnectionResetError()), RESET),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, BaseException) else "",
)
def test_classify_exception(err: BaseException, want: types_pb2.Failure) -> None:
    f = pc.classify_exception(err)
    assert not f.unclassified, f.reason
    assert f.failure == want


@pytest.mark.parametrize(
    "err, reason",
    [
        (ValueError("mystery"), "unclassified:ValueError"),
        (KeyError("k"), "unclassified:KeyError"),
        (FakeRpcError(grpc.StatusCode.OK), "unclassified:FakeRpcError"),
        (pc.HTTPStatusError(99), "unclassified:http_99"),
        (pc.HTTPStatusError(600), "unclassified:http_600"),
        (OSError(errno.ENOENT, "no such file"), "unclassified:FileNotFoundError"),
        # A user's error raised while handling a 503 is not that 503 (Go
        # follows %w only, never the error being handled).
        (chained(RuntimeError("gave up"), pc.HTTPStatusError(503), explicit=False), "unclassified:RuntimeError"),
    ],
)
def test_unknown_errors_are_unclassified(err: BaseException, reason: str) -> None:
    f = pc.classify_exception(err)
    assert f.unclassified and f.failure is None
    assert f.reason == reason


def test_pushback_headers_pass_raw() -> None:
    e = pc.HTTPStatusError(429, {"retry-after": "7", "GRPC-Retry-Pushback-Ms": "1500",
                                  "X-RateLimit-Reset": "1700000000", "x-amz-retry-after": "250"})
    f = pc.classify_exception(e)
    assert f.failure == http(429)
    assert f.pushback == types_pb2.Pushback(retry_after="7", grpc_retry_pushback_ms="1500",
                                            x_ratelimit_reset="1700000000", x_amz_retry_after="250")
    assert pc.classify_exception(pc.HTTPStatusError(503)).pushback is None
    # Duck-typed responses and aiohttp-style errors carry theirs too.
    assert pc.classify_exception(DuckHTTPError(_Resp(503, {"Retry-After": "3"}))).pushback == types_pb2.Pushback(retry_after="3")
    assert pc.classify_exception(ClientResponseError(503, [("Retry-After", "4")])).pushback == types_pb2.Pushback(retry_after="4")


def test_grpc_pushback_trailer() -> None:
    f = pc.classify_exception(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, (("grpc-retry-pushback-ms", "-1"),)))
    assert f.failure == types_pb2.Failure(grpc_code=8)
    assert f.pushback == types_pb2.Pushback(grpc_retry_pushback_ms="-1")


def test_attempt_timeout_wins_except_over_http_and_local() -> None:
    assert pc.classify_exception(ValueError("x"), timed_out=True).failure == TIMEOUT
    assert pc.classify_exception(FakeRpcError(grpc.StatusCode.UNAVAILABLE), timed_out=True).failure == TIMEOUT
    assert pc.classify_exception(pc.HTTPStatusError(503), timed_out=True).failure == http(503)
    assert pc.classify_exception(pc.ParseError("x"), timed_out=True).failure.local_error == types_pb2.LOCAL_ERROR_PARSE


def test_requests_errors() -> None:
    requests = pytest.importorskip("requests")
    resp = requests.Response()
    resp.status_code = 503
    resp.headers["Retry-After"] = "9"
    f = pc.classify_exception(requests.HTTPError("503", response=resp))
    assert f.failure == http(503) and f.pushback == types_pb2.Pushback(retry_after="9")
    assert pc.classify_exception(requests.exceptions.ReadTimeout("read timed out")).failure == TIMEOUT
    assert pc.classify_exception(requests.exceptions.ConnectTimeout("connect timed out")).failure == TIMEOUT
    # A real refused connection on loopback: requests wraps urllib3 wrapping
    # the socket error.
    with pytest.raises(requests.ConnectionError) as exc:
        requests.get(f"http://127.0.0.1:{closed_port()}/", timeout=5)
    assert pc.classify_exception(exc.value).failure == REFUSED


def test_httpx_errors() -> None:
    httpx = pytest.importorskip("httpx")
    req = httpx.Request("GET", "http://upstream/")
    resp = httpx.Response(429, headers={"Retry-After": "2"}, request=req)
    f = pc.classify_exception(httpx.HTTPStatusError("429", request=req, response=resp))
    assert f.failure == http(429) and f.pushback == types_pb2.Pushback(retry_after="2")
    assert pc.classify_exception(httpx.ReadTimeout("timed out", request=req)).failure == TIMEOUT
    assert pc.classify_exception(httpx.ConnectTimeout("timed out", request=req)).failure == TIMEOUT
    assert pc.classify_exception(httpx.RemoteProtocolError("server disconnected", request=req)).failure == RESET
    with pytest.raises(httpx.ConnectError) as exc:
        httpx.get(f"http://127.0.0.1:{closed_port()}/", timeout=5)
    assert pc.classify_exception(exc.value).failure == REFUSED
    # TLS failures surface as ConnectError with the ssl error chained.
    tls = chained(httpx.ConnectError("handshake"), ssl.SSLCertVerificationError(1, "verify failed"))
    assert pc.classify_exception(tls).failure == TLS


def test_library_errors_by_name_without_the_libraries() -> None:
    # Classes named like urllib3's and aiohttp's, with no socket error
    # chained: the name decides. urllib3's NewConnectionError subclasses its
    # ConnectTimeoutError, yet means the connection was never made.
    def lib(name: str, *bases: type) -> type:
        return type(name, bases or (Exception,), {"__module__": "urllib3.exceptions"})

    timeout_error = lib("ConnectTimeoutError")
    assert pc.classify_exception(lib("NewConnectionError", timeout_error)("x")).failure == REFUSED
    assert pc.classify_exception(timeout_error("x")).failure == TIMEOUT
    assert pc.classify_exception(lib("NameResolutionError")("x")).failure == DNS
    assert pc.classify_exception(lib("ServerDisconnectedError")("x")).failure == RESET
    assert pc.classify_exception(lib("SSLError")("x")).failure == TLS
    # The same names on a user's own class mean nothing.
    mine = type("ReadTimeoutError", (Exception,), {})
    assert pc.classify_exception(mine("x")).reason == "unclassified:ReadTimeoutError"


@pytest.mark.parametrize(
    "value, want",
    [
        ("7", 7.0),
        (" 120 ", 120.0),
        ("0", 0.0),
        ("4294967295", 4294967295.0),
        ("4294967296", 4294967296.0),  # valid however large: the policy caps it
        ("99999999999", 99999999999.0),
        ("9" * 40, float("9" * 40)),
        ("-0", 0.0),
        ("-1", None),
        ("1.5", None),
        ("soon", None),
        ("", None),
        ("٣", None),  # a digit, but not an ASCII one
    ],
)
def test_parse_retry_after_delta(value: str, want: Optional[float]) -> None:
    assert pc.parse_retry_after(value, 1_000_000.0) == want


def test_parse_retry_after_dates() -> None:
    now = 784111777.0  # Sun, 06 Nov 1994 08:49:37 GMT
    for v in ("Sun, 06 Nov 1994 08:49:47 GMT", "Sunday, 06-Nov-94 08:49:47 GMT", "Sun Nov  6 08:49:47 1994"):
        assert pc.parse_retry_after(v, now) == pytest.approx(10.0), v
    assert pc.parse_retry_after(formatdate(now - 60, usegmt=True), now) == 0.0  # in the past
    assert pc.parse_retry_after("Sun, 06 Nov 1994 08:49:47 PST", now) is None
    far = pc.parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now)
    assert far is not None and far > 2.5e11  # the year 9999 is a valid date
    assert pc.parse_retry_after("Mon, 32 Jan 2024 00:00:00 GMT", now) is None
