"""The one retry helper: bounded, jittered exponential backoff that honours ``Retry-After``.

Every remote call of marin_data (S3 today, the Hugging Face mirror later) goes through `retry_call`, so there
is exactly one place that decides what is transient, how long to wait and when to give up. botocore's own
retries are switched off in `marin_data.stores.s3` for that reason: they ignore ``Retry-After`` and would
multiply with ours.

A store turns a failed request into a typed error: `marin_data.errors.RetryableRemoteError` for a dropped
connection, a truncated body or a status in `RETRY_STATUSES` (with the server's ``Retry-After``), and
`marin_data.errors.RemoteError` for everything retrying cannot fix (403, 404, a bad URL).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime
from typing import Protocol, TypeVar

from marin_data.errors import RemoteError, RetryableRemoteError
from marin_data.ui import printable

__all__ = ["RETRY_STATUSES", "RetryPolicy", "Watch", "DEFAULT_POLICY", "policy_from_env", "retry_call",
           "parse_retry_after", "status_error"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# 429 Too Many Requests / SlowDown and the 5xx a healthy store returns under load or during a deploy.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class Watch(Protocol):
    """Told of every attempt of a `retry_call` (`marin_data.stores.order`: how a store is doing)."""

    def succeeded(self) -> None: ...

    def failed(self, error: BaseException, *, spent: bool) -> bool:
        """Count an attempt that failed with a retryable ``error`` (``spent``: the last one the policy
        allows); True gives up now, before any wait."""


@dataclass(frozen=True)
class RetryPolicy:
    """How `retry_call` retries. The defaults are huggingface_hub's ``http_backoff`` knobs."""

    max_retries: int = 5  # retries after the first attempt; then the error propagates (next mirror)
    base_wait: float = 1.0  # seconds before the first retry; doubled each time
    max_wait: float = 8.0  # cap on one backoff wait
    jitter: float = 0.5  # each backoff wait is drawn from [(1 - jitter) * w, w]: clients that failed together
    #                      do not all come back together
    max_retry_after: float = 60.0  # a server's Retry-After is obeyed up to this many seconds
    retry_on: tuple[type[BaseException], ...] = (RetryableRemoteError,)  # exception types worth a retry
    retry_statuses: frozenset[int] = RETRY_STATUSES  # an error with an HTTP status retries only on these
    watch: Watch | None = None  # told of each attempt, may cut the retries short (a store tried after others)

    def should_retry(self, exc: BaseException) -> bool:
        if not isinstance(exc, self.retry_on):
            return False
        status = getattr(exc, "status", None)
        return status is None or status in self.retry_statuses

    def wait(self, retry: int, exc: BaseException | None = None) -> float:
        """Seconds to sleep before retry number ``retry`` (1-based) after ``exc``."""
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            return max(0.0, min(float(retry_after), self.max_retry_after))
        w = min(self.max_wait, self.base_wait * 2 ** (retry - 1))
        return w * (1 - self.jitter * random.random())


def policy_from_env() -> RetryPolicy:
    """`RetryPolicy` with ``MARIN_MAX_RETRIES`` (retries after the first attempt) and ``MARIN_RETRY_WAIT``
    (seconds before the first retry; the longest backoff is 8x it, a server's ``Retry-After`` is obeyed up
    to 60x it) applied when set: ``MARIN_MAX_RETRIES=0`` fails over to the next mirror at once."""
    policy = RetryPolicy()
    retries, wait = os.environ.get("MARIN_MAX_RETRIES"), os.environ.get("MARIN_RETRY_WAIT")
    try:
        if retries is not None:
            policy = replace(policy, max_retries=max(0, int(retries)))
        if wait is not None:
            policy = replace(policy, base_wait=max(0.0, float(wait)), max_wait=8 * max(0.0, float(wait)),
                             max_retry_after=60 * max(0.0, float(wait)))
    except ValueError:
        raise ValueError(f"MARIN_MAX_RETRIES={retries!r} / MARIN_RETRY_WAIT={wait!r}: not numbers") from None
    return policy


DEFAULT_POLICY = policy_from_env()


def retry_call(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy = DEFAULT_POLICY,
    what: str = "request",
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn()`` until it returns, retrying the errors ``policy`` deems transient.

    Args:
        fn: the attempt. It must be safe to repeat (a resumable download continues where the last attempt
            stopped, because its state lives outside ``fn``).
        policy: the knobs.
        what: names the operation in the ``Retrying in Xs [n/N]`` log line.
        sleep: injectable for tests.

    Returns:
        What ``fn`` returned.

    Raises:
        The last error once ``policy.max_retries`` retries are spent (or ``policy.watch`` gave up), or at
        once an error not worth retrying.
    """
    retry = 0
    while True:
        try:
            result = fn()
        except BaseException as e:
            if not policy.should_retry(e):
                raise
            spent = retry >= policy.max_retries
            if (policy.watch is not None and policy.watch.failed(e, spent=spent)) or spent:
                raise
            retry += 1
            wait = policy.wait(retry, e)
            said = e.message if getattr(e, "path", None) == what and hasattr(e, "message") else e
            log.warning("%s: %s. Retrying in %.1fs [%d/%d]", printable(what), printable(said), wait, retry,
                        policy.max_retries)
            sleep(wait)
        else:
            if policy.watch is not None:
                policy.watch.succeeded()
            return result


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None when absent or garbled."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


def status_error(message: str, *, status: int | None, path: str, retry_after: float | None = None) -> RemoteError:
    """The typed error for a failed request: retryable for connection failures (no status) and
    `RETRY_STATUSES`, final otherwise."""
    retryable = status is None or status in RETRY_STATUSES
    cls = RetryableRemoteError if retryable else RemoteError
    return cls(message, path=path, status=status, retry_after=retry_after)
