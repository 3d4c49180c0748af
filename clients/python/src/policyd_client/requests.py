"""A requests adapter that runs every request through policyd's retry loop
(``pip install 'policyd-client[requests]'``)::

    session = requests.Session()
    session.mount("https://", policyd_client.requests.HTTPAdapter(client))
    resp = session.get("https://geo.example/search", params={"q": "Paris"})

:class:`HTTPAdapter` is a ``requests.adapters.HTTPAdapter`` driven by a
:class:`policyd_client.Client`; it does what ``policyd_client.httpx``'s
transports do (see there): each request is one policyd call, every attempt
admitted through the fleet-wide breaker, a status of 400 or more classified
with its pushback headers (``Retry-After`` and the others) and a transport
error (``requests.ConnectionError``, ``requests.Timeout``) by what it wraps;
each attempt's timeout is capped by policyd's per-attempt timeout; the
answer is the last attempt's response, its body readable (the success, or
the failing response policyd stopped on); the last attempt's transport error
is raised again, a call the breaker refused before any attempt raises
:class:`policyd_client.RetryError`, and a keyed write the idempotency ledger
answered with an earlier success is not sent and raises
:class:`policyd_client.Deduplicated` (``result_ref``: that success's result
reference). A keyed POST or PATCH whose previous attempt's outcome is
unknown (a timeout, a reset, a 504) is dead-lettered
(``idempotency:unknown``) unless the target's policy sets
``upstream_dedupes_by_key``. urllib3's own retries stay off.

Idempotency: GET, HEAD, OPTIONS, TRACE, PUT and DELETE are retried as
idempotent; a request carrying the key header (``key_header``, default
``Idempotency-Key``) keeps its key; ``submission_id(request)`` names a
request's submission, from which the key is derived with the body, as
:func:`policyd_client.idempotency_key` derives it, and sent in the key
header. Bytes and str bodies are replayed as they are, a seekable file is
rewound before each attempt (its key is derived from the submission id
alone: the file is not read for it), and a generator or any other stream
is refused before the first attempt with :class:`BodyNotReplayable`.

Fallback targets: ``hosts`` maps each target to where its attempts go, a
base URL (scheme, host[:port], path prefix) or a bare host[:port], as for
``policyd_client.httpx``: an attempt policyd sends to a fallback target
goes to its URL (query, headers, key and body kept); the primary keeps the
request's URL unless ``hosts`` names it; an attempt to a target ``hosts``
does not name is not sent, the call ends ``failed_terminal`` and
:class:`policyd_client.UnmappedTarget` is raised. The adapter serves the
fallback's URL whatever it was mounted for.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Union
from urllib.parse import urlsplit

import requests
import requests.adapters
from requests.utils import rewind_body

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
from ._model import Attempt
from .client import Client
from .errors import UnmappedTarget
from .key import idempotency_key

__all__ = ["BodyNotReplayable", "HTTPAdapter", "Hosts", "UnmappedTarget"]


def _cap(timeout: Any, limit: float) -> Any:
    """Caps a requests timeout (seconds, (connect, read), or None) by
    limit seconds; a urllib3 Timeout object is kept as it is."""
    if limit <= 0:
        return timeout
    if timeout is None:
        return limit
    if isinstance(timeout, (int, float)):
        return min(float(timeout), limit)
    if isinstance(timeout, tuple) and len(timeout) == 2:
        return tuple(limit if t is None else min(float(t), limit) for t in timeout)
    return timeout


def _payload(request: requests.PreparedRequest) -> bytes:
    """Returns the body as the key's payload; refuses a body that cannot be
    sent again. A seekable file's payload is empty: it is not read."""
    body: Any = request.body
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    position = getattr(request, "_body_position", None)
    if isinstance(position, int) and callable(getattr(body, "seek", None)):
        return b""
    raise BodyNotReplayable(
        f"policyd_client.requests: the body of {request.method} {request.url} is a stream "
        f"({type(body).__name__}), which cannot be sent again for a retry; send it as bytes (data=...) "
        "or as a seekable file"
    )


def _discard(resp: requests.Response) -> None:
    """Closes a failed response policyd did not stop on, reading a small
    body first so the connection is reused."""
    try:
        if drainable(resp.headers):
            resp.content  # noqa: B018  (reads the body)
    except requests.RequestException:
        pass
    finally:
        resp.close()


class HTTPAdapter(requests.adapters.HTTPAdapter):
    """A ``requests`` transport adapter that runs each request through
    ``client``'s retry loop; mount it on a Session. ``target`` is the policyd
    target (default the request's host[:port]; or a function of the
    PreparedRequest); ``key_header`` the idempotency-key header ("" to send
    none); ``submission_id(request)`` a request's submission id (default
    none); ``run_id`` the batch run the retries spend;
    ``idempotent_methods`` the methods retried without a key; ``hosts``
    where each target's attempts go (see the module doc). The other
    keyword arguments are HTTPAdapter's (``pool_connections``,
    ``pool_maxsize``, ``pool_block``); ``max_retries`` is 0: policyd
    decides the retries."""

    def __init__(
        self,
        client: Client,
        *,
        target: Target = None,
        key_header: str = KEY_HEADER,
        submission_id: Optional[Callable[[requests.PreparedRequest], Union[str, bytes, None]]] = None,
        run_id: str = "",
        idempotent_methods: frozenset[str] = IDEMPOTENT_METHODS,
        hosts: Optional[Hosts] = None,
        **kwargs: Any,
    ) -> None:
        self._hosts = check_hosts(hosts, "policyd_client.requests")
        super().__init__(max_retries=0, **kwargs)
        self._client = client
        self._target = target
        self._key_header = key_header
        self._submission_id = submission_id
        self._run_id = run_id
        self._idempotent_methods = idempotent_methods

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Union[bool, str] = True,
        cert: Any = None,
        proxies: Optional[Mapping[str, str]] = None,
    ) -> requests.Response:
        payload = _payload(request)
        url = urlsplit(request.url or "")
        if callable(self._target):
            target = self._target(request)
        else:
            target = self._target or host_target(url.hostname or "", url.port)
        given = request.headers.get(self._key_header, "") if self._key_header else ""
        key = given.decode("latin-1") if isinstance(given, bytes) else given
        sid = self._submission_id(request) if self._submission_id is not None else None
        call = call_for(
            method=request.method or "GET", target=target, key=key,
            submission_id=sid.decode("utf-8") if isinstance(sid, bytes) else sid,
            payload=payload, run_id=self._run_id, idempotent_methods=self._idempotent_methods,
        )
        if self._key_header and not key and call.submission_id:
            request.headers[self._key_header] = idempotency_key(call.submission_id, payload)
        rewind = not isinstance(request.body, (bytes, str, type(None)))
        failed: list[requests.Response] = []  # the last failed response, open until the next attempt
        given_url = request.url or ""

        def attempt(a: Attempt) -> requests.Response:
            while failed:
                _discard(failed.pop())
            request.url = attempt_url(given_url, self._hosts, a, call.target)
            if rewind and a.number > 1:
                rewind_body(request)
            resp = super(HTTPAdapter, self).send(
                request, stream=stream, timeout=_cap(timeout, a.timeout), verify=verify, cert=cert,
                proxies=dict(proxies) if proxies is not None else None,
            )
            if resp.status_code >= 400:
                failed.append(resp)
                raise FailedResponse(resp, resp.status_code, resp.headers)
            return resp

        try:
            return answer(self._client.call(call, attempt))
        except BaseException:
            for r in failed:
                r.close()
            raise

