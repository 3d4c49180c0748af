"""A Celery task base whose retries policyd decides
(``pip install 'policyd-client[celery]'``)::

    client = policyd_client.Client("127.0.0.1:50051", tenant="acme")

    @app.task(bind=True, base=PolicydTask, policyd_client=client, policyd_target="grants")
    def submit(self, doc_id: str, body: bytes) -> str: ...

Each execution of a :class:`PolicydTask` is one attempt of one policyd call,
named by the task id (the same on every retry, in whichever worker process
runs it): the attempt is admitted through the fleet-wide breaker, the body
(``run``) is called, and what it raises is classified as the client
classifies exceptions and sent to policyd (or decided locally when policyd
cannot answer in time). When policyd says retry, the task calls
``self.retry(exc=..., countdown=<policyd's delay>)``, so the worker is free
during the wait and the retry may run in another process; when it says
stop, the task fails with the last exception (a call that ended before its
attempt ran, with :class:`CallRefused`: refused by the breaker, its deadline
passing during a cool-down, its run past its cut-off, or its key's previous
outcome unknown). A task with a key (``policyd_submission``, not
idempotent) claims it in policyd's idempotency ledger before each attempt:
when an earlier execution of the key succeeded, the body is not run and
the task returns that execution's result reference (the string it
returned); after a timeout, a reset or a 504 the next execution fails with
``CallRefused`` (``dead_letter``, ``idempotency:unknown``) unless the
target's policy sets ``upstream_dedupes_by_key``. Successes and final dispositions are
reported in the background, as by :meth:`Client.call`. The attempt number
(``request.retries + 1``), the call's origin time, the last delay and the
target of the next attempt travel with the retry in the ``policyd`` message
header, so the deadline and the attempt limit count from the first
execution, and an execution after an escalation goes to the fallback.

Fallback targets: when the target's policy escalates (``fallback``), an
execution's attempt may go to a fallback target instead of
``policyd_target``: ``current_attempt().target`` inside the task says where
this execution's attempt goes (the primary, or the fallback policyd named);
the body sends it there (a mapping from target to base URL, say, or one of
the HTTP adapters with ``hosts``). A retry scheduled onto a fallback carries
it in the header (``target``), so the next execution, in whichever worker,
goes there too.

Options (task options or class attributes): ``policyd_client`` (a
:class:`policyd_client.Client`, or a function returning one: make it per
worker process, or before the fork: a client dials on first use),
``policyd_target`` (default the task's name), ``policyd_idempotent``,
``policyd_run_id``, ``policyd_deadline_after`` (seconds from the first
execution) and ``policyd_submission`` (a function of the task's arguments
returning the (submission id, payload) the idempotency key is derived from;
``current_attempt().idempotency_key`` inside the task is the same on every
retry). ``max_retries`` is None: policyd bounds the attempts. Do not combine
with ``autoretry_for``; a ``self.retry()`` or ``Ignore``/``Reject`` the body
raises itself passes through untouched.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Optional, Union

import celery
from celery.exceptions import TaskPredicate

from . import _loop
from ._model import Attempt, Call
from .client import Client

__all__ = ["HEADER", "CallRefused", "PolicydTask"]

#: The message header that carries a call's state across retries.
HEADER = "policyd"

_NEVER = threading.Event()


class CallRefused(Exception):
    """A task execution policyd ended before its attempt ran: the breaker
    refused it (``disposition`` ``circuit_open``), a cool-down would pass
    its deadline (``dead_letter``) or its run's cut-off (``deadline_cut``),
    its run is past its cut-off (``deadline_cut``, ``run:cutoff``), or the
    previous attempt's outcome is unknown and the upstream does not
    deduplicate (``dead_letter``, ``idempotency:unknown``). Its arguments are plain strings, so a
    result backend stores it and the caller gets it back as it was."""

    def __init__(self, message: str, disposition: str = "", reason: str = "") -> None:
        super().__init__(message, disposition, reason)
        self.disposition = disposition
        self.reason = reason

    def __str__(self) -> str:
        return str(self.args[0])


class PolicydTask(celery.Task):  # type: ignore[type-arg]
    """A task base class whose retries ask policyd for the countdown; see
    the module doc."""

    max_retries: Optional[int] = None
    policyd_client: Union[Client, Callable[[], Client], None] = None
    policyd_target: str = ""
    policyd_idempotent: bool = False
    policyd_run_id: str = ""
    policyd_deadline_after: Optional[float] = None
    policyd_submission: Optional[Callable[..., tuple[str, Union[bytes, str]]]] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A plain function given as a task option is a function of the
        # task's arguments, not a method.
        sub = cls.__dict__.get("policyd_submission")
        if sub is not None and not isinstance(sub, (staticmethod, classmethod)):
            cls.policyd_submission = staticmethod(sub)

    def _policyd(self) -> Client:
        c = self.policyd_client
        if c is None:
            raise TypeError(f"policyd_client: task {self.name} has no policyd_client")
        return c if isinstance(c, Client) else c()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        client = self._policyd()
        core = client._core
        req = self.request
        carried: dict[str, Any] = req.get(HEADER) or {}
        origin = float(carried.get("origin", core.now()))
        sid, payload = self.policyd_submission(*args, **kwargs) if self.policyd_submission is not None else ("", b"")
        call = Call(
            target=self.policyd_target or self.name, submission_id=sid, payload=payload,
            idempotent=self.policyd_idempotent, run_id=self.policyd_run_id, call_id=req.id or "",
            deadline=origin + self.policyd_deadline_after if self.policyd_deadline_after is not None else None,
        )

        def body(_: Attempt) -> Any:
            return self.run(*args, **kwargs)

        st = core.begin(call, body)
        st.info = dataclasses.replace(st.info, origin=origin)
        st.attempts = int(req.retries or 0)
        st.prev = float(carried.get("prev", 0.0))
        st.target = str(carried.get("target") or st.info.target)
        reporter, stub = client._start()
        loop = _loop.run(core, st)
        reply: Any = None
        error: Optional[Exception] = None
        while True:
            try:
                effect = loop.send(reply)
            except StopIteration as done:
                res = done.value
                break
            if isinstance(effect, _loop.Sleep):
                if error is None:  # a cool-down before the attempt: waited out here
                    client._sleep(effect.seconds, _NEVER)
                    reply = False
                    continue
                # policyd said retry: the wait is Celery's, the next attempt
                # another execution's.
                loop.close()
                headers = {**(req.headers or {}), HEADER: {"origin": origin, "prev": effect.seconds, "target": st.target}}
                raise self.retry(exc=error, countdown=effect.seconds, headers=headers)
            reply = client._do(effect, body, _NEVER, reporter, stub)
            if isinstance(effect, _loop.Invoke):
                error = reply.error
                if isinstance(error, TaskPredicate):  # the body retries, ignores or rejects itself
                    loop.close()
                    raise error
        if res.ok:
            return res.value
        if isinstance(res.error, Exception):
            raise res.error
        raise CallRefused(
            f"policyd_client: task {self.name} call {res.call_id} ended {res.disposition.value} "
            f"({res.reason}) before attempt {res.attempts + 1} ran", res.disposition.value, res.reason,
        )
