"""``marin-data show``: a few documents of a subset decoded back to text with the corpus's tokenizer.

What the Hub's dataset viewer or ``duckdb`` would show of the rows, for a tokenized corpus: one shard is
opened (a local file, or a remote one read in byte ranges through `marin_data.transfer.remote_corpus`) and
only the row groups holding the documents shown are decoded. The framing the corpus added (EOS after every
document, BOS when the manifest says so) is stripped before decoding. Shown bytes are not checked against
the manifest's SHA-256: that needs the whole shard, which is what ``verify`` and ``download`` do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marin_data.fileio.arrays import view
from marin_data.corpus.manifest import Corpus, load_corpus
from marin_data.corpus.names import select_subsets
from marin_data.corpus.records import ShardRecord
from marin_data.corpus.shard import MAX_ROW_GROUP_BYTES
from marin_data.errors import (InvalidManifestError, RemoteError, ShardFormatError, ShardMissingError,
                               UnknownDocumentError, shown)
from marin_data.layout import TOKENIZER
from marin_data.fileio.parquet_io import decoded_bound, open_parquet
from marin_data.raw.tokenizer import LoadedTokenizer, tokenizer_from_bytes

__all__ = ["ShownDocument", "show_documents", "shards_to_show", "decode_rows"]


@dataclass(frozen=True)
class ShownDocument:
    id: str
    shard: str  # its shard's path in the corpus
    tokens: int  # as stored, framing included
    text: str


def shards_to_show(shards: Sequence[ShardRecord], subsets: dict, subset: str) -> list[ShardRecord]:
    """The shards of the subset ``subset`` names (a name or a pattern matching exactly one), in order."""
    chosen = select_subsets(subsets, [subset])
    if len(chosen) != 1:
        raise InvalidManifestError(f"subset {subset!r} matches {len(chosen)} subsets ({', '.join(chosen)}): name "
                                   "one", expected=chosen, actual=subset)
    return sorted((s for s in shards if s.subset == chosen[0]), key=lambda s: s.path)


def decode_rows(files: Iterator[tuple[ShardRecord, object]], tokenizer: LoadedTokenizer, *, n: int,
                doc_id: str | None, max_row_group_bytes: int = MAX_ROW_GROUP_BYTES) -> list[ShownDocument]:
    """The first ``n`` documents of the first shard, or the one with id ``doc_id`` (searched shard by shard,
    reading the ``id`` column first). ``files`` yields each shard with a file object pyarrow can read.

    Shown bytes are not checked against the index, so each row group read is first bounded from the footer
    (``max_row_group_bytes``), ids are read as dictionaries, and only the rows shown are expanded.
    """
    out: list[ShownDocument] = []
    for shard, source in files:
        try:
            # decoded on this thread, no read-ahead left pending; a repeated id is decoded once
            with open_parquet(source, pre_buffer=False, read_dictionary=["id"]) as pf:
                for group in range(pf.num_row_groups):
                    rows = _rows_to_show(pf, group, doc_id, n - len(out), shard, max_row_group_bytes)
                    if rows is None:
                        continue
                    table = pf.read_row_group(group, columns=["id", "tokens"]).slice(*rows)
                    for row_id, tokens in zip(table.column("id").to_pylist(), table.column("tokens").to_pylist()):
                        out.append(ShownDocument(row_id, shard.path, len(tokens), _text(tokens, tokenizer)))
                    if len(out) >= (1 if doc_id is not None else n):
                        return out
        except (ShardFormatError, RemoteError):  # already typed (pyarrow passes a store's failure on as is)
            raise
        except (OSError, ValueError, KeyError) as e:  # pyarrow raises ArrowInvalid (a ValueError) on garbage
            raise ShardFormatError(f"not a readable shard: {e}", path=shard.path) from e
        if doc_id is None:
            return out  # one shard is enough to show its first documents
    if doc_id is not None:
        raise UnknownDocumentError(f"no document with id {shown(doc_id)} in this subset", actual=doc_id)
    return out


def _rows_to_show(pf, group: int, doc_id: str | None, wanted: int, shard: ShardRecord,
                  limit: int) -> tuple[int, int] | None:
    """``(first row, count)`` of the rows of ``group`` to show, or None when it holds no row wanted."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bound = decoded_bound(pf.metadata, ("id", "tokens"), row_groups=[group], dictionary=("id",))
    if bound > limit:
        raise ShardFormatError(f"row group {group} may decode to {bound:,} bytes, over the {limit:,} a row group "
                               "may take", path=shard.path, expected=limit, actual=bound)
    if doc_id is None:
        return 0, wanted
    ids = pf.read_row_group(group, columns=["id"]).column("id").combine_chunks()
    if not pa.types.is_dictionary(ids.type):  # no string column: no id to match
        return None
    hit = pc.index(ids.dictionary, doc_id).as_py()  # the id's entry, found among the distinct ids
    if hit < 0:
        return None
    rows = np.flatnonzero(view(pc.cast(pc.fill_null(ids.indices, -1), pa.int64()), np.int64) == hit)
    return (int(rows[0]), 1) if len(rows) else None


def _text(tokens: list[int], tokenizer: LoadedTokenizer) -> str:
    info = tokenizer.info
    if tokens and tokens[-1] == info.eos_id:
        tokens = tokens[:-1]
    if info.add_bos and tokens and tokens[0] == info.bos_id:
        tokens = tokens[1:]
    return tokenizer.tokenizer.decode(tokens, skip_special_tokens=False)


def show_documents(root: str | os.PathLike | Corpus, *, subset: str, n: int = 5,
                   doc_id: str | None = None) -> list[ShownDocument]:
    """Decode documents of a local corpus (see the module docstring).

    Raises:
        InvalidManifestError: not a corpus, or ``subset`` naming no single subset.
        UnknownDocumentError: no document ``doc_id``.
        TokenizerChecksumError: ``tokenizer.json`` is not the one the manifest names.
        ShardMissingError: the subset's shards are not on local disk (a partial download).
        ShardFormatError: an unreadable shard.
    """
    corpus = root if isinstance(root, Corpus) else load_corpus(root)
    shards = shards_to_show(corpus.shards, corpus.manifest.subsets, subset)
    tokenizer = tokenizer_from_bytes((corpus.root / TOKENIZER).read_bytes(), corpus.manifest.tokenizer,
                                     where=str(corpus.root / TOKENIZER))

    def files() -> Iterator[tuple[ShardRecord, object]]:
        for s in shards:
            path = Path(corpus.root) / s.path
            if not path.is_file():
                raise ShardMissingError(f"shard of subset {s.subset!r} is not on local disk", path=str(path))
            yield s, str(path)

    return decode_rows(files(), tokenizer, n=n, doc_id=doc_id)
