"""Levanter token caches (Zarr v3, as Levanter writes them): detect, read, check, write, pin in place, convert.

A cache root holds ``shard_ledger.json`` and the arrays ``input_ids/offsets`` and ``input_ids/data``, or, in
the ``sharded`` layout, ``part-NNNNN-of-MMMMM/`` sub-caches; a *store* is a tree of cache roots whose
folders are subset names (``cluster=3/quality=4``). Everything is read through `marin_data.stores`, so
local paths, ``s3://`` and ``hf://`` behave alike, and every byte is hostile until checked.

The public API (docs/design.md, "Levanter caches", says why it looks like this):

- ``detect(url, **store_options) -> Source``: ``kind`` is ``"corpus"``, ``"cache"`` or ``"store"`` (with
  ``cells``); anything else is an `UnknownSourceError`.
- ``open_cache(store, prefix="") -> LevanterCache``: ledgers, ``zarr.json`` files and a listing, no data. Its
  ``parts`` (`CachePart`) list ``data_chunks()`` and ``offsets_chunks()`` (`ChunkFile`: path, index,
  ``[start, stop)``); ``read_chunk(chunk, meta)`` and ``document_ends(part)`` decode values.
- ``decode_chunk(data, meta, count, where) -> ndarray``: the values of one chunk file from its bytes (decode
  exactly the bytes you hashed); ``chunk_documents(tokens, ends, start) -> (tokens uint32, offsets int64)``
  cuts a data chunk at document ends, the loader's local form.
- ``iter_ends(cache, part)`` and ``TokenReader(cache, part, vocab_size=)``: a part's document ends, one offsets
  chunk file at a time and checked against the ledger, and its tokens by position, in bounded memory.
- ``check_cache(cache, tokens=False, vocab_size=None, expect_bos=None) -> list[Problem]``: the structural
  checks; ``verify_source(url, ...) -> VerifyReport`` runs them (and, on a pinned corpus, the hashes).
- ``write_cache(root, documents, dtype=, codec=LZ4|ZSTD, chunk=, inner=, layout=, parts=, tokenizer=,
  vocab_size=) -> Ledger``: a cache with Levanter's exact specs; ``CacheWriter(root, data_meta,
  offsets_meta, metadata=)`` with ``write(tokens, lengths)`` and ``close() -> Ledger`` streams one
  consolidated cache in bounded memory.
- ``adopt(path, tokenizer=, name=, license=) -> AdoptReport``: pin a cache or store in place (its
  ``manifest_sha256`` is the new root of trust); `cell_prefixes(manifest)` maps a pinned corpus's subsets
  to their cache roots.
- ``PinnedCells(corpus, read)``: a pinned corpus's cells as the loader reads them, every file through
  ``read`` (checked against the index): ``chunks(subset)`` its data chunk rows in flat-token order,
  ``decode(shard, data)`` one into the loader's local form, ``context(shard)`` what that decode depends on.
- ``cache_info(url) -> CacheInfo`` and ``show_cache(url, tokenizer=, subset=, n=, row=)``: ``info`` and
  ``show`` on an unpinned cache or store; ``download_cache(source, subsets=, dest=) -> CacheDownload``:
  ``download`` of one (sizes, then the copy's structure).
- ``convert_to_marin(source, dest=, tokenizer=, name=, subsets=, shard_tokens=) -> ConvertReport``: a cache or
  store (local, ``s3://``, ``hf://``; pinned: local) into a Parquet corpus, one subset per cell, ids
  ``<cell>:<row>``; ``convert_to_levanter(source, dest=, subsets=, dtype=, codec=) -> ConvertReport``: a local
  corpus into a store of consolidated caches, ``dest/<subset>/``. Both resume after a kill.
- ``order`` (imported on its own: ``marin_data.levanter.order.trace.open_trace``): a Levanter ``train_lm`` run's
  order in numpy, what ``marin-data trace`` answers from (docs/what-did-the-model-see.md).
"""

from marin_data.levanter.adopt import AdoptReport, adopt
from marin_data.levanter.arraymeta import LZ4, ZSTD, ArrayMeta, Blosc
from marin_data.levanter.cache import CachePart, ChunkFile, LevanterCache, chunk_documents, open_cache
from marin_data.levanter.cells import PinnedCells
from marin_data.levanter.checks import check_cache
from marin_data.levanter.convert import ConvertReport
from marin_data.levanter.chunkfile import decode_chunk
from marin_data.levanter.detect import CACHE, CORPUS, STORE, Source, detect
from marin_data.levanter.documents import TokenReader, iter_ends
from marin_data.levanter.download import CacheDownload, download_cache
from marin_data.levanter.ledger import Ledger
from marin_data.levanter.pinned import cell_prefixes, is_pinned_cache
from marin_data.levanter.summary import CacheInfo, cache_info, show_cache
from marin_data.levanter.to_levanter import convert_to_levanter
from marin_data.levanter.to_marin import convert_to_marin
from marin_data.levanter.verify import verify_source
from marin_data.levanter.writer import CacheWriter, write_cache

__all__ = ["AdoptReport", "adopt", "LZ4", "ZSTD", "ArrayMeta", "Blosc", "CachePart", "ChunkFile", "LevanterCache",
           "open_cache", "chunk_documents", "check_cache", "decode_chunk", "CACHE", "CORPUS", "STORE", "Source",
           "detect", "iter_ends", "TokenReader", "Ledger", "cell_prefixes", "is_pinned_cache", "CacheInfo",
           "cache_info", "show_cache", "verify_source", "CacheWriter", "write_cache", "PinnedCells", "CacheDownload",
           "download_cache", "ConvertReport", "convert_to_marin", "convert_to_levanter"]
