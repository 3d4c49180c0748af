"""Errors the user's function raises, and how the client sees them.

:func:`classify_exception` maps a real Python exception to the
``retrypolicy.v1.Failure`` policyd classifies, the way the Go client's
``classifyError`` maps Go errors:

- :class:`HTTPStatusError`, and HTTP errors of requests, httpx and aiohttp by
  duck typing (``.response.status_code`` / ``.response.headers``, or
  ``.status`` / ``.headers``), with their pushback headers passed raw;
- :class:`ParseError` and :class:`ValidationError`: local errors (terminal);
- the per-attempt timeout, ``TimeoutError`` (``socket.timeout``,
  ``asyncio.TimeoutError``) and ``ETIMEDOUT``: a transport timeout;
- ``ConnectionResetError``, ``BrokenPipeError``, ``ConnectionAbortedError``:
  connection reset; ``ConnectionRefusedError``: connection refused;
  ``socket.gaierror``: DNS; ``ssl.SSLError``: TLS;
- ``grpc.RpcError``: its status code (and its ``grpc-retry-pushback-ms``
  trailer);
- timeouts and connection errors of requests, urllib3, httpx and aiohttp, by
  the exceptions they chain and, failing that, by class name.

The search follows explicit chaining (``raise X from Y``) of any exception,
like Go's ``%w``; implicit chaining (``__context__``), exception arguments and
the ``reason``/``os_error`` attributes only of the HTTP libraries' own
exceptions, which wrap the socket error that way. An exception of no known
kind is terminal with reason ``unclassified:<TypeName>`` and never retried,
as in the Go client. None of requests, httpx or aiohttp needs to be
installed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

import grpc

from retrypolicy.v1 import types_pb2

from ._model import Result

__all__ = [
    "HTTPStatusError",
    "LocalError",
    "ParseError",
    "ValidationError",
    "RetryError",
    "Deduplicated",
    "ClassifiedFailure",
    "classify_exception",
]

# Pushback headers policyd reads, by their lower-case names, and the Pushback
# field each one fills.
_PUSHBACK_HEADERS = {
    "retry-after": "retry_after",
    "grpc-retry-pushback-ms": "grpc_retry_pushback_ms",
    "x-ratelimit-reset": "x_ratelimit_reset",
    "x-amz-retry-after": "x_amz_retry_after",
}


def _header(headers: Any, name: str) -> str:
    """Returns header ``name`` (lower case) from a mapping of any case: a
    plain dict, requests' CaseInsensitiveDict, httpx.Headers, a multidict or
    gRPC metadata (a sequence of pairs). Missing: ""."""
    if headers is None:
        return ""
    get = getattr(headers, "get", None)
    if callable(get):
        for key in (name, name.title()):
            try:
                v = get(key)
            except Exception:  # an exotic mapping; fall back to iteration
                v = None
            if v is not None:
                return str(v)
    try:
        items = headers.items() if hasattr(headers, "items") else iter(headers)
        for item in items:
            k, v = item
            if str(k).lower() == name:
                return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        pass
    return ""


def _pushback(headers: Any) -> Optional[types_pb2.Pushback]:
    """Returns the raw pushback headers found in ``headers``, or None."""
    values = {field: _header(headers, h) for h, field in _PUSHBACK_HEADERS.items()}
    if not any(values.values()):
        return None
    return types_pb2.Pushback(**values)


class HTTPStatusError(Exception):
    """An HTTP response that failed, with the pushback headers the server
    sent. Raise it from the function a client runs, like the Go client's
    ``HTTPError``::

        if resp.status >= 400:
            raise HTTPStatusError(resp.status, resp.headers)

    ``headers`` may be any mapping (case-insensitive lookups are done by the
    client) or None.
    """

    def __init__(self, status: int, headers: Optional[Mapping[str, str]] = None) -> None:
        self.status = int(status)
        self.headers = headers
        self.retry_after = _header(headers, "retry-after")
        self.grpc_retry_pushback_ms = _header(headers, "grpc-retry-pushback-ms")
        self.x_ratelimit_reset = _header(headers, "x-ratelimit-reset")
        self.x_amz_retry_after = _header(headers, "x-amz-retry-after")
        msg = f"http status {self.status}"
        if self.retry_after:
            msg += f" (Retry-After: {self.retry_after})"
        super().__init__(msg)


class LocalError(Exception):
    """A failure inside the caller after a response arrived; terminal. Raise
    one of its subclasses, e.g. ``raise ParseError("bad json") from exc``."""

    kind: "types_pb2.LocalError" = types_pb2.LOCAL_ERROR_UNSPECIFIED


class ParseError(LocalError):
    """The response could not be parsed (terminal, reason ``local:parse``)."""

    kind = types_pb2.LOCAL_ERROR_PARSE


class ValidationError(LocalError):
    """The response or the input failed validation (terminal, reason
    ``local:validation``)."""

    kind = types_pb2.LOCAL_ERROR_VALIDATION


class RetryError(Exception):
    """Raised by functions decorated with ``Client.retry`` or
    ``AsyncClient.retry`` when the call did not succeed. ``result`` says how
    it ended; the last exception the function raised is chained as
    ``__cause__``."""

    def __init__(self, result: Result[Any]) -> None:
        self.result = result
        stop = result.stop_reason.value if result.stop_reason else ""
        super().__init__(
            f"policyd_client: call {result.call_id} ended {result.disposition.value}"
            f" ({stop}, {result.reason or 'no failure'}) after {result.attempts} attempt(s)"
        )


class Deduplicated(RetryError):
    """Raised by the HTTP adapters for a call the idempotency ledger
    answered: an earlier attempt with the same key (in this process or
    another) succeeded, so the request was not sent and there is no
    response to return. ``result.deduplicated`` is True and
    ``result_ref`` is the earlier attempt's result reference (``""`` when
    it kept none)."""

    def __init__(self, result: Result[Any]) -> None:
        super().__init__(result)
        self.result_ref: str = result.value if isinstance(result.value, str) else ""
        self.args = (f"policyd_client: call {result.call_id} was deduplicated: an earlier attempt with key "
                     f"{result.idempotency_key} succeeded (result reference {self.result_ref!r}); nothing was sent",)


class UnmappedTarget(LookupError):
    """Raised by the HTTP adapters for an attempt policyd sent to a target
    (a fallback the call escalated to) that their ``hosts`` mapping does not
    name: the request is not sent, rather than sent to the primary's host.
    The call ends ``failed_terminal`` (reason ``unclassified:UnmappedTarget``)
    and the adapter raises this. ``target`` is the unmapped target,
    ``primary`` the call's."""

    def __init__(self, target: str, primary: str) -> None:
        super().__init__(
            f"policyd_client: policyd sent an attempt of {primary!r} to fallback target {target!r}, which the "
            f"adapter's hosts mapping does not name; add hosts[{target!r}] (a base URL or a host[:port])")
        self.target = target
        self.primary = primary


@dataclass(frozen=True)
class ClassifiedFailure:
    """An exception seen as policyd sees failures.

    ``failure`` is the ``retrypolicy.v1.Failure`` to send, ``pushback`` the raw
    server hints, if any. ``unclassified`` is set for an exception of no kind
    the client knows; ``failure`` is then None and ``reason`` says
    ``unclassified:<TypeName>``: such failures are terminal and never asked
    about, never retried.
    """

    failure: Optional[types_pb2.Failure]
    pushback: Optional[types_pb2.Pushback] = None
    unclassified: bool = False
    reason: str = ""

    @property
    def is_timeout(self) -> bool:
        """True for a transport timeout (a retry after it costs more budget)."""
        return (
            self.failure is not None
            and self.failure.WhichOneof("kind") == "transport_error"
            and self.failure.transport_error == types_pb2.TRANSPORT_ERROR_TIMEOUT
        )


def _transport(kind: "types_pb2.TransportError") -> ClassifiedFailure:
    return ClassifiedFailure(failure=types_pb2.Failure(transport_error=kind))


_TIMEOUT_TYPES: tuple[type[BaseException], ...] = (
    TimeoutError,
    socket.timeout,
    asyncio.TimeoutError,
    concurrent.futures.TimeoutError,
)
_RESET_ERRNOS = {errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED}

# Modules whose exceptions wrap the socket error implicitly (raised while
# handling it, or as an argument): their chains are followed all the way.
_LIBRARY_MODULES = ("requests", "urllib3", "httpx", "httpcore", "aiohttp", "anyio", "http.client", "h11", "h2")

# By class name, for exceptions of the HTTP libraries with no socket error
# chained; first rule whose name appears in the exception's MRO wins.
_NAME_RULES: tuple[tuple[frozenset[str], "types_pb2.TransportError"], ...] = (
    (frozenset({"NameResolutionError"}), types_pb2.TRANSPORT_ERROR_DNS),
    (
        frozenset({"SSLError", "CertificateError", "ClientSSLError", "ClientConnectorCertificateError",
                   "ClientConnectorSSLError", "ServerFingerprintMismatch"}),
        types_pb2.TRANSPORT_ERROR_TLS,
    ),
    # Connect-phase failures: the request never left the caller.
    (frozenset({"NewConnectionError", "ConnectError", "ClientConnectorError"}), types_pb2.TRANSPORT_ERROR_CONNECTION_REFUSED),
)
_RESET_NAMES = frozenset({
    "ServerDisconnectedError", "RemoteProtocolError", "ReadError", "WriteError", "ProtocolError",
    "ChunkedEncodingError", "RemoteDisconnected", "IncompleteRead", "ClientPayloadError",
})


def _is_library(e: BaseException) -> bool:
    mod = type(e).__module__ or ""
    return any(mod == m or mod.startswith(m + ".") for m in _LIBRARY_MODULES)


def _chain(err: BaseException) -> Iterator[BaseException]:
    """Yields err and the exceptions it wraps, breadth first, each once."""
    seen: set[int] = set()
    queue = [err]
    while queue and len(seen) < 32:
        e = queue.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        if e.__cause__ is not None:
            queue.append(e.__cause__)
        if _is_library(e):
            if e.__context__ is not None:
                queue.append(e.__context__)
            for attr in ("reason", "os_error"):
                v = getattr(e, attr, None)
                if isinstance(v, BaseException):
                    queue.append(v)
            queue.extend(a for a in getattr(e, "args", ()) if isinstance(a, BaseException))


def _http(e: BaseException) -> Optional[tuple[int, Any]]:
    """Returns (status, headers) of an HTTP error, duck-typed."""
    if isinstance(e, HTTPStatusError):
        return e.status, e.headers
    resp = getattr(e, "response", None)
    if resp is not None:
        code = getattr(resp, "status_code", None)
        if code is None:
            code = getattr(resp, "status", None)
        if isinstance(code, int) and not isinstance(code, bool):
            return code, getattr(resp, "headers", None)
    code = getattr(e, "status", None)
    if isinstance(code, int) and not isinstance(code, bool) and hasattr(e, "headers"):
        return code, getattr(e, "headers", None)
    return None


def _grpc_code(e: BaseException) -> Optional[int]:
    if not isinstance(e, grpc.RpcError):
        return None
    code = getattr(e, "code", None)
    if not callable(code):
        return None
    try:
        c = code()
    except Exception:
        return None
    if isinstance(c, grpc.StatusCode):
        return int(c.value[0])
    return int(c) if isinstance(c, int) else None


def _grpc_pushback(e: BaseException) -> Optional[types_pb2.Pushback]:
    trailers = getattr(e, "trailing_metadata", None)
    if not callable(trailers):
        return None
    try:
        md = trailers()
    except Exception:
        return None
    v = _header(md, "grpc-retry-pushback-ms")
    return types_pb2.Pushback(grpc_retry_pushback_ms=v) if v else None


def _strong(e: BaseException) -> Optional[ClassifiedFailure]:
    """Classifies one exception by its type alone; None when unknown."""
    if isinstance(e, LocalError) and e.kind != types_pb2.LOCAL_ERROR_UNSPECIFIED:
        return ClassifiedFailure(failure=types_pb2.Failure(local_error=e.kind))
    # TLS and DNS errors are OSErrors too: check them before errno.
    if isinstance(e, ssl.SSLError) or isinstance(e, getattr(ssl, "CertificateError", ())):
        return _transport(types_pb2.TRANSPORT_ERROR_TLS)
    if isinstance(e, socket.gaierror):
        return _transport(types_pb2.TRANSPORT_ERROR_DNS)
    if isinstance(e, _TIMEOUT_TYPES):
        return _transport(types_pb2.TRANSPORT_ERROR_TIMEOUT)
    if isinstance(e, ConnectionRefusedError):
        return _transport(types_pb2.TRANSPORT_ERROR_CONNECTION_REFUSED)
    if isinstance(e, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
        return _transport(types_pb2.TRANSPORT_ERROR_CONNECTION_RESET)
    if isinstance(e, OSError) and e.errno is not None:
        if e.errno == errno.ETIMEDOUT:
            return _transport(types_pb2.TRANSPORT_ERROR_TIMEOUT)
        if e.errno in _RESET_ERRNOS:
            return _transport(types_pb2.TRANSPORT_ERROR_CONNECTION_RESET)
        if e.errno == errno.ECONNREFUSED:
            return _transport(types_pb2.TRANSPORT_ERROR_CONNECTION_REFUSED)
    code = _grpc_code(e)
    if code is not None and 1 <= code <= 16:
        return ClassifiedFailure(failure=types_pb2.Failure(grpc_code=code), pushback=_grpc_pushback(e))
    return None


def _by_name(e: BaseException) -> Optional[ClassifiedFailure]:
    names = {c.__name__ for c in type(e).__mro__}
    for rule, kind in _NAME_RULES:
        if names & rule:
            return _transport(kind)
    if any("Timeout" in n for n in names):
        return _transport(types_pb2.TRANSPORT_ERROR_TIMEOUT)
    if names & _RESET_NAMES:
        return _transport(types_pb2.TRANSPORT_ERROR_CONNECTION_RESET)
    return None


def classify_exception(err: BaseException, timed_out: bool = False) -> ClassifiedFailure:
    """Maps an exception the user's function raised to the failure policyd
    classifies. ``timed_out`` says the attempt overran its own timeout, which
    makes any error other than an HTTP status or a local error a transport
    timeout (as a context deadline does in the Go client)."""
    chain = list(_chain(err))
    for e in chain:
        http = _http(e)
        if http is not None:
            status, headers = http
            if status < 100 or status > 599:
                return ClassifiedFailure(failure=None, unclassified=True, reason=f"unclassified:http_{status}")
            return ClassifiedFailure(failure=types_pb2.Failure(http_status=status), pushback=_pushback(headers))
        if isinstance(e, LocalError) and e.kind != types_pb2.LOCAL_ERROR_UNSPECIFIED:
            return ClassifiedFailure(failure=types_pb2.Failure(local_error=e.kind))
    if timed_out:
        return _transport(types_pb2.TRANSPORT_ERROR_TIMEOUT)
    for e in chain:
        f = _strong(e)
        if f is not None:
            return f
    for e in chain:
        if _is_library(e):
            f = _by_name(e)
            if f is not None:
                return f
    return ClassifiedFailure(failure=None, unclassified=True, reason="unclassified:" + type(err).__name__)
