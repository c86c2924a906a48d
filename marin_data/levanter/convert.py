"""What converting between the two formats shares, either way: the report, and the checks of where it writes.

`marin_data.levanter.to_marin` turns a Levanter cache or store into a Parquet corpus (one subset per cell),
`marin_data.levanter.to_levanter` a corpus into a store of caches (one cache per subset). Both read every
byte checked (the structural checks, or the SHA-256s of a pinned source) before they write, keep their work
under ``DEST/.staging/`` until a unit is whole, and resume from it when run again (docs/design.md,
"Converting between the formats").
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from marin_data.errors import ConvertConflictError
from marin_data.formats.base import LEVANTER, MARIN, TARGETS
from marin_data.levanter.detect import Source
from marin_data.stores.local import LocalStore
from marin_data.ui import progress

__all__ = ["MARIN", "LEVANTER", "FORMATS", "ConvertReport", "Stopped", "Run", "refuse_inside", "on_threads"]

FORMATS = TARGETS
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class ConvertReport:
    """What a convert did: ``subsets`` converted by this run, ``reused`` ones already whole in the destination
    (nothing redone), ``empty`` cells that hold no documents (a corpus subset has at least one shard)."""

    source: str
    dest: str
    format: str  # what was written: MARIN or LEVANTER
    subsets: tuple[str, ...]
    reused: tuple[str, ...]
    empty: tuple[str, ...]
    docs: int  # of the converted subsets
    tokens: int
    files: int  # Parquet shards, or data chunk files
    bytes: int  # of those files
    seconds: float
    manifest_sha256: str = ""  # a corpus written: its new root of trust


def refuse_inside(found: Source, dest: str | os.PathLike) -> None:
    """Refuse a destination at or inside a local source: what it writes would become part of what it reads.

    Raises:
        ConvertConflictError: it is.
    """
    if isinstance(found.store, LocalStore):
        src, out = found.store.root.resolve(), Path(dest).resolve()
        if out == src or src in out.parents:
            raise ConvertConflictError(f"the destination {dest} lies inside the source {src}", path=str(dest))


class Stopped(Exception):
    """Raised by a unit of `on_threads` work told to stop (`Run.check`); never leaves `on_threads`."""


class Run:
    """What each unit of `on_threads` work is handed: ``count(n)`` moves the run's tokens bar, and ``check()``
    raises `Stopped` once another unit has failed or the run was interrupted."""

    def __init__(self, bar) -> None:
        self._bar, self._lock, self.stop = bar, threading.Lock(), threading.Event()

    def count(self, tokens: int) -> None:
        with self._lock:
            self._bar.update(tokens)

    def check(self) -> None:
        if self.stop.is_set():
            raise Stopped


def on_threads(work: Callable[[T, Run], R], items: Sequence[T], *, workers: int, tokens: int) -> list[R]:
    """``work(item, run)`` for every item, ``workers`` at a time on threads, under one progress bar of
    ``tokens``; the results in order.

    The first error (or an interrupt) stops the other units at their next `Run.check` (their finished steps
    kept for a re-run), cancels those not started and is raised: a failed cell of a 200-cell store stops the
    run at once, not after the other 199.
    """
    with progress(tokens, "converting", "tok", unit_scale=True) as bar, \
            ThreadPoolExecutor(max_workers=max(1, min(workers, len(items)))) as pool:
        run = Run(bar)
        futures = [pool.submit(work, item, run) for item in items]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f.done() and not f.cancelled() and f.exception()), None)
            if failed is not None:
                raise failed.exception()
        except BaseException:
            run.stop.set()
            for f in futures:
                f.cancel()
            raise
    return [f.result() for f in futures]
