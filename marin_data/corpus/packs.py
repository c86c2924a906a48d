"""The pack step of a build: the units' documents cut into shards, and each shard written.

`ShardPlan` cuts the documents, in unit order, into shards of at most ``shard_tokens`` tokens as units
finish, reading only their lengths; `pack_shard` writes one cut (a `PackJob`, picklable, run by any engine)
from slices of the unit staging files, then its done marker. The cuts depend on the documents only, so any
worker count writes the same bytes (docs/data.md).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Container, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from marin_data.fileio.atomic import atomic_write_bytes
from marin_data.fileio.arrays import view
from marin_data.corpus.markers import canonical
from marin_data.corpus.shard import ShardStats, shard_path, write_shard
from marin_data.corpus.units import UnitJob, unit_paths
from marin_data.fileio.parquet_io import open_parquet
from marin_data.raw.tokenizer import TokenizerInfo

__all__ = ["PackJob", "pack_shard", "ShardPlan"]


@dataclass(frozen=True)
class PackJob:
    """Write staging shard ``out`` from documents ``[first, end)`` of each listed unit file, in order."""

    out: str
    pieces: tuple[tuple[str, int, int], ...]
    tokenizer: TokenizerInfo


def pack_shard(job: PackJob) -> ShardStats:
    """Write one shard from slices of unit staging files, then its ``.json`` done marker."""
    ids: list[str] = []
    tokens: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    for path, first, end in job.pieces:
        piece_ids, piece_tokens, piece_offsets = _read_docs(path, first, end)
        ids += piece_ids
        tokens.append(piece_tokens)
        lengths.append(np.diff(piece_offsets))
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int64)
    stats = write_shard(job.out, ids, np.concatenate(tokens), offsets, job.tokenizer)
    atomic_write_bytes(Path(job.out).with_suffix(".json"), canonical(asdict(stats)))
    return stats


def _read_docs(path: str, first: int, end: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Documents ``[first, end)`` of a staging file, reading only the row groups that hold them."""
    pf = open_parquet(path)
    starts = np.concatenate([[0], np.cumsum([pf.metadata.row_group(i).num_rows
                                             for i in range(pf.metadata.num_row_groups)])])
    groups = list(range(int(np.searchsorted(starts, first, "right")) - 1, int(np.searchsorted(starts, end, "left"))))
    table = pf.read_row_groups(groups).slice(first - int(starts[groups[0]]), end - first)
    column = table.column("tokens").combine_chunks()
    offsets = view(column.offsets, np.int64)
    values = view(column.values, np.uint32)[offsets[0] : offsets[-1]]
    return table.column("id").to_pylist(), values, offsets - offsets[0]


class ShardPlan:
    """Cuts the units' documents, in unit order, into shards of at most ``shard_tokens`` tokens, as units finish.

    `advance` cuts the finished units that come next in input order and returns the shards they closed, and
    once every unit is cut, the last shard. A cut reads only a unit's document lengths (bounded memory for
    any subset size), so the shards are the same whatever order the units finish in and whatever the
    worker count. Packs of an interrupted run over other inputs are removed when the plan starts.
    """

    def __init__(self, units: Sequence[UnitJob], staging: Path, subset: str, shard_tokens: int,
                 info: TokenizerInfo) -> None:
        key = hashlib.sha256(json.dumps([[j.key for j in units], shard_tokens]).encode()).hexdigest()[:16]
        self.out_dir = staging / "shards" / key
        for stale in (staging / "shards").glob("*"):
            if stale != self.out_dir:
                shutil.rmtree(stale)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.units, self.subset, self.shard_tokens, self.info = units, subset, shard_tokens, info
        self.packs: list[PackJob] = []  # the shards cut so far
        self._next = 0  # the first unit not cut yet
        self._pieces: list[tuple[str, int, int]] = []  # the open shard
        self._filled = 0  # its tokens

    def advance(self, finished: Container[int]) -> list[tuple[int, PackJob]]:
        """Cut the units from the first not cut yet up to the first not in ``finished``; the new shards, numbered."""
        start = len(self.packs)
        while self._next < len(self.units) and self._next in finished:
            self._cut(self.units[self._next])
            self._next += 1
        if self._next == len(self.units) and self._pieces:
            self._close()
        return list(enumerate(self.packs[start:], start))

    def _cut(self, unit: UnitJob) -> None:
        parquet, lengths_path, _ = unit_paths(unit)
        ends = np.cumsum(np.load(lengths_path))  # ends[i]: tokens of documents [0, i]
        first = 0
        while first < len(ends):
            before = int(ends[first - 1]) if first else 0
            end = int(np.searchsorted(ends, before + self.shard_tokens - self._filled, "right"))
            if end == first and self._filled == 0:
                end = first + 1  # a document longer than a shard: a shard of its own
            if end > first:
                self._pieces.append((str(parquet), first, end))
                self._filled += int(ends[end - 1]) - before
                first = end
            if first < len(ends):  # the next document does not fit: close this shard
                self._close()

    def _close(self) -> None:
        n = len(self.packs)
        shard_path(self.subset, n)  # refuses a subset of more shards than a Hub folder holds
        self.packs.append(PackJob(out=str(self.out_dir / f"part-{n:05d}.parquet"), pieces=tuple(self._pieces),
                                  tokenizer=self.info))
        self._pieces, self._filled = [], 0
