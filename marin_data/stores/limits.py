"""What a store's answers may cost the client: a listing's size, and a request's time.

- **Listings.** A `ListingBudget` is charged, across every page and every repo of one store's listing
  (the Hub's tree pages, S3's ListObjectsV2 pages, a local walk), one entry per file or folder and the
  bytes of each page (at least `PAGE_MIN_BYTES` a page, so a server paging empty answers forever runs out
  too). Past `list_max_entries()` entries or `list_max_bytes()` bytes the listing is refused with
  `RemoteLimitError`, naming the URL and the bound. A Hub tree page is read to at most `PAGE_MAX_BYTES`.
- **Requests.** A `RequestClock` gives a request `grace_seconds()` plus one second per
  `floor_bytes_per_second()` bytes of body received so far; a request that falls behind is cut
  (`RetryableRemoteError`: retried, then the next mirror). A read never takes more than it asked for, so a
  request for N bytes ends within grace + N / floor, however slowly the server drips (an idle timeout
  alone restarts at every byte). A cut request is a `TooSlowError`.
- **Demotion.** A run with mirrors tries a store after the others once `demote_after()` of its requests in a
  row were too slow, for `demote_seconds()` (`marin_data.stores.order.StoreOrder`).

The defaults fit Marin's scale with room to spare (docs/security.md, "Memory limits"); each can be
changed through the environment (``MARIN_LIST_MAX_ENTRIES``, ``MARIN_LIST_MAX_BYTES``,
``MARIN_REQUEST_GRACE_SECONDS``, ``MARIN_FLOOR_BYTES_PER_SECOND``, ``MARIN_DEMOTE_AFTER``,
``MARIN_DEMOTE_SECONDS``), which tests use to make them small.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

from marin_data.errors import RemoteLimitError, TooSlowError

__all__ = ["LIST_MAX_ENTRIES", "LIST_MAX_BYTES", "PAGE_MAX_BYTES", "PAGE_MIN_BYTES", "REQUEST_GRACE_SECONDS",
           "FLOOR_BYTES_PER_SECOND", "list_max_entries", "list_max_bytes", "grace_seconds",
           "floor_bytes_per_second", "DEMOTE_AFTER", "DEMOTE_SECONDS", "demote_after", "demote_seconds",
           "ListingBudget", "RequestClock", "current_clock"]

# Marin's corpus is ~100,000 shards (23T tokens in 256 MiB-2 GiB shards) plus a few metadata files, split
# over Hub repos of fewer than ~100,000 files each; a Hub tree entry is ~250 bytes of JSON.
LIST_MAX_ENTRIES = 500_000  # 5x that
LIST_MAX_BYTES = 256 << 20  # ~10x its ~25 MB of tree pages
PAGE_MAX_BYTES = 4 << 20  # a Hub tree page holds 1,000 entries, ~250 KB; JSON parsing multiplies what it holds
PAGE_MIN_BYTES = 64 << 10  # what an empty page costs against LIST_MAX_BYTES: at most 4,096 pages
REQUEST_GRACE_SECONDS = 60.0  # for connecting, the answer's head and the first bytes
FLOOR_BYTES_PER_SECOND = 64 << 10  # 512 kbit/s per connection: a slow link still finishes; a drip does not
DEMOTE_AFTER = 3  # requests in a row too slow: one may be a blip, three across a run's workers are not
DEMOTE_SECONDS = 600.0  # before a demoted store is tried first again; doubled each time it fails that trial


def _setting(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        parsed = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number") from None
    if parsed <= 0:
        raise ValueError(f"{name}={value!r} must be positive")
    return parsed


def list_max_entries() -> int:
    return int(_setting("MARIN_LIST_MAX_ENTRIES", LIST_MAX_ENTRIES))


def list_max_bytes() -> int:
    return int(_setting("MARIN_LIST_MAX_BYTES", LIST_MAX_BYTES))


def grace_seconds() -> float:
    return _setting("MARIN_REQUEST_GRACE_SECONDS", REQUEST_GRACE_SECONDS)


def floor_bytes_per_second() -> float:
    return _setting("MARIN_FLOOR_BYTES_PER_SECOND", FLOOR_BYTES_PER_SECOND)


def demote_after() -> int:
    return max(1, int(_setting("MARIN_DEMOTE_AFTER", DEMOTE_AFTER)))


def demote_seconds() -> float:
    return _setting("MARIN_DEMOTE_SECONDS", DEMOTE_SECONDS)


class ListingBudget:
    """What one store's listing may still take, in entries and bytes, over all its pages."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.max_entries, self.max_bytes = list_max_entries(), list_max_bytes()
        self.entries = self.bytes = 0

    def bytes_left(self) -> int:
        return max(0, self.max_bytes - self.bytes)

    def take(self, *, entries: int, nbytes: int, page: bool = False) -> None:
        """Charge ``entries`` and ``nbytes`` (a whole page: at least `PAGE_MIN_BYTES`); refuse past a bound."""
        self.entries += entries
        self.bytes += max(nbytes, PAGE_MIN_BYTES) if page else nbytes
        if self.entries > self.max_entries:
            raise self.exceeded(f"more than {self.max_entries:,} entries")
        if self.bytes > self.max_bytes:
            raise self.exceeded(f"more than {self.max_bytes:,} bytes")

    def exceeded(self, what: str) -> RemoteLimitError:
        return RemoteLimitError(f"the listing is larger than marin accepts ({what}, MARIN_LIST_MAX_ENTRIES / "
                                "MARIN_LIST_MAX_BYTES); refused", path=self.url)


_local = threading.local()


def current_clock() -> RequestClock | None:
    """The clock of the request this thread is waiting on now (`RequestClock.running`), if any."""
    return getattr(_local, "clock", None)


class RequestClock:
    """The time one request may still take: grace + received / floor seconds from its start."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.grace, self.floor = grace_seconds(), floor_bytes_per_second()
        self.t0 = time.monotonic()
        self.received = 0

    def got(self, n: int) -> None:
        self.received += n

    def remaining(self) -> float:
        return self.t0 + self.grace + self.received / self.floor - time.monotonic()

    def late(self) -> TooSlowError:
        elapsed = time.monotonic() - self.t0
        return TooSlowError(
            f"too slow: {self.received:,} bytes in {elapsed:.1f} s, below the floor of "
            f"{self.floor:,.0f} bytes/s after {self.grace:g} s (MARIN_FLOOR_BYTES_PER_SECOND, "
            "MARIN_REQUEST_GRACE_SECONDS)", path=self.where)

    def check(self) -> None:
        if self.remaining() < 0:
            raise self.late()

    @contextlib.contextmanager
    def running(self) -> Iterator[RequestClock]:
        """Mark this thread as waiting on this request, so socket reads wait at most `remaining`."""
        before = current_clock()
        _local.clock = self
        try:
            yield self
        finally:
            _local.clock = before
