"""What the HTTP adapters (policyd_client.httpx, policyd_client.requests)
share: which requests are idempotent, the policyd call one request makes,
the failed response carried through the loop, and how a call's result
becomes the adapter's answer. No HTTP library is imported here."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, TypeVar, Union
from urllib.parse import urlsplit, urlunsplit

from ._model import Attempt, Call, Cancelled, Result
from .errors import Deduplicated, HTTPStatusError, RetryError, UnmappedTarget

R = TypeVar("R")

#: The idempotent methods of RFC 9110 (section 9.2.2): retried without a key.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})

#: The header the adapters send the idempotency key in, unless told another.
KEY_HEADER = "Idempotency-Key"

#: A request's policyd target: a fixed name, or a function of the request.
Target = Union[str, Callable[[Any], str], None]

#: A failed response's body up to this size (by its Content-Length) is read
#: before the response is closed, so that its connection goes back to the
#: pool for the next attempt; a larger or unsized one closes the connection.
DRAIN_LIMIT = 64 * 1024


def drainable(headers: Mapping[str, str]) -> bool:
    """Says whether a failed response's body is small enough to read so its
    connection can be reused."""
    n = headers.get("content-length", "")
    return n.isdigit() and int(n) <= DRAIN_LIMIT


class BodyNotReplayable(ValueError):
    """The request's body is a stream that cannot be sent again (a
    generator, an iterator, a file that cannot seek back), so the adapter
    cannot retry it and refuses it before the first attempt. Send the body
    as bytes, or read it into memory first."""


class FailedResponse(HTTPStatusError):
    """An attempt's response with a failing status (400 or more), raised to
    the loop so that it classifies the status and reads the pushback
    headers like any :class:`HTTPStatusError`; the adapter returns
    ``response`` when the call ends on it."""

    def __init__(self, response: Any, status: int, headers: Optional[Mapping[str, str]]) -> None:
        super().__init__(status, headers)
        self.response = response


#: Where each target's attempts go: a base URL (``"https://geo-b.example"``,
#: ``"http://127.0.0.1:8081/v2"``: scheme, host[:port] and a path prefix) or
#: a bare ``"host[:port]"`` (the request's scheme and path are kept).
Hosts = Mapping[str, str]


def check_hosts(hosts: Optional[Hosts], adapter: str) -> dict[str, str]:
    """Returns a copy of an adapter's hosts mapping, validated: every target
    and value non-empty, a base URL with an http or https scheme and a
    host, a bare host without a path."""
    out: dict[str, str] = {}
    for target, base in (hosts or {}).items():
        if not isinstance(target, str) or not target or not isinstance(base, str) or not base:
            raise ValueError(f"{adapter}: hosts must map non-empty target names to non-empty base URLs or hosts")
        if "://" in base:
            u = urlsplit(base)
            if u.scheme not in ("http", "https") or not u.netloc or u.query or u.fragment:
                raise ValueError(f"{adapter}: hosts[{target!r}] = {base!r}: a base URL is http(s)://host[:port][/path]")
        elif "/" in base or "?" in base or "#" in base:
            raise ValueError(f"{adapter}: hosts[{target!r}] = {base!r}: give host[:port], or a base URL with its scheme")
        out[target] = base
    return out


def rewrite_url(url: str, base: str) -> str:
    """Returns url sent to base (a value of :data:`Hosts`): a base URL
    replaces the scheme and the authority and prefixes the path; a bare
    host[:port] replaces the authority only. Query and fragment are kept."""
    u = urlsplit(url)
    if "://" in base:
        b = urlsplit(base)
        return urlunsplit((b.scheme, b.netloc, b.path.rstrip("/") + u.path, u.query, u.fragment))
    return urlunsplit((u.scheme, base, u.path, u.query, u.fragment))


def attempt_url(url: str, hosts: Mapping[str, str], a: Attempt, primary: str) -> str:
    """Returns the URL attempt ``a`` of a call of ``primary`` is sent to: the
    request's own (``url``) for the primary unless ``hosts`` maps it, the
    mapped one for any target ``hosts`` names. A fallback target ``hosts``
    does not name raises :class:`UnmappedTarget`: the attempt is never sent
    to the primary's host instead."""
    base = hosts.get(a.target)
    if base is not None:
        return rewrite_url(url, base)
    if a.target and a.target != primary:
        raise UnmappedTarget(a.target, primary)
    return url


def host_target(host: str, port: Optional[int]) -> str:
    """Returns the default target of a request: its host, with the port
    when the URL names one."""
    return f"{host}:{port}" if port is not None else host


def call_for(
    *,
    method: str,
    target: str,
    key: str,
    submission_id: Optional[str],
    payload: bytes,
    run_id: str,
    idempotent_methods: frozenset[str],
) -> Call:
    """Returns the call one request makes. ``key`` is the idempotency key
    the request already carries (the caller chose it); otherwise a
    submission id derives one from the id and the body (see
    :func:`policyd_client.idempotency_key`); otherwise the request has no
    key, and only an idempotent method is retried."""
    idempotent = method.upper() in idempotent_methods
    if key:
        return Call(target=target, idempotency_key=key, idempotent=idempotent, run_id=run_id)
    if submission_id:
        return Call(target=target, submission_id=submission_id, payload=payload, idempotent=idempotent, run_id=run_id)
    return Call(target=target, idempotent=idempotent, run_id=run_id)


def answer(res: Result[R]) -> R:
    """Returns what an adapter answers for a finished call: the response of
    the last attempt (a success, or the failing response policyd stopped
    on). A transport error the last attempt raised is raised again; a call
    that ended without a response (the breaker refused its first attempt,
    or it was cancelled) raises :class:`RetryError`, and one the
    idempotency ledger answered with an earlier success (no request sent)
    raises :class:`Deduplicated`."""
    if res.deduplicated:
        raise Deduplicated(res)
    if res.ok:
        return res.value  # type: ignore[return-value]
    err = res.error
    if isinstance(err, FailedResponse):
        return err.response  # type: ignore[no-any-return]
    if err is not None and not isinstance(err, Cancelled):
        raise err
    raise RetryError(res) from err
