"""Write and read one shard: a Parquet file of tokenized documents.

Schema: ``id`` (string) and ``tokens`` (``large_list<uint32>``; a Llama-3 vocabulary of 128,256 needs more
than 16 bits), zstd, row groups of about 1M tokens, the tokenizer fingerprint in the key-value metadata.
The token values are written with BYTE_STREAM_SPLIT and no dictionary: measured at 0.33x of raw
uint32 (docs/design.md, "The corpus format") and ~124M tokens/s/core to decode. Only ``use_byte_stream_split=["tokens.list.element"]`` does it —
``True`` raises on the string column, ``["tokens"]`` silently writes PLAIN, and the default dictionary
silently writes RLE_DICTIONARY — so `inspect_shard` reads the encodings back and refuses anything else.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marin_data.fileio.arrays import numbers, strings
from marin_data.fileio.atomic import atomic_path, sha256_file
from marin_data.errors import ShardChecksumError, ShardFormatError, ShardMissingError
from marin_data.layout import DATA
from marin_data.corpus.records import ShardRecord
from marin_data.fileio.parquet_io import open_parquet
from marin_data.raw.tokenizer import TokenizerInfo

__all__ = [
    "ROW_GROUP_TOKENS",
    "MAX_ROW_GROUP_BYTES",
    "MAX_SHARDS_PER_SUBSET",
    "TOKENS_VALUES",
    "ShardStats",
    "ShardInspection",
    "shard_path",
    "shard_schema",
    "write_shard",
    "ShardWriter",
    "read_shard",
    "check_schema",
    "check_shard_file",
    "check_shard_counts",
    "inspect_shard",
    "count_tokens",
]

ROW_GROUP_TOKENS = 1 << 20  # ~1M tokens per row group: a unit a reader can decode and seek to
# What a reader that has not checked a shard's bytes (`show`, the datasheet's scan) lets one row group decode
# to, bounded from the footer first: ours hold ~1M tokens (~12 MB decoded with their offsets).
MAX_ROW_GROUP_BYTES = 1 << 30
# The Hub allows fewer than 10,000 files per folder. Subset names are paths, so a subset that outgrows
# this is split into child subsets (pretrain/dclm/000, pretrain/dclm/001...) that `--subset pretrain/dclm`
# still selects as one.
MAX_SHARDS_PER_SUBSET = 9_999
TOKENS_VALUES = "tokens.list.element"  # the Parquet column path of the token values
_META_SCHEMA = b"marin.schema_version"
_META_TOKENIZER = b"marin.tokenizer.sha256"
_META_TOKENIZER_NAME = b"marin.tokenizer.name"


@dataclass(frozen=True)
class ShardStats:
    bytes: int
    sha256: str
    docs: int
    tokens: int
    row_groups: int


def shard_path(subset: str, number: int) -> str:
    """Relative path of a subset's ``number``-th shard (numbered in write order, no ``-of-N``)."""
    if not 0 <= number < MAX_SHARDS_PER_SUBSET:
        raise ValueError(
            f"subset {subset!r} would get shard #{number}; the Hub allows < 10,000 files per folder: "
            f"split it into child subsets ({subset}/000, {subset}/001, ...)"
        )
    return f"{DATA}/{subset}/part-{number:05d}.parquet"


def shard_schema(tokenizer: TokenizerInfo):
    import pyarrow as pa

    return pa.schema(
        [("id", pa.string()), ("tokens", pa.large_list(pa.uint32()))],
        metadata={
            _META_SCHEMA: b"1",
            _META_TOKENIZER: tokenizer.sha256.encode(),
            _META_TOKENIZER_NAME: tokenizer.name.encode(),
        },
    )


def write_shard(
    path: str | os.PathLike,
    ids: Sequence[str],
    tokens: np.ndarray,
    offsets: np.ndarray,
    tokenizer: TokenizerInfo,
    *,
    row_group_tokens: int = ROW_GROUP_TOKENS,
) -> ShardStats:
    """Write documents atomically to one shard and return its size, sha256 and counts.

    Args:
        path: the final path; the bytes go to a ``.part`` file first and are renamed only when complete.
        ids: one id per document.
        tokens: ``[N]`` uint32, all documents' tokens concatenated (EOS already appended).
        offsets: ``[len(ids) + 1]`` int64, document ``i`` is ``tokens[offsets[i]:offsets[i+1]]``.
        tokenizer: recorded in the file's key-value metadata.
        row_group_tokens: row groups end at the first document end at or past each multiple of it.
    """
    with ShardWriter(path, tokenizer, row_group_tokens=row_group_tokens) as writer:
        writer.write(ids, tokens, offsets)
    return writer.stats


class ShardWriter:
    """One shard written batch by batch in bounded memory (a row group and the batch being cut), atomically.

    A row group ends at the first document end at or past each multiple of ``row_group_tokens`` that lies
    before the shard's last token, so the file is the same bytes however its documents arrive in batches
    (`write_shard` is one batch). ``close`` (or leaving the ``with`` block) renames the file into place and
    sets ``stats``; an error inside the block leaves nothing under ``path``.
    """

    def __init__(self, path: str | os.PathLike, tokenizer: TokenizerInfo, *,
                 row_group_tokens: int = ROW_GROUP_TOKENS) -> None:
        import pyarrow.parquet as pq

        self.schema = shard_schema(tokenizer)
        self.row_group_tokens = row_group_tokens
        self.stats: ShardStats | None = None
        self.docs = self.tokens = self.row_groups = 0  # written and buffered
        self._ids: list[str] = []  # the buffer: documents not in a row group yet
        self._tokens: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._base = 0  # tokens before the buffer
        self._target = row_group_tokens  # the next multiple a row group must reach
        self._stack = contextlib.ExitStack()
        self._tmp = self._stack.enter_context(atomic_path(path))
        try:
            self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="zstd", use_dictionary=["id"],
                                            use_byte_stream_split=[TOKENS_VALUES], write_statistics=["id"])
        except BaseException as e:
            self._stack.__exit__(type(e), e, e.__traceback__)  # the temporary file removed
            raise

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is None:
            self.close()
        else:
            self.abort(error)

    def write(self, ids: Sequence[str], tokens: np.ndarray, offsets: np.ndarray) -> None:
        """Append documents: ``tokens`` ``[N]`` uint32 and ``offsets`` ``[len(ids) + 1]`` int64 as in
        `write_shard`. A large batch is taken about a row group at a time, so the buffer never copies more."""
        tokens = np.ascontiguousarray(tokens, dtype=np.uint32)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if len(offsets) != len(ids) + 1 or offsets[0] != 0 or offsets[-1] != len(tokens):
            raise ValueError(f"offsets do not describe {len(ids)} documents over {len(tokens)} tokens")
        steps = np.searchsorted(offsets, np.arange(self.row_group_tokens, len(tokens), self.row_group_tokens))
        bounds = [0, *sorted({int(b) for b in steps if 0 < b < len(ids)}), len(ids)]
        for a, b in zip(bounds[:-1], bounds[1:]):
            self._ids.extend(ids[a:b])
            self._tokens.append(tokens[offsets[a]:offsets[b]])
            self._lengths.append(np.diff(offsets[a:b + 1]))
            self.docs, self.tokens = self.docs + b - a, self.tokens + int(offsets[b] - offsets[a])
            self._cut()

    def close(self) -> ShardStats:
        """Write the last row group, rename the file into place and return its `ShardStats`."""
        if self.stats is None:
            self._cut()
            if self._ids or not self.row_groups:  # an empty shard still has one (empty) row group
                self._flush(len(self._ids), np.concatenate([np.zeros(0, np.uint32), *self._tokens]),
                            np.concatenate([np.zeros(0, np.int64), *self._lengths]))
            self._writer.close()
            digest, size = sha256_file(self._tmp)
            self._stack.close()
            self.stats = ShardStats(bytes=size, sha256=digest, docs=self.docs, tokens=self.tokens,
                                    row_groups=self.row_groups)
        return self.stats

    def abort(self, error: BaseException | None = None) -> None:
        """Drop the file being written: nothing is left under the shard's path (``error``: why)."""
        error = error or RuntimeError("the shard was abandoned")
        try:
            self._writer.close()
        finally:
            self._stack.__exit__(type(error), error, error.__traceback__)  # not renamed, removed

    def _cut(self) -> None:
        """Write the buffer's complete row groups. A document end exactly at a multiple starts a new group only
        when more tokens follow it, which a batch may not tell yet: that cut waits for the next one."""
        if not self._lengths:
            return
        lengths = np.concatenate(self._lengths)
        tokens = np.concatenate(self._tokens)
        ends = self._base + np.cumsum(lengths)
        first = 0
        while (j := int(np.searchsorted(ends, self._target, "left"))) < len(ends):
            if ends[j] == self._target and ends[-1] == ends[j]:
                break  # no token follows yet: the next batch decides, and at the end there is no cut
            done = int(ends[j] - self._base)
            self._flush(j + 1 - first, tokens[:done], lengths[first:j + 1])
            tokens, self._base = tokens[done:], int(ends[j])
            self._target = (int(ends[j]) // self.row_group_tokens + 1) * self.row_group_tokens
            first = j + 1
        self._tokens, self._lengths = [tokens], [lengths[first:]]

    def _flush(self, n: int, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """The buffer's first ``n`` documents (``tokens``, ``lengths``) as one row group."""
        import pyarrow as pa

        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        column = pa.LargeListArray.from_arrays(numbers(offsets, np.int64), numbers(tokens, np.uint32))
        self._writer.write_table(pa.table({"id": strings(self._ids[:n]), "tokens": column}, schema=self.schema))
        del self._ids[:n]
        self.row_groups += 1


def read_shard(path: str | os.PathLike) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Read a whole shard: ``(ids, tokens [N] uint32, offsets [docs + 1] int64)``."""
    try:
        with open_parquet(path) as pf:
            table = pf.read()
        column = table.column("tokens").combine_chunks()
        ids = table.column("id").to_pylist()
    except (OSError, ValueError, KeyError) as e:
        raise ShardFormatError(f"not a readable shard: {e}", path=str(path)) from e
    offsets = np.asarray(column.offsets, dtype=np.int64)
    tokens = np.asarray(column.values, dtype=np.uint32)
    base = offsets[0]
    return ids, tokens[base : offsets[-1]], offsets - base


def check_schema(schema, path: str | os.PathLike) -> None:
    """Raise `ShardFormatError` unless ``schema`` (a shard's Arrow schema, from its footer) is the shard format's:
    ``id`` string and ``tokens`` ``large_list<uint32>``. Tokens of another type (int64, say) would be served
    reinterpreted: half of them zeros, half of each shard dropped."""
    import pyarrow as pa

    want = {"id": pa.string(), "tokens": pa.large_list(pa.uint32())}
    got = {f.name: f.type for f in schema}
    if got != want:
        found = ", ".join(f"{k}: {v}" for k, v in got.items())
        raise ShardFormatError(f"schema {{{found}}} is not {{id: string, tokens: large_list<uint32>}}",
                               path=str(path), expected=want, actual=got)


def check_shard_file(path: Path, shard: ShardRecord) -> None:
    """Raise unless the local file of ``shard`` has the index's SHA-256 and size.

    Raises:
        ShardMissingError: it is not on local disk (a partial download); ShardChecksumError: it differs.
    """
    if not path.exists():
        raise ShardMissingError(f"shard of subset {shard.subset!r} is not on local disk", path=str(path))
    if (actual := sha256_file(path)) != (shard.sha256, shard.bytes):
        raise ShardChecksumError(f"sha256/size {actual[0][:12]}…/{actual[1]} != {shard.sha256[:12]}…/{shard.bytes} "
                                 "listed in the shard index: the file was modified", path=str(path),
                                 expected=shard.sha256, actual=actual[0])


def check_shard_counts(path: Path, shard: ShardRecord, docs: int, tokens: int) -> None:
    """Raise `ShardFormatError` unless a shard read whole held the index's documents and tokens."""
    if (docs, tokens) != (shard.docs, shard.tokens):
        raise ShardFormatError(f"holds {docs} documents / {tokens} tokens, the index says {shard.docs} / "
                               f"{shard.tokens}", path=str(path), expected=(shard.docs, shard.tokens),
                               actual=(docs, tokens))


@dataclass(frozen=True)
class ShardInspection:
    docs: int
    tokens: int
    row_groups: int
    tokenizer_sha256: str | None
    token_encodings: tuple[str, ...]  # Parquet encodings of the token values, e.g. ("BYTE_STREAM_SPLIT",)
    # ``tokens`` is the footer's count of values: an empty document counts as one (`count_tokens` is exact)


def inspect_shard(path: str | os.PathLike) -> ShardInspection:
    """Read a shard's footer (not its data) and check schema and encodings.

    Raises:
        ShardFormatError: unreadable footer, wrong schema, or token values not BYTE_STREAM_SPLIT or
            dictionary-encoded.
    """
    import pyarrow as pa

    try:
        pf = open_parquet(path)
    except (OSError, ValueError) as e:
        raise ShardFormatError(f"not a readable Parquet file (truncated or half-written?): {e}",
                               path=str(path)) from e
    schema = pf.schema_arrow
    check_schema(schema, path)
    md = pf.metadata
    col = next(i for i in range(md.num_columns) if md.schema.column(i).path == TOKENS_VALUES)
    encodings = sorted({e for rg in range(md.num_row_groups) for e in md.row_group(rg).column(col).encodings})
    if "BYTE_STREAM_SPLIT" not in encodings or any("DICT" in e for e in encodings):
        raise ShardFormatError(f"token values encoded {encodings}, expected BYTE_STREAM_SPLIT, no dictionary",
                               path=str(path), expected=["BYTE_STREAM_SPLIT"], actual=encodings)
    tokens = sum(md.row_group(rg).column(col).num_values for rg in range(md.num_row_groups))
    kv = schema.metadata or {}
    fp = kv.get(_META_TOKENIZER)
    return ShardInspection(docs=md.num_rows, tokens=tokens, row_groups=md.num_row_groups,
                           tokenizer_sha256=fp.decode() if fp else None, token_encodings=tuple(encodings))


def count_tokens(path: str | os.PathLike) -> int:
    """The tokens of a shard, decoded row group by row group. A footer cannot tell them when documents are
    empty: it counts a document without tokens as one value of the column (`inspect_shard`'s ``tokens``)."""
    with open_parquet(path) as pf:
        total = 0
        for group in range(pf.metadata.num_row_groups):
            offsets = pf.read_row_group(group, columns=["tokens"]).column("tokens").combine_chunks().offsets
            total += int(offsets[-1].as_py()) - int(offsets[0].as_py()) if len(offsets) else 0
    return total
