"""Levanter's ``MixtureDataset`` in numpy (``levanter/data/mixture.py``): which component, and which of its
sequences, global index ``i`` reads, and the way back.

The mixture is block-deterministic. Block ``b = i // B`` of stage ``t`` holds ``counts[t][c]`` slots of each
component ``c``: ``weight * B`` truncated, the remainder to the largest count. Its slot ids ``(c << 16) + k``
are shuffled by ``jax.random.permutation(fold_in(mix_key, b), ids)``, and id ``(c, k)`` of block ``b`` reads
the component's sequence ``k + (slots of c in every earlier block)``. Stages start at block-aligned global
indices (Levanter rescales a ``[step, weights]`` schedule to indices with the batch schedule first). A weight
below ``1/B`` truncates to no slot at all: that component is never served.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from marin_data.errors import TrainConfigError
from marin_data.levanter.order.jaxperm import permutation
from marin_data.levanter.order.threefry import fold_in

__all__ = ["Mixture", "block_counts", "normalize"]

_ID_BITS = 16


def normalize(weights: Mapping[str, float]) -> dict[str, float]:
    """Levanter's ``_normalize_weights``: divided by their (Python) sum, zeros dropped."""
    total = sum(weights.values())
    if total == 0:
        raise TrainConfigError("the weights of a stage sum to 0")
    if any(w < 0 for w in weights.values()):
        raise TrainConfigError("a weight is negative")
    return {name: w / total for name, w in weights.items() if w > 0}


def block_counts(names: Sequence[str], weights: Mapping[str, float], block_size: int) -> np.ndarray:
    """Slots per block for each component: ``int32(w * B)`` truncated, the remainder to the first largest."""
    counts = np.zeros(len(names), dtype=np.int32)
    for i, name in enumerate(names):
        counts[i] = weights.get(name, 0) * block_size
    counts[np.argmax(counts)] += block_size - counts.sum()
    return counts


@dataclass
class Mixture:
    """The mixture of ``names`` (those with a positive weight in some stage, in config order).

    Args:
        names: every component in config order; those never weighted are dropped, as Levanter drops them.
        stages: ``[(start_index, weights), ...]``, the first at 0, each start a multiple of ``block_size``.
        block_size: ``mixture_block_size`` (below 2**16: ids pack the slot into 16 bits).
        key: ``mix_key``.
    """

    names: list[str]
    stages: list[tuple[int, dict[str, float]]]
    block_size: int
    key: np.ndarray
    counts: np.ndarray = field(init=False)  # [stage, component] slots per block
    before: np.ndarray = field(init=False)  # [stage, component] sequences served before the stage
    starts: np.ndarray = field(init=False)  # [stage] first block

    def __post_init__(self) -> None:
        if self.block_size >= 2**_ID_BITS or self.block_size <= 0:
            raise TrainConfigError(f"mixture_block_size must be in [1, 65535], got {self.block_size}")
        stages = [(int(s), normalize(w)) for s, w in self.stages]
        for (prev, _), (start, _) in zip(stages, stages[1:]):
            if start % self.block_size or start <= prev:
                raise TrainConfigError(f"data.train_weights: a stage starts at sequence {start:,}, which is not a "
                                       f"multiple of mixture_block_size {self.block_size:,} after {prev:,} (Levanter "
                                       "refuses it too)")
        if stages[0][0] != 0:
            raise TrainConfigError("the first stage must start at step 0")
        self.stages = stages
        self.names = [n for n in self.names if any(w.get(n, 0) > 0 for _, w in stages)]
        self.counts = np.stack([block_counts(self.names, w, self.block_size) for _, w in stages]).astype(np.int64)
        self.starts = np.array([s // self.block_size for s, _ in stages], dtype=np.int64)
        blocks = np.diff(self.starts)
        self.before = np.zeros_like(self.counts)
        self.before[1:] = np.cumsum(self.counts[:-1] * blocks[:, None], axis=0)
        self._ids = [self._unpermuted(c) for c in self.counts]
        self._blocks: dict[int, np.ndarray] = {}

    @staticmethod
    def _unpermuted(counts: np.ndarray) -> np.ndarray:
        return np.concatenate([(c << _ID_BITS) + np.arange(n, dtype=np.int64) for c, n in enumerate(counts)])

    def stage_of_block(self, block: np.ndarray) -> np.ndarray:
        return np.maximum(0, np.searchsorted(self.starts, block, side="right") - 1)

    def block(self, b: int) -> np.ndarray:
        """The permuted slot ids of block ``b`` (a few blocks are kept: a step spans at most a few)."""
        if b not in self._blocks:
            if len(self._blocks) >= 32:
                self._blocks.pop(next(iter(self._blocks)))
            ids = self._ids[int(self.stage_of_block(b))]
            self._blocks[b] = permutation(fold_in(self.key, b), ids)
        return self._blocks[b]

    def served_before(self, block: np.ndarray, component: np.ndarray) -> np.ndarray:
        """Sequences of ``component`` served by all blocks before ``block``."""
        stage = self.stage_of_block(block)
        return self.before[stage, component] + (block - self.starts[stage]) * self.counts[stage, component]

    def locate(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global indices -> (component number, dataset index before wrapping)."""
        index = np.asarray(index, dtype=np.int64)
        blocks = index // self.block_size
        ids = np.empty_like(index)
        for b in np.unique(blocks):
            sel = blocks == b
            ids[sel] = self.block(int(b))[index[sel] - b * self.block_size]
        component = ids >> _ID_BITS
        return component, (ids & 0xFFFF) + self.served_before(blocks, component)

    def indices_of(self, component: int, dataset_index: np.ndarray) -> np.ndarray:
        """Global indices at which ``component`` serves each of ``dataset_index`` (before wrapping); -1 where it
        never does (a component with no slot in the stage that would reach it)."""
        out = np.full(np.shape(dataset_index), -1, dtype=np.int64)
        for n, d in enumerate(np.asarray(dataset_index, dtype=np.int64).ravel()):
            found = self._index_of(component, int(d))
            if found is not None:
                out.flat[n] = found
        return out

    def _index_of(self, component: int, d: int) -> int | None:
        for t in range(len(self.stages)):
            per_block, base = int(self.counts[t, component]), int(self.before[t, component])
            if per_block == 0 or d < base:
                continue
            blocks_in = (d - base) // per_block
            if t + 1 < len(self.stages) and blocks_in >= self.starts[t + 1] - self.starts[t]:
                continue
            b = int(self.starts[t]) + blocks_in
            slot = np.flatnonzero(self.block(b) == (component << _ID_BITS) + (d - base) % per_block)
            return b * self.block_size + int(slot[0])
        return None
