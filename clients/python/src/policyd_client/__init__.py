"""policyd_client runs retry loops for Python workers with policyd's
fleet-wide decisions.

A worker hands :meth:`Client.call` (threads) or :meth:`AsyncClient.call`
(asyncio) one function, or decorates it with ``retry``; the client admits each
attempt through the shared circuit breaker (at no RPC cost while the breaker
is CLOSED, thanks to a cache fed by WatchBreakers), applies the per-attempt
timeout, classifies the exception, asks policyd how long to wait or why to
stop, waits, and reports outcomes in the background in batches. When policyd
cannot be reached, or does not answer within the decision timeout, the client
decides with a local copy of the default policy and a local retry budget, and
goes back to policyd once it answers again: the decision service never stalls
a worker. When a target's policy escalates to fallback providers, each
attempt goes where policyd sends it (``Attempt.target``), and the
``fallbacks`` option keeps a local copy of the chain for when policyd is
away. It mirrors the Go client in clients/go/policyclient.

The generated stubs ship with it as the ``retrypolicy.v1`` package.

Adapters put the same loop where a worker already is, each in a module of
its own that imports its library only when imported (extras ``[httpx]``,
``[requests]``, ``[tenacity]``, ``[celery]``): :mod:`policyd_client.httpx`
(``Transport``, ``AsyncTransport``), :mod:`policyd_client.requests`
(``HTTPAdapter``), :mod:`policyd_client.tenacity` (``Policy``,
``AsyncPolicy``) and :mod:`policyd_client.celery` (``PolicydTask``).
"""

from ._core import Options, Settings, current_attempt
from ._dial import SERVICE_CONFIG
from ._model import (
    Attempt,
    BreakerState,
    Call,
    Cancelled,
    Disposition,
    Event,
    EventHook,
    EventKind,
    Fallback,
    Result,
    Stats,
    StopReason,
)
from .aio import AsyncClient
from .client import Client
from .errors import (
    ClassifiedFailure,
    Deduplicated,
    HTTPStatusError,
    LocalError,
    ParseError,
    RetryError,
    UnmappedTarget,
    ValidationError,
    classify_exception,
)
from .fallback import classify_local, parse_hints, parse_retry_after
from .key import idempotency_key

__all__ = [
    "SERVICE_CONFIG",
    "AsyncClient",
    "Attempt",
    "BreakerState",
    "Call",
    "Cancelled",
    "ClassifiedFailure",
    "Client",
    "Deduplicated",
    "Disposition",
    "Event",
    "EventHook",
    "EventKind",
    "Fallback",
    "HTTPStatusError",
    "LocalError",
    "Options",
    "ParseError",
    "Result",
    "Settings",
    "RetryError",
    "Stats",
    "StopReason",
    "UnmappedTarget",
    "ValidationError",
    "classify_exception",
    "classify_local",
    "current_attempt",
    "idempotency_key",
    "parse_hints",
    "parse_retry_after",
]

__version__ = "0.1.0"
