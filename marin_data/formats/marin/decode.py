"""The loader's decoder of Parquet shards: a shard's ``tokens`` column straight into the loader's local form
(``tokens`` uint32 ``[N]``, ``offsets`` int64 ``[docs + 1]``), one copy and no document ids."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from marin_data.corpus.manifest import Corpus
from marin_data.corpus.records import ShardRecord
from marin_data.corpus.shard import check_schema, check_shard_counts, check_shard_file
from marin_data.errors import ShardFormatError, ShardMissingError
from marin_data.fileio.arrays import write_npy
from marin_data.fileio.parquet_io import open_parquet
from marin_data.formats.marin.documents import ParquetDocuments

__all__ = ["ParquetDecoder"]


class ParquetDecoder:
    """A Parquet corpus's shards for the loader: each subset's shards by path, decoded whole (``corpus``:
    whose shards `order` orders; a decoder without one only decodes)."""

    pieces = False

    def __init__(self, corpus: Corpus | None = None) -> None:
        self.corpus = corpus

    def order(self, subsets: Sequence[str]) -> list[tuple[ShardRecord, ...]]:
        if self.corpus is None:
            raise ValueError("this ParquetDecoder was made without its corpus: it decodes, but orders nothing")
        files: dict[str, list[ShardRecord]] = {n: [] for n in subsets}
        for shard in self.corpus.shards:
            if shard.subset in files:
                files[shard.subset].append(shard)
        return [tuple(sorted(files[n], key=lambda s: s.path)) for n in subsets]

    def documents(self, stream: Any) -> ParquetDocuments:
        """Where ``stream``'s documents lie: its shards' row groups, read from its ``shard_files()``."""
        return ParquetDocuments(stream, stream.shard_files())

    def context(self, shard: ShardRecord) -> None:
        return None  # a Parquet shard's decode depends on its bytes alone

    def decode_into(self, path: Path, shard: ShardRecord, tokens_path: Path, offsets_path: Path, *,
                    verify: bool) -> None:
        """Decode a shard's ``tokens`` column straight into ``.npy`` files.

        Raises:
            ShardMissingError: the shard file is not there (a partial download).
            ShardChecksumError: ``verify`` and its SHA-256 or size differ from the index's.
            ShardFormatError: unreadable, or its document/token counts differ from the index's.
        """
        if verify:
            check_shard_file(path, shard)
        elif not path.exists():
            raise ShardMissingError(f"shard of subset {shard.subset!r} is not on local disk", path=str(path))
        try:
            with open_parquet(path) as pf:
                check_schema(pf.schema_arrow, path)  # the values are written out as uint32 unconverted
                column = pf.read(columns=["tokens"]).column("tokens")
        except ShardFormatError:
            raise
        except (OSError, ValueError, KeyError) as e:  # pyarrow raises ArrowInvalid (a ValueError) on garbage
            raise ShardFormatError(f"not a readable shard: {e}", path=str(path)) from e
        spans = [(np.asarray(c.offsets, dtype=np.int64), c) for c in column.chunks]
        docs, tokens = len(column), sum(int(o[-1] - o[0]) for o, _ in spans)
        check_shard_counts(path, shard, docs, tokens)
        write_npy(tokens_path, np.uint32, tokens, (np.asarray(c.values)[o[0]:o[-1]] for o, c in spans))
        starts = np.cumsum([0] + [int(o[-1] - o[0]) for o, _ in spans])
        ends = (np.ascontiguousarray(o[:-1] - o[0] + base) for (o, _), base in zip(spans, starts))
        write_npy(offsets_path, np.int64, docs + 1, [*ends, np.array([tokens], dtype=np.int64)])
