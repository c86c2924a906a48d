"""Packing: sequences are fixed windows over a subset's concatenated documents, with document boundaries.

`PACKINGS` names the two ways (``LoaderConfig.packing``); each is one pure function from a subset's shards
to its window grid (`Packing.windows`), and its own batch kernel. ``L = seq_len``:

- ``"overlap"`` (the default): sequence ``j`` of a shard is its tokens ``[j·L, j·L + L + 1)``: consecutive
  windows overlap by one token, so every input position has a label; a window never crosses a shard end,
  and the last ``(T - 1) % L`` tokens of a shard of ``T`` are never served.
- ``"levanter"``: Levanter's own windows: sequence ``i`` of a subset is its flat tokens ``[i·L, (i+1)·L)``,
  across document, shard and chunk-file ends, the subset's last ``T % L`` tokens dropped. No overlap: the
  last input position of a window has no label (below).

The subset numbers its windows shard after shard (`SubsetTokens.window_starts`; a ``"levanter"`` window
belongs to the shard holding its first token), on the same grid every epoch. Why: docs/data.md.

**Batch contract** (what a model may rely on). For a rank's batch of ``B`` sequences:

- ``input_ids``: ``[B, L]`` int64, tokens ``0..L-1`` of each window.
- ``labels``: ``[B, L]`` int64, tokens ``1..L`` of each window: ``labels[:, p]`` is the token after
  ``input_ids[:, p]``, so ``labels[:, :-1] == input_ids[:, 1:]``. Each is contiguous (``labels.view(-1)``
  works), written directly by the batch kernel.
  At a document's last input position (its EOS) the label is the first token of the next document.
  With ``"levanter"`` packing a window has only ``L`` tokens, so ``labels[:, -1]`` is `IGNORE` (-100, the
  ``ignore_index`` of ``torch.nn.functional.cross_entropy``): as in Levanter, whose loss mask drops the
  last position, each window trains on ``L - 1`` targets.
- ``subset``: ``[B]`` int64, the index of each row's subset in ``dataset.subsets``.
- ``index``: ``[B]`` int64, the global stream position of each row (the resume state is counted in these).

With ``LoaderConfig(segments=True)`` (document masking), two more:

- ``segment_ids``: ``[B, L]`` int32. ``segment_ids[b, p]`` numbers the document that ``input_ids[b, p]``
  belongs to, counting from 0 at the first position of the row, +1 at every document start. A document
  that began in an earlier window is segment 0 of this one. To block attention across documents, let
  position ``p`` attend to ``q <= p`` only if ``segment_ids[b, q] == segment_ids[b, p]``.
- ``positions``: ``[B, L]`` int32, the offset of ``input_ids[b, p]`` from the start of its segment: 0 at
  the row start and at every document start, then 1, 2, ... — use it for rotary/absolute positions so a
  packed document sees the same positions as an unpacked one (a document continued from an earlier window
  restarts at 0, keeping every position ``< L``).

They are off by default because they cost: at 8 x 4096 they add 262 KB to the 524 KB of token arrays and
about half to the time a batch takes (*measured*: 74-83 vs 48-53 us; docs/benchmarks.md). The stream is the
same either way. ``"levanter"`` packing has none: its windows run across shard ends, where the loader's
local form of a cache's chunk file cannot tell a document that starts there from one that goes on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from marin_data.corpus.records import ShardRecord
from marin_data.errors import CacheCheckError
from marin_data.loader.cache import ShardSource

__all__ = ["PACKINGS", "DEFAULT_PACKING", "IGNORE", "Packing", "SubsetTokens", "Batch", "batch_layout", "new_batch",
           "shard_rows", "window_shards", "ShardTable", "pack_rows"]

IGNORE = -100  # a label no loss counts (cross_entropy's default ignore_index)


def _overlap_windows(cumulative: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    per_shard = np.maximum(0, (np.diff(cumulative) - 1) // seq_len)
    return np.concatenate(([0], np.cumsum(per_shard))).astype(np.int64), cumulative.astype(np.int64)


def _levanter_windows(cumulative: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    # window i starts at token i·L; shard k holds those whose first token is in it: ceil(cum[k] / L) onwards
    starts = np.minimum(-(-cumulative // seq_len), cumulative[-1] // seq_len).astype(np.int64)
    return starts, starts * seq_len


@dataclass(frozen=True)
class Packing:
    """One way of cutting a subset's tokens into sequences (module docstring)."""

    # (cumulative [shards + 1] tokens, L) -> (starts, first): shard k holds the subset's windows
    # [starts[k], starts[k+1]), the first of them at subset token first[k], the next ones L tokens apart
    windows: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]
    extra: int  # tokens a window holds beyond L (the label of its last input position)
    crosses_shards: bool  # a window may run on into the next shards
    segments: bool  # batches may carry segment ids and positions


PACKINGS: dict[str, Packing] = {
    "overlap": Packing(_overlap_windows, extra=1, crosses_shards=False, segments=True),
    "levanter": Packing(_levanter_windows, extra=0, crosses_shards=True, segments=False),
}
DEFAULT_PACKING = "overlap"


@dataclass(frozen=True)
class SubsetTokens:
    """One subset's token stream as shards: ``O(shards)`` numpy metadata, nothing per document."""

    name: str
    shards: tuple[ShardRecord, ...]  # in stream order
    cumulative: np.ndarray  # [shards + 1] int64: shard k holds stream tokens [cumulative[k], cumulative[k+1])

    @classmethod
    def from_shards(cls, name: str, shards: Sequence[ShardRecord]) -> SubsetTokens:
        """The subset's stream: ``shards`` in the order given (a Parquet subset's by path, a cache's in the
        order of its flat tokens)."""
        counts = np.fromiter((s.tokens for s in shards), dtype=np.int64, count=len(shards))
        return cls(name, tuple(shards), np.concatenate(([0], np.cumsum(counts))))

    @property
    def tokens(self) -> int:
        return int(self.cumulative[-1])

    def window_starts(self, seq_len: int, packing: str = DEFAULT_PACKING) -> np.ndarray:
        """``[shards + 1]`` int64: shard ``k`` holds the subset's windows ``[starts[k], starts[k+1])`` (with
        ``"overlap"`` packing, one per ``seq_len`` tokens after the first: ``(T - 1) // seq_len`` of ``T``)."""
        return PACKINGS[packing].windows(self.cumulative, seq_len)[0]


@dataclass(frozen=True)
class Batch:
    """One batch's numpy arrays, all views of one byte buffer (`new_batch`); `pack_rows` fills them.

    One buffer, because DataLoader worker processes hand each tensor *storage* to the main process through
    its own shared-memory segment: one storage per batch instead of five cut the transport cost (measured).
    """

    buffer: np.ndarray  # [bytes] uint8: everything below
    input_ids: np.ndarray  # [B, L] int64: tokens 0..L-1 of each window
    labels: np.ndarray  # [B, L] int64: tokens 1..L of each window (packing="levanter": the last is IGNORE)
    subset: np.ndarray  # [B] int64
    index: np.ndarray  # [B] int64
    segment_ids: np.ndarray | None = None  # [B, L] int32, when segments are asked for
    positions: np.ndarray | None = None  # [B, L] int32, when segments are asked for


_FIELDS = ("input_ids", "labels", "subset", "index", "segment_ids", "positions")  # 8-byte types first: aligned


@functools.lru_cache(maxsize=16)
def batch_layout(rows: int, seq_len: int, segments: bool = False
                 ) -> tuple[tuple[str, int, int, tuple[int, ...], np.dtype], ...]:
    """``(field, byte offset, bytes, shape, dtype)`` of each array of a `Batch` in its buffer."""
    shapes = ((rows, seq_len), (rows, seq_len), (rows,), (rows,), (rows, seq_len), (rows, seq_len))
    dtypes = (np.int64, np.int64, np.int64, np.int64, np.int32, np.int32)
    layout, offset = [], 0
    for name, shape, dtype in zip(_FIELDS[: 6 if segments else 4], shapes, map(np.dtype, dtypes)):
        size = int(np.prod(shape)) * dtype.itemsize
        layout.append((name, offset, size, shape, dtype))
        offset += size
    return tuple(layout)


def new_batch(rows: int, seq_len: int, segments: bool = False) -> Batch:
    layout = batch_layout(rows, seq_len, segments)
    buffer = np.empty(layout[-1][1] + layout[-1][2], np.uint8)
    return Batch(buffer=buffer, **{name: np.ndarray(shape, dtype, buffer, offset)  # cheaper than slice + view
                                   for name, offset, _, shape, dtype in layout})


@numba.njit(cache=True, nogil=True)
def shard_rows(subset, start, cum_flat, cum_offsets):
    """Each row's global shard and the window's first token in it (``[B]`` int64 each), for windows starting
    at token ``start[r]`` of subset ``subset[r]``.

    ``cum_flat``, ``cum_offsets``: every subset's `SubsetTokens.cumulative` back to back (the stream's ragged
    layout): subset ``s``'s ``n_s + 1`` entries are ``cum_flat[cum_offsets[s]:cum_offsets[s + 1]]``, so with
    one extra entry per earlier subset its shard ``k`` is global shard ``cum_offsets[s] - s + k``.
    """
    shard = np.empty(subset.shape[0], np.int64)
    lo = np.empty(subset.shape[0], np.int64)
    for r in range(subset.shape[0]):
        s = subset[r]
        cum = cum_flat[cum_offsets[s] : cum_offsets[s + 1]]
        k = np.searchsorted(cum, start[r], side="right") - 1
        shard[r] = cum_offsets[s] - s + k
        lo[r] = start[r] - cum[k]
    return shard, lo


@numba.njit(cache=True, nogil=True)
def window_shards(subset, start, length, cum_flat, cum_offsets):
    """The global shards that the windows of ``length`` tokens starting at ``start[r]`` of subset
    ``subset[r]`` read (`shard_rows`' layout): ``[P]`` int64 in row order, each shard once per row that reads
    some of its tokens (a window may run across shards)."""
    out = np.empty(subset.shape[0], np.int64)
    n = 0
    for r in range(subset.shape[0]):
        s = subset[r]
        cum = cum_flat[cum_offsets[s] : cum_offsets[s + 1]]
        k = np.searchsorted(cum, start[r], side="right") - 1
        while k < cum.shape[0] - 1 and cum[k] < start[r] + length:
            if cum[k + 1] > cum[k]:
                if n == out.shape[0]:
                    grown = np.empty(2 * n, np.int64)
                    grown[:n] = out
                    out = grown
                out[n] = cum_offsets[s] - s + k
                n += 1
            k += 1
    return out[:n]


@numba.njit(cache=True, nogil=True)
def _fill_windows(tokens_at, tokens_len, slot_of, used, stamp, subset, start, cum_flat, cum_offsets, input_ids,
                  labels, out_subset):
    """Fill a batch of ``"levanter"`` windows (``input_ids.shape[1]`` tokens from ``start[r]``, across shard
    ends) if every shard they read is in a slot (``slot_of``); return -1 then, else a missing shard (and
    write nothing). ``labels`` are the inputs shifted by one, the last `IGNORE`."""
    length = input_ids.shape[1]
    for r in range(subset.shape[0]):
        s = subset[r]
        cum = cum_flat[cum_offsets[s] : cum_offsets[s + 1]]
        k = np.searchsorted(cum, start[r], side="right") - 1
        while k < cum.shape[0] - 1 and cum[k] < start[r] + length:
            if cum[k + 1] > cum[k] and slot_of[cum_offsets[s] - s + k] < 0:
                return cum_offsets[s] - s + k
            k += 1
    for r in range(subset.shape[0]):
        s = subset[r]
        cum = cum_flat[cum_offsets[s] : cum_offsets[s + 1]]
        k = np.searchsorted(cum, start[r], side="right") - 1
        pos, end, p = start[r], start[r] + length, 0
        ids = input_ids[r]
        while pos < end and k < cum.shape[0] - 1:  # (a window past the subset's end is not located)
            stop = min(end, cum[k + 1])
            if stop > pos:
                slot = slot_of[cum_offsets[s] - s + k]
                used[slot] = stamp
                tokens = _tokens_at(tokens_at, tokens_len, slot)
                lo = pos - cum[k]
                for q in range(stop - pos):
                    ids[p + q] = tokens[lo + q]
                p += stop - pos
                pos = stop
            k += 1
        next_ids = labels[r]
        for q in range(length - 1):
            next_ids[q] = ids[q + 1]
        next_ids[length - 1] = IGNORE
        out_subset[r] = s
    return -1


@numba.njit(cache=True, nogil=True)
def _label_documents(offsets, lo, segment_ids, positions, ramp):
    """Segment ids and positions of the row whose window starts at shard token ``lo`` (``offsets``: the
    shard's document starts). ``ramp`` is ``arange`` (int32, longer than a row): positions are slices of
    it, which compile to plain copies."""
    length = segment_ids.shape[0]
    j = np.searchsorted(offsets, lo, side="right")  # the first document start after the row start
    segment, begin = 0, 0
    while True:
        end = length
        if j < offsets.shape[0] and offsets[j] - lo < length:
            end = offsets[j] - lo
        segment_ids[begin:end] = segment
        positions[begin:end] = ramp[: end - begin]
        if end == length:
            return
        segment += 1
        begin = end
        j += 1


@intrinsic
def _pointer(typingctx, address):
    """An int64 address as a ``void*``, for ``numba.carray``."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(types.int64), codegen


@numba.njit(cache=True, inline="always")
def _tokens_at(at, length, slot):
    """The tokens of the shard in ``slot`` of a `ShardTable` (``[N]`` uint32, its memory map)."""
    return numba.carray(_pointer(at[slot]), (length[slot],), np.uint32)


@numba.njit(cache=True, inline="always")
def _offsets_at(at, length, slot):
    """The document offsets of the shard in ``slot`` of a `ShardTable` (``[docs + 1]`` int64)."""
    return numba.carray(_pointer(at[slot]), (length[slot],), np.int64)


@numba.njit(cache=True, nogil=True)
def _fill_batch(tokens_at, tokens_len, offsets_at, offsets_len, slot_of, used, stamp, subset, start, cum_flat,
                cum_offsets, input_ids, labels, out_subset, segment_ids, positions, ramp):
    """Fill a batch (`pack_rows`) if every shard it reads is in a slot of the `ShardTable` (``slot_of``), and
    mark those slots used at ``stamp``; return -1 then. Otherwise write nothing and return a missing shard.

    ``segment_ids`` has no rows when they are not asked for. Before copying, one load per 64-byte line of
    every row's window: those loads do not depend on each other, so the cache misses of all rows overlap,
    where the copies would meet them one page at a time (*measured* 5-6% of the call at 8 x 4096, with
    segments or without, windows not in the CPU cache).
    """
    shard, lo = shard_rows(subset, start, cum_flat, cum_offsets)
    slots = np.empty_like(shard)
    for r in range(shard.shape[0]):
        slots[r] = slot_of[shard[r]]
        if slots[r] < 0:
            return shard[r]
    length = input_ids.shape[1]
    touched = 0
    for r in range(slots.shape[0]):
        used[slots[r]] = stamp
        window = _tokens_at(tokens_at, tokens_len, slots[r])[lo[r] : lo[r] + length + 1]
        for i in range(0, window.shape[0], 16):
            touched += window[i]
    for r in range(slots.shape[0]):
        window = _tokens_at(tokens_at, tokens_len, slots[r])[lo[r] : lo[r] + length + 1]
        ids, next_ids = input_ids[r], labels[r]
        for p in range(length):
            ids[p] = window[p]
            next_ids[p] = window[p + 1]
        out_subset[r] = subset[r]
        if segment_ids.shape[0]:
            _label_documents(_offsets_at(offsets_at, offsets_len, slots[r]), lo[r], segment_ids[r], positions[r],
                             ramp)
    return -1 if touched >= 0 else -2  # the loads' sum is used, so that they are kept


class ShardTable:
    """Open shards in slots that one numba call can read, so a whole batch is filled without Python loops.

    ``slot_of[g]`` is the slot holding global shard ``g`` (or -1); a batch's missing shards are opened
    through ``source`` (the decoded-shard cache) into the least recently used slots. Built lazily in each
    process: DataLoader workers get their own. Each shard's largest token id is checked against
    ``vocab_size`` the first time the process opens it, so no id past the model's embedding reaches a batch.
    """

    def __init__(self, source: ShardSource, shards: Sequence[ShardRecord], cum_flat: np.ndarray,
                 cum_offsets: np.ndarray, capacity: int = 64, *, vocab_size: int | None = None) -> None:
        """``shards``: the stream's shards, subset by subset; ``cum_flat``, ``cum_offsets``: their cumulative
        token counts (`shard_rows`); ``vocab_size``: every token id must lie below it (None: unchecked)."""
        self.source = source
        self.shards = shards
        self.vocab_size = vocab_size
        self.checked = np.zeros(len(shards), dtype=bool)
        self.cum_flat, self.cum_offsets = cum_flat, cum_offsets
        self.slot_of = np.full(len(self.shards), -1, dtype=np.int64)
        self.shard_in = np.full(capacity, -1, dtype=np.int64)
        self.used = np.zeros(capacity, dtype=np.int64)  # batch counter at last use (LRU)
        self.batches = 0
        # Each slot's arrays as (address, length): `_tokens_at` and `_offsets_at` view them in compiled code.
        # Plain arrays, where numba's typed lists compiled their methods in every process (~0.7 s, *measured*).
        self.tokens_at, self.tokens_len = np.zeros(capacity, np.int64), np.zeros(capacity, np.int64)
        self.offsets_at, self.offsets_len = np.zeros(capacity, np.int64), np.zeros(capacity, np.int64)
        self.held: list[tuple[np.ndarray, np.ndarray] | None] = [None] * capacity  # keeps those arrays alive

    def slots(self, shards: np.ndarray) -> np.ndarray:
        """Slots of global shards ``shards`` (``[P]`` int64), opening the ones not in a slot."""
        self.batches += 1
        slots = self.slot_of[shards]
        if slots.min() < 0:
            needed = len(np.unique(shards))
            if needed > len(self.used):  # a batch spanning more shards than there are slots: grow
                self._grow(2 * needed)
            for g in np.unique(shards[slots < 0]):
                free = np.where(np.isin(np.arange(len(self.used)), slots), np.iinfo(np.int64).max, self.used)
                slot = int(np.argmin(free))  # least recently used among the slots this batch does not use
                if self.shard_in[slot] >= 0:
                    self.slot_of[self.shard_in[slot]] = -1
                decoded = self.source.open(self.shards[g])
                # The maps as they are (a copy only for a source that hands over other layouts or types).
                tokens = np.ascontiguousarray(decoded.tokens, dtype=np.uint32)
                if self.vocab_size is not None and not self.checked[g]:
                    _refuse_ids(tokens, self.vocab_size, self.shards[g])
                    self.checked[g] = True
                offsets = np.ascontiguousarray(decoded.offsets, dtype=np.int64)
                self.held[slot] = tokens, offsets
                self.tokens_at[slot], self.tokens_len[slot] = tokens.ctypes.data, len(tokens)
                self.offsets_at[slot], self.offsets_len[slot] = offsets.ctypes.data, len(offsets)
                self.shard_in[slot], self.slot_of[g] = g, slot
                slots = np.where(shards == g, slot, slots)
        self.used[slots] = self.batches
        return slots

    def _grow(self, capacity: int) -> None:
        extra = capacity - len(self.used)
        self.shard_in = np.concatenate([self.shard_in, np.full(extra, -1, dtype=np.int64)])
        for name in ("used", "tokens_at", "tokens_len", "offsets_at", "offsets_len"):
            setattr(self, name, np.concatenate([getattr(self, name), np.zeros(extra, dtype=np.int64)]))
        self.held += [None] * extra


def _refuse_ids(tokens: np.ndarray, vocab_size: int, shard: ShardRecord) -> None:
    if len(tokens) and int(tokens.max()) >= vocab_size:
        i = int(np.argmax(tokens >= vocab_size))
        raise CacheCheckError(f"token {i} is {tokens[i]}, outside the model's vocabulary [0, {vocab_size}) "
                              f"({int((tokens >= vocab_size).sum())} such tokens in the shard): the model cannot embed "
                              "it, and no batch was served from this shard", path=shard.path)


def pack_rows(table: ShardTable, subset: np.ndarray, start: np.ndarray, seq_len: int, out: Batch,
              packing: str = DEFAULT_PACKING) -> None:
    """Fill ``out`` with the windows starting at stream token ``start[r]`` of subset ``subset[r]``: one compiled
    call per batch, and another after opening the shards it reads when one is not open yet.

    Args:
        table: the stream's shards (`ShardTable`).
        subset, start: ``[B]`` int64; with ``"overlap"`` packing each window lies in one shard (`window_starts`).
        seq_len: ``L``; each window is ``L + Packing.extra`` tokens.
        out: buffers with ``B`` rows; its ``segment_ids`` and ``positions`` are filled when it has them.
        packing: a name in `PACKINGS`.
    """
    table.batches += 1
    for _ in range(2):  # `slots` opens every shard the batch reads, so the second call never misses
        if PACKINGS[packing].crosses_shards:
            missing = _fill_windows(table.tokens_at, table.tokens_len, table.slot_of, table.used, table.batches,
                                    subset, start, table.cum_flat, table.cum_offsets, out.input_ids, out.labels,
                                    out.subset)
        else:
            segment_ids, positions = (out.segment_ids, out.positions) if out.segment_ids is not None else _NO_SEGMENTS
            missing = _fill_batch(table.tokens_at, table.tokens_len, table.offsets_at, table.offsets_len,
                                  table.slot_of, table.used, table.batches, subset, start, table.cum_flat,
                                  table.cum_offsets, out.input_ids, out.labels, out.subset, segment_ids, positions,
                                  _ramp(seq_len))
        if missing < 0:
            return
        table.slots(window_shards(subset, start, seq_len + PACKINGS[packing].extra, table.cum_flat,
                                  table.cum_offsets))
    raise AssertionError(f"shard {missing} is not in the shard table after opening it")


_NO_SEGMENTS = (np.zeros((0, 0), np.int32), np.zeros((0, 0), np.int32))


@functools.lru_cache(maxsize=8)
def _ramp(seq_len: int) -> np.ndarray:
    ramp = np.arange(seq_len + 1, dtype=np.int32)
    ramp.flags.writeable = False
    return ramp
