"""httpx transports that run every request through policyd's retry loop
(``pip install 'policyd-client[httpx]'``)::

    transport = policyd_client.httpx.Transport(client)
    http = httpx.Client(transport=transport)
    resp = http.get("https://geo.example/search", params={"q": "Paris"})

:class:`Transport` (for ``httpx.Client``, driven by a
:class:`policyd_client.Client`) and :class:`AsyncTransport` (for
``httpx.AsyncClient``, driven by a :class:`policyd_client.AsyncClient`)
wrap an inner transport (default ``httpx.HTTPTransport()`` /
``httpx.AsyncHTTPTransport()``). Each request is one policyd call: every
attempt is admitted through the fleet-wide breaker; a response of status 400
or more is a failure, classified by its status with its pushback headers
(``Retry-After``, ``grpc-retry-pushback-ms``, ``X-RateLimit-Reset``,
``x-amz-retry-after``) passed to policyd, which never retries earlier than
the server asked; a transport error (timeout, reset, refused) is classified
as the client classifies exceptions. Each attempt's httpx timeouts are
capped by policyd's per-attempt timeout.

The answer is the last attempt's response, its body unread and readable
(the success, or the failing response policyd stopped on, which
``raise_for_status()`` turns into an ``httpx.HTTPStatusError`` as usual);
the last attempt's transport error is raised again; a call the breaker
refused before any attempt raises :class:`policyd_client.RetryError`; a
write whose key the idempotency ledger holds as SUCCEEDED (an earlier
attempt, in this process or another, succeeded) is not sent and raises
:class:`policyd_client.Deduplicated`, whose ``result_ref`` is the earlier
attempt's result reference.

Idempotency: GET, HEAD, OPTIONS, TRACE, PUT and DELETE are idempotent and
retried as such. A request that carries the key header (``key_header``,
default ``Idempotency-Key``) keeps its key; one with a submission id
(``extensions={"policyd_submission_id": "doc-17"}``, or the
``submission_id`` function) gets the key derived from the id and the body,
as :func:`policyd_client.idempotency_key` derives it, the same on every
attempt and in every process, sent in the key header. Without either, a POST
or PATCH is not retried (policyd stops it as not idempotent). A keyed POST
or PATCH claims its key in policyd's idempotency ledger before each attempt:
after a timeout, a reset or a 504 its outcome is unknown, and the retry is
dead-lettered (``idempotency:unknown``; the last transport error or the 504
is the answer) unless the target's policy sets ``upstream_dedupes_by_key``.

Bodies are replayed: bytes (``content=``, ``json=``, ``data=``) as they
are, a multipart body read into memory once. A streaming body (a generator
or an iterator) cannot be sent twice and is refused before the first
attempt with :class:`BodyNotReplayable`.

Fallback targets: when the target's policy escalates to fallback providers
(``fallback``), policyd may send an attempt to another target than the
request's. ``hosts`` maps each target to where its attempts go, a base URL
(``{"geo-b": "https://geo-b.example/v2"}``: scheme, host[:port] and a path
prefix put before the request's path) or a bare ``host[:port]`` (the
request's scheme and path kept); the request's URL and ``Host`` header are
rewritten for that attempt, its query, headers, key and body kept. The
primary keeps the request's URL unless ``hosts`` names it too. An attempt
sent to a target ``hosts`` does not name is not sent anywhere: the call
ends ``failed_terminal`` and :class:`policyd_client.UnmappedTarget` is
raised.
"""

from __future__ import annotations

from typing import Callable, Optional

import httpx

from ._http import (
    IDEMPOTENT_METHODS,
    KEY_HEADER,
    BodyNotReplayable,
    FailedResponse,
    Hosts,
    Target,
    answer,
    attempt_url,
    call_for,
    check_hosts,
    drainable,
    host_target,
)
from ._model import Attempt, Call
from .aio import AsyncClient
from .client import Client
from .errors import UnmappedTarget
from .key import idempotency_key

__all__ = ["AsyncTransport", "BodyNotReplayable", "Hosts", "Transport", "SUBMISSION_EXTENSION", "UnmappedTarget"]

#: The request extension that names a request's submission id.
SUBMISSION_EXTENSION = "policyd_submission_id"


def _discard(resp: httpx.Response) -> None:
    """Closes a failed response policyd did not stop on, reading a small
    body first so the connection is reused."""
    try:
        if drainable(resp.headers):
            resp.read()
    except httpx.HTTPError:
        pass
    finally:
        resp.close()


async def _adiscard(resp: httpx.Response) -> None:
    """_discard, for the async transport."""
    try:
        if drainable(resp.headers):
            await resp.aread()
    except httpx.HTTPError:
        pass
    finally:
        await resp.aclose()


def _submission_from_extension(request: httpx.Request) -> Optional[str]:
    v = request.extensions.get(SUBMISSION_EXTENSION)
    return str(v) if v else None


class _Requests:
    """What both transports do to a request around the loop."""

    def __init__(
        self,
        target: Target,
        key_header: str,
        submission_id: Optional[Callable[[httpx.Request], Optional[str]]],
        run_id: str,
        idempotent_methods: frozenset[str],
        hosts: Optional[Hosts],
    ) -> None:
        self._hosts = check_hosts(hosts, "policyd_client.httpx")
        self._target = target
        self._key_header = key_header
        self._submission_id = submission_id or _submission_from_extension
        self._run_id = run_id
        self._idempotent_methods = idempotent_methods

    @staticmethod
    def replayable(request: httpx.Request) -> bool:
        """Says whether the body is in memory; refuses a streaming one. A
        multipart body (False) must be read into memory by the caller."""
        stream = request.stream
        if isinstance(stream, httpx.ByteStream):
            return True
        if type(stream).__name__ == "MultipartStream":
            return False
        raise BodyNotReplayable(
            f"policyd_client.httpx: the body of {request.method} {request.url} is a stream "
            f"({type(stream).__name__}), which cannot be sent again for a retry; send it as bytes "
            "(content=...) or read it first (request.read())"
        )

    def call(self, request: httpx.Request) -> Call:
        """Returns the call the request makes, and sets its key header."""
        if callable(self._target):
            target = self._target(request)
        else:
            target = self._target or host_target(request.url.host, request.url.port)
        key = request.headers.get(self._key_header, "") if self._key_header else ""
        call = call_for(
            method=request.method, target=target, key=key, submission_id=self._submission_id(request),
            payload=request.content, run_id=self._run_id, idempotent_methods=self._idempotent_methods,
        )
        if self._key_header and not key and call.submission_id:
            request.headers[self._key_header] = idempotency_key(call.submission_id, call.payload)
        return call

    def attempts(self, request: httpx.Request, primary: str) -> Callable[[Attempt], httpx.Request]:
        """Returns a function that readies the request for an attempt of a
        call of primary: its URL and Host header those of the attempt's
        target (see ``hosts``), its timeouts (as the caller set them) capped
        by the attempt's."""
        given = dict(request.extensions.get("timeout") or {})
        url, host = str(request.url), request.headers.get("Host")

        def ready(a: Attempt) -> httpx.Request:
            to = attempt_url(url, self._hosts, a, primary)
            if to != str(request.url):
                request.url = httpx.URL(to)
                if host is not None:
                    request.headers["Host"] = host if to == url else request.url.netloc.decode("ascii")
            if a.timeout > 0:
                t = {phase: a.timeout if given.get(phase) is None else min(float(given[phase]), a.timeout)
                     for phase in ("connect", "read", "write", "pool")}
                request.extensions = {**request.extensions, "timeout": t}
            return request

        return ready


class Transport(httpx.BaseTransport):
    """An ``httpx.BaseTransport`` that runs each request through ``client``'s
    retry loop over ``inner`` (default ``httpx.HTTPTransport()``, closed with
    this transport); see the module doc. ``target`` is the policyd target
    (default the request's host[:port]; or a function of the request);
    ``key_header`` the idempotency-key header ("" to send none);
    ``submission_id(request)`` a request's submission id (default its
    ``policyd_submission_id`` extension); ``run_id`` the batch run the
    retries spend; ``idempotent_methods`` the methods retried without a
    key; ``hosts`` where each target's attempts go (a base URL or a
    host[:port]; see the module doc: a fallback target without one raises
    :class:`policyd_client.UnmappedTarget`). Safe for concurrent use, as
    ``client`` and ``inner`` are."""

    def __init__(
        self,
        client: Client,
        inner: Optional[httpx.BaseTransport] = None,
        *,
        target: Target = None,
        key_header: str = KEY_HEADER,
        submission_id: Optional[Callable[[httpx.Request], Optional[str]]] = None,
        run_id: str = "",
        idempotent_methods: frozenset[str] = IDEMPOTENT_METHODS,
        hosts: Optional[Hosts] = None,
    ) -> None:
        self._client = client
        self._inner = inner if inner is not None else httpx.HTTPTransport()
        self._requests = _Requests(target, key_header, submission_id, run_id, idempotent_methods, hosts)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not self._requests.replayable(request):
            request.read()
        call = self._requests.call(request)
        ready = self._requests.attempts(request, call.target)
        failed: list[httpx.Response] = []  # the last failed response, open until the next attempt

        def attempt(a: Attempt) -> httpx.Response:
            while failed:
                _discard(failed.pop())
            resp = self._inner.handle_request(ready(a))
            if resp.status_code >= 400:
                failed.append(resp)
                raise FailedResponse(resp, resp.status_code, resp.headers)
            return resp

        try:
            out = answer(self._client.call(call, attempt))
        except BaseException:
            for r in failed:
                r.close()
            raise
        return out

    def close(self) -> None:
        self._inner.close()


class AsyncTransport(httpx.AsyncBaseTransport):
    """:class:`Transport` for ``httpx.AsyncClient``, driven by an
    :class:`policyd_client.AsyncClient` over ``inner`` (default
    ``httpx.AsyncHTTPTransport()``). Each attempt also runs under policyd's
    per-attempt timeout (``asyncio.wait_for``)."""

    def __init__(
        self,
        client: AsyncClient,
        inner: Optional[httpx.AsyncBaseTransport] = None,
        *,
        target: Target = None,
        key_header: str = KEY_HEADER,
        submission_id: Optional[Callable[[httpx.Request], Optional[str]]] = None,
        run_id: str = "",
        idempotent_methods: frozenset[str] = IDEMPOTENT_METHODS,
        hosts: Optional[Hosts] = None,
    ) -> None:
        self._client = client
        self._inner = inner if inner is not None else httpx.AsyncHTTPTransport()
        self._requests = _Requests(target, key_header, submission_id, run_id, idempotent_methods, hosts)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not self._requests.replayable(request):
            await request.aread()
        call = self._requests.call(request)
        ready = self._requests.attempts(request, call.target)
        failed: list[httpx.Response] = []  # the last failed response, open until the next attempt

        async def attempt(a: Attempt) -> httpx.Response:
            while failed:
                await _adiscard(failed.pop())
            resp = await self._inner.handle_async_request(ready(a))
            if resp.status_code >= 400:
                failed.append(resp)
                raise FailedResponse(resp, resp.status_code, resp.headers)
            return resp

        try:
            out = answer(await self._client.call(call, attempt))
        except BaseException:
            for r in failed:
                await r.aclose()
            raise
        return out

    async def aclose(self) -> None:
        await self._inner.aclose()
