"""Which rows of each global batch a rank reads: by position, or grouped by shard.

The global batch that starts at stream position ``P`` is the positions ``[P, P + W·b)`` (`dataset`): the
rows the W ranks compute one step's gradient on, and what a checkpoint counts. How they are dealt to the
ranks changes neither the summed gradient, nor the resume position, nor the stream — but it decides what
each rank has to read:

- ``"position"``: rank ``r`` takes ``[P + r·b, P + (r+1)·b)``. Every rank's rows are a sample of the whole
  mixture. But a step's rows come from every shard being read (at Marin's scale ~200 subsets x
  ``shuffle_window`` shards, ~800), so over a pass *every rank reads every shard*: from a remote corpus each
  rank fetches the whole run's data, W times over in all (docs/scale.md).
- ``"shard"``: the global batch's rows are sorted by where they are read (subset, then token offset: a shard
  is a run of its subset's tokens) and rank ``r`` takes the ``r``-th ``b`` of them, in position order. A
  rank reads only the shards its chunk covers. The chunks stay nearly put from step to step, because the
  mixture gives each subset nearly the same share of every global batch (to within a row when the global
  batch is a whole number of mixture blocks: cumulative apportionment, `mixture`): a shard is read by the
  ranks whose chunks hold its subset's rows, a handful instead of all W (measured at production scale in
  docs/scale.md). The price: a rank's rows come from a few subsets, not
  from the whole mixture (the global batch still does), and each rank locates all ``W·b`` rows of a step
  instead of its ``b``.

With one rank the two are the same. `TokenStream.rank_rows` picks ``"shard"`` for remote corpora (fetching
is what costs) and ``"position"`` for local ones, unless `LoaderConfig.rank_rows` says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["RANK_ROWS", "Locates", "RankRows"]

RANK_ROWS = ("position", "shard")


class Locates(Protocol):
    """What dealing rows by shard needs of a stream (`marin_data.loader.stream.TokenStream` is one)."""

    def locate(self, positions: np.ndarray, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        """``(subset index, first stream token of the window)`` of each of ``positions``, as int64 arrays."""


@dataclass(frozen=True)
class RankRows:
    """Rank ``rank`` of ``world_size``, ``batch_size`` rows per step, dealt ``by`` one of `RANK_ROWS`."""

    rank: int
    world_size: int
    batch_size: int
    by: str = "position"

    def __post_init__(self) -> None:
        if self.by not in RANK_ROWS:
            raise ValueError(f"rank rows must be one of {RANK_ROWS}, got {self.by!r}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, {self.world_size})")

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def rows(self, stream: Locates, start: int, split: str = "train") -> range | np.ndarray:
        """The stream positions this rank reads of the global batch that starts at ``start``, ascending."""
        b = self.batch_size
        if self.by == "position" or self.world_size == 1:
            return range(start + self.rank * b, start + (self.rank + 1) * b)
        return self.deal(stream, start, split)[self.rank]

    def deal(self, stream: Locates, start: int, split: str = "train") -> np.ndarray:
        """Every rank's rows of the global batch at ``start``: ``[W, b]``, row ``r`` rank ``r``'s, ascending."""
        positions = np.arange(start, start + self.global_batch, dtype=np.int64)
        if self.by == "shard":
            subset, token = stream.locate(positions, split)
            positions = positions[np.lexsort((token, subset))]  # stable; a window lies in one shard: shards are runs
        return np.sort(positions.reshape(self.world_size, self.batch_size), axis=1)

    def batch_start(self, index: np.ndarray, position: int) -> int:
        """The start of the global batch holding a batch of rows ``index``, given that it starts at
        ``position`` or a whole number of global batches after it."""
        first = int(np.min(index))
        return position + (first - position) // self.global_batch * self.global_batch
