"""Packing: sequences are fixed windows over a subset's concatenated documents, with document boundaries.

**Windows.** A subset's shards, in path order, are one stream of tokens in which every document ends with
EOS. Sequence (window) ``j`` is tokens ``[j·L, j·L + L + 1)`` of that stream, ``L = seq_len``: consecutive
windows overlap by one token, so every input position has a label and no token is skipped as an input.
A subset of ``T`` tokens has ``(T - 1) // L`` windows; the last ``(T - 1) % L`` tokens (fewer than one
sequence) are never served. The grid is the same every epoch — a later epoch reads the same windows in a
new order — so the held-out windows (`holdout`) stay held out.

Windows cross shard boundaries: a window is gathered from as many shards as it spans (usually one, at
most two for production shards of 256 MiB+). Why not stop windows at shard ends: the grid then depends
only on the subset's total tokens, so window ``j`` is found by one ``searchsorted`` over the shards'
cumulative token counts, and no tokens are dropped at each of ~100,000 shard ends. A document never spans
shards, so a shard boundary is always a document boundary.

**Batch contract** (what a model may rely on). For a rank's batch of ``B`` sequences:

- ``input_ids``: ``[B, L]`` int64, tokens ``0..L-1`` of each window.
- ``labels``: ``[B, L]`` int64, tokens ``1..L`` of each window: ``labels[:, p]`` is the token after
  ``input_ids[:, p]``, so ``labels[:, :-1] == input_ids[:, 1:]``. Both are views of one ``[B, L+1]`` buffer.
  At a document's last input position (its EOS) the label is the first token of the next document.
- ``segment_ids``: ``[B, L]`` int32. ``segment_ids[b, p]`` numbers the document that ``input_ids[b, p]``
  belongs to, counting from 0 at the first position of the row, +1 at every document start. A document
  that began in an earlier window is segment 0 of this one. To block attention across documents, let
  position ``p`` attend to ``q <= p`` only if ``segment_ids[b, q] == segment_ids[b, p]``.
- ``positions``: ``[B, L]`` int32, the offset of ``input_ids[b, p]`` from the start of its segment: 0 at
  the row start and at every document start, then 1, 2, ... — use it for rotary/absolute positions so a
  packed document sees the same positions as an unpacked one (a document continued from an earlier window
  restarts at 0, keeping every position ``< L``).
- ``subset``: ``[B]`` int64, the index of each row's subset in ``dataset.subsets``.
- ``index``: ``[B]`` int64, the global stream position of each row (the resume state is counted in these).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np

from marin_data.loader.cache import ShardSource
from marin_data.manifest import ShardRecord

__all__ = ["SubsetTokens", "window_count", "Batch", "new_batch", "pack_rows"]


def window_count(tokens: int, seq_len: int) -> int:
    """Number of complete ``seq_len + 1``-token windows in ``tokens`` tokens (the module docstring)."""
    return max(0, (tokens - 1) // seq_len)


@dataclass(frozen=True)
class SubsetTokens:
    """One subset's token stream as shards: ``O(shards)`` numpy metadata, nothing per document."""

    name: str
    shards: tuple[ShardRecord, ...]  # in path order
    cumulative: np.ndarray  # [shards + 1] int64: shard k holds stream tokens [cumulative[k], cumulative[k+1])

    @classmethod
    def from_shards(cls, name: str, shards: Sequence[ShardRecord]) -> SubsetTokens:
        ordered = tuple(sorted(shards, key=lambda s: s.path))
        counts = np.fromiter((s.tokens for s in ordered), dtype=np.int64, count=len(ordered))
        return cls(name, ordered, np.concatenate(([0], np.cumsum(counts))))

    @property
    def tokens(self) -> int:
        return int(self.cumulative[-1])


@dataclass(frozen=True)
class Batch:
    """Reusable numpy buffers of one batch; `new_batch` allocates, `pack_rows` fills."""

    window: np.ndarray  # [B, L + 1] int64: input_ids = window[:, :-1], labels = window[:, 1:]
    segment_ids: np.ndarray  # [B, L] int32
    positions: np.ndarray  # [B, L] int32
    subset: np.ndarray  # [B] int64
    index: np.ndarray  # [B] int64


def new_batch(rows: int, seq_len: int) -> Batch:
    return Batch(np.empty((rows, seq_len + 1), np.int64), np.empty((rows, seq_len), np.int32),
                 np.empty((rows, seq_len), np.int32), np.empty(rows, np.int64), np.empty(rows, np.int64))


@numba.njit(cache=True, nogil=True)
def _fill(tokens, offsets, lo, hi, window, segment_ids, positions, dst, segment, start):
    """Copy shard tokens ``[lo, hi)`` to ``window[dst:]`` and label their documents.

    ``segment``/``start`` carry the current segment id and the row position where it began from the
    previous piece of the same row; the updated pair is returned.
    """
    n = hi - lo
    for k in range(n):
        window[dst + k] = tokens[lo + k]
    limit = segment_ids.shape[0]
    if dst == 0:
        segment, start = 0, 0
    j = np.searchsorted(offsets, lo)  # the first document start >= lo
    p = dst
    while True:
        b = dst + n
        if j < offsets.shape[0] and offsets[j] < hi:
            b = dst + offsets[j] - lo
        for q in range(p, min(b, limit)):
            segment_ids[q] = segment
            positions[q] = q - start
        if b >= dst + n:
            return segment, start
        if b > 0:  # a document starts at row position b (the row start is segment 0 already)
            segment += 1
            start = b
        p = b
        j += 1


def pack_rows(source: ShardSource, subsets: Sequence[SubsetTokens], subset: np.ndarray, start: np.ndarray,
              seq_len: int, out: Batch) -> None:
    """Fill ``out`` with the windows starting at stream token ``start[r]`` of subset ``subset[r]``.

    Args:
        source: decoded shards (`cache.DecodedShardCache` or a remote store).
        subsets: the stream's subsets; ``subset`` indexes into it.
        subset, start: ``[B]`` int64.
        seq_len: ``L``; each window is ``L + 1`` tokens.
        out: buffers with ``B`` rows.
    """
    out.subset[:] = subset
    for r in range(len(subset)):
        sub = subsets[subset[r]]
        at = int(start[r])
        k = int(np.searchsorted(sub.cumulative, at, side="right")) - 1
        dst, segment, seg_start = 0, 0, 0
        while dst < seq_len + 1:
            shard_lo = int(sub.cumulative[k])
            n = min(seq_len + 1 - dst, int(sub.cumulative[k + 1]) - at)
            if n > 0:
                decoded = source.open(sub.shards[k])
                segment, seg_start = _fill(decoded.tokens, decoded.offsets, at - shard_lo, at - shard_lo + n,
                                           out.window[r], out.segment_ids[r], out.positions[r], dst, segment,
                                           seg_start)
                dst += n
                at += n
            k += 1
