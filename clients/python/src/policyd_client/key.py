"""Idempotency keys derived the same way in every client language."""

from __future__ import annotations

import hashlib
from typing import Union

__all__ = ["idempotency_key"]


def idempotency_key(submission_id: str, payload: Union[bytes, str] = b"") -> str:
    """Returns the idempotency key of a submission: the lowercase hex SHA-256
    of the submission id's UTF-8 bytes, one 0x00 byte, and the payload (a str
    payload is encoded as UTF-8). The same submission gives the same key on
    every retry, in every process and in the Go client (``IdempotencyKey``);
    shared test vectors check both.
    """
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    h = hashlib.sha256()
    h.update(submission_id.encode("utf-8"))
    h.update(b"\x00")
    h.update(payload)
    return h.hexdigest()
