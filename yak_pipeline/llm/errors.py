"""Errors of the LLM layer: every failure carries a one-line ``reason`` fit for a log line or a row.

The reason is what a person reads in the Dagster UI, the audit log or an alert, so it is kept to
one line and never holds the API key (callers pass reasons through :func:`redact` when they build
them from transport errors, which may echo request details).
"""

from __future__ import annotations

import re

# Long enough to quote the start of a bad reply, short enough for a log line or a table cell.
MAX_REASON_CHARS = 500


def one_line(text: object, limit: int = MAX_REASON_CHARS) -> str:
    """``text`` collapsed to a single line of at most ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# The end of a reason that quotes the model's reply (``…: 'Sure! The user lives in …'``).
_QUOTED_REPLY = re.compile(r""":\s*(['"]).*$""", re.DOTALL)


def reason_for_log(reason: str) -> str:
    """``reason`` without the quoted reply it may end with, for logs and alerts.

    A reply is made from someone's memories, so it stays out of log lines and webhooks; the
    memory's stored error (``last_error``, shown by ``/api/queue``) keeps it for diagnosis.
    """
    return _QUOTED_REPLY.sub(": <the reply is not shown>", reason)


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with every non-empty secret replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


class LLMError(Exception):
    """Base of the LLM layer's errors; ``reason`` is one line saying what went wrong.

    ``attempts`` counts the requests the failed call made and ``invalid_outputs`` how many of
    them were answered with invalid output (both ``None`` when not known), so a caller can
    count a real model's malformed answers even when the call gave up.
    """

    def __init__(self, reason: object, *, attempts: int | None = None, invalid_outputs: int | None = None) -> None:
        self.reason = one_line(reason) or type(self).__name__
        self.attempts = attempts
        self.invalid_outputs = invalid_outputs
        super().__init__(self.reason)


class LLMUnavailable(LLMError):
    """The endpoint could not be used: transport errors, timeouts, 429/5xx after all retries.

    ``retryable`` says whether the failure was transient (a later call may succeed).
    """

    def __init__(self, reason: object, *, attempts: int | None = None, retryable: bool = True,
                 invalid_outputs: int | None = None) -> None:
        super().__init__(reason, attempts=attempts, invalid_outputs=invalid_outputs)
        self.retryable = retryable


class LLMRequestRejected(LLMUnavailable):
    """The endpoint refused the request with a 4xx other than 429 (bad model name, bad key …).

    Not retried: asking again would get the same answer. It is an :class:`LLMUnavailable`, so
    callers that only care whether the LLM could be used need not tell the two apart.
    """

    def __init__(self, reason: object, *, attempts: int | None = None, invalid_outputs: int | None = None) -> None:
        super().__init__(reason, attempts=attempts, retryable=False, invalid_outputs=invalid_outputs)


class LLMOutputError(LLMError):
    """The endpoint answered, but the answer was not valid output (not JSON, wrong shape, out of range).

    The reason names the defect, e.g. ``confidence 100 is outside [0, 1]``; the value is rejected,
    never clamped into looking valid.
    """
