"""The order in which a run tries its stores (the primary, then each mirror), and which of them keep failing.

Everything that reads one corpus from several stores (a download with mirrors, the loader's shard cache,
the files of a pinned Levanter cache) shares one `StoreOrder` per run and tries each file on the stores
`StoreOrder.tries` gives, each under a retry policy that reports every attempt back. A store is *demoted*
when it spends its retries on a file, or when `limits.demote_after()` of its requests in a row are too slow
(`TooSlowError`: below the floor, or silent past a timeout; a success resets the count): it is then tried
after every other store, and a retry loop on it gives up at its next failure when another store is left
for that file. The log says once which store and why. After `limits.demote_seconds()` it is tried first again,
on trial: one more slow request demotes it again, for twice as long.

Demotion only reorders: the order among the stores otherwise stays as given, a demoted store is still
tried when every store before it failed a file (with its retries, except that a request of it too slow
again ends its turn at once), and every file is checked as before. A run with one store keeps its retries
as they are. What a dripping store can still cost a run: docs/security.md, "What a hostile server costs".
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from marin_data.errors import TooSlowError
from marin_data.retry import RetryPolicy
from marin_data.stores import limits
from marin_data.stores.base import Store
from marin_data.ui import printable

__all__ = ["StoreOrder"]

log = logging.getLogger(__name__)


@dataclass
class _Health:
    """How one store of a run is doing."""

    slow: int = 0  # requests in a row cut for time
    demoted_at: float | None = None
    cool_down: float = 0.0  # seconds from `demoted_at` to its trial


class _Book:
    """The health of a run's stores, by position, shared by every `StoreOrder` over them."""

    def __init__(self, urls: list[str], limit: int, cool_down: float, now: Callable[[], float]) -> None:
        self.urls, self.limit, self.base, self.now = urls, limit, cool_down, now
        self.lock = threading.Lock()
        self.health = [_Health(cool_down=cool_down) for _ in urls]

    def ranks(self) -> list[int]:
        """Positions in the order to try them now: healthy first, then demoted ones; each keeps its place among
        its kind. A demoted store whose cool-down has passed gets its place back, on trial."""
        with self.lock:
            for h in self.health:
                if h.demoted_at is not None and self.now() >= h.demoted_at + h.cool_down:
                    h.demoted_at, h.slow, h.cool_down = None, self.limit - 1, 2 * h.cool_down
            return sorted(range(len(self.health)), key=lambda i: self.health[i].demoted_at is not None)

    def succeeded(self, i: int) -> None:
        with self.lock:
            h = self.health[i]
            h.slow = 0
            if h.demoted_at is None:
                h.cool_down = self.base

    def failed(self, i: int, error: BaseException, spent: bool) -> bool:
        """Count a failed attempt on store ``i``; whether it is demoted now."""
        with self.lock:
            h = self.health[i]
            h.slow += isinstance(error, TooSlowError)
            if h.demoted_at is None and (spent or h.slow >= self.limit):
                h.demoted_at = self.now()
                why = "it spent its retries on a file" if spent else f"{h.slow} requests in a row were too slow"
                log.warning("%s: tried after the other stores for the next %.0f s: %s (last: %s)",
                            printable(self.urls[i]), h.cool_down, why, printable(error))
            return h.demoted_at is not None


@dataclass(frozen=True)
class _Watch:
    """A `marin_data.retry.Watch` of one store's attempts at one file."""

    book: _Book
    at: int
    others_left: bool  # another store is left to try for this file

    def succeeded(self) -> None:
        self.book.succeeded(self.at)

    def failed(self, error: BaseException, *, spent: bool) -> bool:
        demoted = self.book.failed(self.at, error, spent)
        return demoted and (self.others_left or isinstance(error, TooSlowError))


class StoreOrder:
    """The stores of one run, as given (the primary first, then the mirrors), and the order to try them in.

    Args:
        stores: the primary, then each mirror.
        demote_after: slow requests in a row that demote a store (default `limits.demote_after()`).
        cool_down: seconds before a demoted store is tried first again (default `limits.demote_seconds()`).
        now: the clock (tests pass their own).
    """

    def __init__(self, stores: Sequence[Store], *, demote_after: int | None = None, cool_down: float | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.stores = tuple(stores)
        self._book = _Book([s.url for s in self.stores],
                           demote_after if demote_after is not None else limits.demote_after(),
                           cool_down if cool_down is not None else limits.demote_seconds(), now)

    @classmethod
    def of(cls, stores: StoreOrder | Sequence[Store]) -> StoreOrder:
        """``stores`` if it is an order already (its run's health shared), else a new order over them."""
        return stores if isinstance(stores, StoreOrder) else cls(stores)

    @property
    def primary(self) -> Store:
        return self.stores[0]

    def using(self, wrap: Callable[[Store], Store]) -> StoreOrder:
        """The same order over each store wrapped (`marin_data.transfer.versions.versioned`), sharing its health."""
        other = copy.copy(self)
        other.stores = tuple(wrap(s) for s in self.stores)
        return other

    def tries(self, policy: RetryPolicy) -> Iterator[tuple[Store, RetryPolicy]]:
        """The stores to try one file on, in the order of now, each with ``policy`` reporting its attempts (and
        giving up early on a demoted store while another store is left). One store: ``policy`` as it is."""
        if len(self.stores) == 1:
            yield self.stores[0], policy
            return
        ranks = self._book.ranks()
        for n, i in enumerate(ranks):
            yield self.stores[i], replace(policy, watch=_Watch(self._book, i, n < len(ranks) - 1))

    def __repr__(self) -> str:
        return f"StoreOrder({[s.url for s in self.stores]!r})"
