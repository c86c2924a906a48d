"""``convert --format levanter``: a Parquet corpus into a store of Levanter caches, one per subset.

Subset ``S`` becomes the consolidated cache ``DEST/S/`` (a store's cells are folders named like subsets), its
documents in the order of the subset's shards, written by `CacheWriter` with Levanter's own array specs
(blosc lz4 clevel 5 by default, which every Levanter reads; zstd clevel 1 as newer Levanter writes) in
bounded memory: one chunk of tokens and a row group of the shard being read. Each shard's SHA-256 and size
are checked against the index before it is read. The ledger records in ``preprocessor_metadata``, as
Levanter's tokenizer run does, the tokenizer's name (the manifest's) and vocabulary, and what the documents
were seen to be framed with: ``append_eos`` true when every document ends with the manifest's EOS id,
``append_bos`` when every one opens with the tokenizer's BOS id (the manifest's, else the one its
``tokenizer.json`` marks). A fact the corpus cannot tell (a tokenizer with no BOS it knows of, a subset of no
documents) is left out rather than guessed.

A cache is written under ``DEST/.staging/`` and renamed to ``DEST/S`` when its ledger is written, so a folder
under a subset's name is always a whole cache: a run killed at any point leaves the finished subsets, and a
re-run redoes only the others. A finished cache in the way is reused when it holds the subset's counts with
the same settings, else refused. docs/design.md, "Converting between the formats".
"""

from __future__ import annotations

import os
import shutil
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from marin_data.fileio.arrays import view
from marin_data.fileio.atomic import SafeDir
from marin_data.corpus.manifest import Corpus, load_corpus
from marin_data.corpus.names import select_subsets
from marin_data.corpus.records import ShardRecord
from marin_data.corpus.shard import check_schema, check_shard_counts, check_shard_file
from marin_data.engines.local import default_workers
from marin_data.errors import ConvertConflictError, ShardFormatError, UnknownSourceError, UnsupportedFormatError
from marin_data.layout import LOCK_NAME, MANIFEST, STAGING, TOKENIZER
from marin_data.levanter.arraymeta import LEVANTER_CHUNK, LEVANTER_INNER, LZ4, ArrayMeta, Blosc
from marin_data.levanter.cache import DATA_ARRAY, open_cache
from marin_data.levanter.checks import TOKEN_DTYPES
from marin_data.levanter.convert import LEVANTER, ConvertReport, Run, on_threads, refuse_inside
from marin_data.levanter.detect import CORPUS, detect, find_cells
from marin_data.levanter.writer import CacheWriter
from marin_data.fileio.lock import corpus_lock
from marin_data.fileio.parquet_io import open_parquet
from marin_data.raw.tokenizer import marked_bos, tokenizer_from_bytes
from marin_data.stores.local import LocalStore

__all__ = ["convert_to_levanter", "convert_corpus_to_levanter"]


@dataclass(frozen=True)
class _Target:
    """How every cache of this run is written."""

    data: ArrayMeta
    offsets: ArrayMeta
    metadata: dict  # the ledger's preprocessor_metadata, less what each cache's documents show (`_Framing`)
    vocab: int
    eos: int
    bos: int | None  # None: the tokenizer has no BOS the corpus knows of


class _Framing:
    """Whether every document seen so far opens with BOS and ends with EOS: Levanter's ``append_bos`` and
    ``append_eos``, as seen (an empty document has neither)."""

    def __init__(self, target: _Target) -> None:
        self.bos, self.eos = target.bos, target.eos
        self.docs, self.starts, self.ends = 0, True, True

    def see(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        if not len(lengths):
            return
        ends = np.cumsum(lengths)
        full = lengths > 0
        self.docs += len(lengths)
        self.ends = self.ends and bool(full.all()) and bool(np.all(tokens[ends - 1] == self.eos))
        self.starts = self.starts and bool(full.all()) and self.bos is not None and \
            bool(np.all(tokens[ends - lengths] == self.bos))

    def metadata(self) -> dict:
        if not self.docs:
            return {}
        return {**({"append_bos": self.starts} if self.bos is not None else {}), "append_eos": self.ends}


def convert_to_levanter(source: str | os.PathLike, *, dest: str | os.PathLike, subsets: Sequence[str] | None = None,
                        dtype: str = "int32", codec: Blosc | None = LZ4, chunk: int = LEVANTER_CHUNK,
                        inner: int = LEVANTER_INNER, manifest_sha256: str | None = None,
                        workers: int | None = None) -> ConvertReport:
    """Write each selected subset of the local corpus ``source`` as the Levanter cache ``dest/<subset>``.

    Args:
        subsets: names, globs or parents of subsets (default: all).
        dtype: of the token values, ``int32`` (every Levanter) or ``int64``.
        codec: blosc settings of both arrays (`LZ4`, or `ZSTD`, which Levanter before 0.2.227 cannot open).
        chunk, inner: elements per chunk file and inner chunk (Levanter's grid by default).
        manifest_sha256: the corpus's manifest must have this sha256.
        workers: subsets written at once, each on a thread holding one chunk of tokens (0.5 GiB of int32 at
            Levanter's grid) and a row group (default: one per available core).

    Raises:
        UnsupportedFormatError: ``source`` is not a local Parquet corpus (a published one: download it first),
            or its vocabulary does not fit ``dtype``.
        ConvertConflictError: ``dest`` is a corpus or lies inside ``source``; a subset nests inside another
            (a cache cannot hold a cache); a finished cache in the way holds other counts or settings.
        ShardChecksumError, ShardMissingError, ShardFormatError: a shard is not what the index says.
        CorpusLockedError: another process writes ``dest``.
    """
    if "://" in str(source):
        raise UnsupportedFormatError("a published corpus is converted from local disk: `marin-data download` the "
                                     "subsets you want first (every shard checked), then convert the copy",
                                     path=str(source))
    found = detect(source)
    if found.kind != CORPUS or found.pinned_cache:
        raise UnsupportedFormatError("not a marin corpus of Parquet shards: nothing to convert to Levanter caches "
                                     "(a pinned Levanter cache already is one)", path=str(source))
    return convert_corpus_to_levanter(found, source, dest=dest, subsets=subsets, dtype=dtype, codec=codec, chunk=chunk,
                                      inner=inner, manifest_sha256=manifest_sha256, workers=workers)


def convert_corpus_to_levanter(found, source: str | os.PathLike, *, dest: str | os.PathLike,
                               subsets: Sequence[str] | None = None, dtype: str = "int32", codec: Blosc | None = LZ4,
                               chunk: int = LEVANTER_CHUNK, inner: int = LEVANTER_INNER,
                               manifest_sha256: str | None = None, workers: int | None = None) -> ConvertReport:
    """`convert_to_levanter` of the local Parquet corpus ``source`` as its format found it (``found.store``:
    its local store)."""
    t0 = time.perf_counter()
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"token dtype {dtype!r}: {' or '.join(TOKEN_DTYPES)}")
    refuse_inside(found, dest)
    corpus = load_corpus(source, manifest_sha256=manifest_sha256)
    chosen = select_subsets(corpus.manifest.subsets, subsets)
    nested = sorted((a, b) for a in chosen for b in chosen if b.startswith(a + "/"))
    if nested:
        raise ConvertConflictError(f"subset {nested[0][1]!r} lies inside subset {nested[0][0]!r}: a store's cache "
                                   "holds no cache inside it; convert them into different destinations",
                                   path=str(source), actual=[list(n) for n in nested])
    info = corpus.manifest.tokenizer
    if info.vocab_size - 1 > np.iinfo(dtype).max:
        raise UnsupportedFormatError(f"token ids up to {info.vocab_size - 1} do not fit {dtype}: choose int64",
                                     path=str(source))
    data = ArrayMeta(dtype=dtype, chunk=chunk, inner=inner, blosc=codec)
    target = _Target(data, replace(data, dtype="int64"), {"tokenizer": info.name, "vocab_size": info.vocab_size},
                     info.vocab_size, info.eos_id, info.bos_id if info.bos_id is not None else _marked_bos(corpus))
    root = Path(dest)
    _check_store(root)
    with corpus_lock(root):
        reused = tuple(s for s in chosen if _finished(root, s, corpus, target))
        todo = [s for s in chosen if s not in reused]
        on_threads(lambda subset, run: _write_subset(root, subset, corpus, target, run), todo,
                   workers=workers or default_workers(), tokens=sum(corpus.manifest.subsets[s].tokens for s in todo))
        shutil.rmtree(root / STAGING, ignore_errors=True)
    files = [(root / s / DATA_ARRAY).glob("c/*") for s in todo]
    sizes = [p.stat().st_size for found_files in files for p in found_files]
    return ConvertReport(str(source), str(dest), LEVANTER, tuple(todo), reused, (),
                         docs=sum(corpus.manifest.subsets[s].docs for s in todo),
                         tokens=sum(corpus.manifest.subsets[s].tokens for s in todo), files=len(sizes),
                         bytes=sum(sizes), seconds=time.perf_counter() - t0)


def _marked_bos(corpus: Corpus) -> int | None:
    """The BOS id the corpus's ``tokenizer.json`` marks, when its manifest records none."""
    data = (corpus.root / TOKENIZER).read_bytes()
    return marked_bos(tokenizer_from_bytes(data, corpus.manifest.tokenizer, where=str(corpus.root / TOKENIZER)))


def _check_store(root: Path) -> None:
    """Refuse a destination that is not empty, nor a store of caches (an earlier run's, or any other): its
    files would make it no store, and no folder of it is ours to write into.

    Raises:
        ConvertConflictError: a corpus, or files outside every cache.
    """
    if (root / MANIFEST).exists():
        raise ConvertConflictError(f"a marin corpus ({MANIFEST}): a store of Levanter caches goes elsewhere",
                                   path=str(root))
    if root.is_dir() and any(p.name not in (LOCK_NAME, STAGING) for p in root.iterdir()):
        try:
            find_cells(LocalStore(root))
        except UnknownSourceError as e:
            raise ConvertConflictError(f"not empty, and not a store of Levanter caches: {e.message}",
                                       path=str(root)) from e


def _finished(root: Path, subset: str, corpus: Corpus, target: _Target) -> bool:
    """Whether ``root/subset`` is already this subset's cache (an earlier run's): a finished ledger with its
    documents and tokens, the same metadata and array specs. False when nothing is there.

    Raises:
        ConvertConflictError: something else is there.
    """
    folder = root / subset
    if not folder.exists():
        return False
    want = corpus.manifest.subsets[subset]
    try:
        cache = open_cache(LocalStore(folder))
        part = cache.parts[0]
        metadata = cache.ledger.preprocessor_metadata or {}
        same = (cache.rows, cache.tokens, {k: metadata.get(k) for k in target.metadata}, part.data, part.offsets) == \
            (want.docs, want.tokens, target.metadata, target.data, target.offsets)
    except Exception as e:  # noqa: BLE001 - whatever makes it unreadable, it is not ours to replace
        raise ConvertConflictError(f"holds something that is not a finished Levanter cache ({e})",
                                   path=str(folder)) from e
    if not same:
        raise ConvertConflictError(f"holds a Levanter cache of {cache.rows} rows and {cache.tokens} tokens "
                                   f"({part.data.dtype}), not subset {subset!r} as this run writes it "
                                   f"({want.docs} documents, {want.tokens} tokens, {target.data.dtype})",
                                   path=str(folder))
    return True


def _write_subset(root: Path, subset: str, corpus: Corpus, target: _Target, run: Run) -> None:
    """Write ``subset``'s cache under ``.staging/``, then rename it to ``root/subset``."""
    staging = root / STAGING / urllib.parse.quote(subset, safe="")
    shutil.rmtree(staging, ignore_errors=True)  # what a killed run left
    writer = CacheWriter(staging, target.data, target.offsets, metadata=target.metadata, top=root)
    framing = _Framing(target)
    for shard in sorted(corpus.shards_of([subset]), key=lambda s: s.path):
        for tokens, lengths in _shard_documents(corpus.root / shard.path, shard, target.vocab):
            run.check()
            writer.write(tokens, lengths)
            framing.see(tokens, lengths)
            run.count(len(tokens))
    writer.metadata = {**target.metadata, **framing.metadata()}  # the ledger, written last, says what was seen
    writer.close()
    with SafeDir(root, STAGING) as src, SafeDir(root, Path(subset).parent) as dst:
        if dst.lstat(Path(subset).name) is not None:
            raise ConvertConflictError("appeared while its cache was being written", path=str(root / subset))
        os.replace(staging.name, Path(subset).name, src_dir_fd=src.fd, dst_dir_fd=dst.fd)
        os.fsync(dst.fd)


def _shard_documents(path: Path, shard: ShardRecord, vocab: int):
    """A shard's documents row group by row group, ``(tokens uint32, lengths)``, once its SHA-256 and size are
    the index's; then its counts are checked against the index too.

    Raises:
        ShardMissingError, ShardChecksumError, ShardFormatError: as the loader's decode raises them.
    """
    check_shard_file(path, shard)
    docs = tokens = 0
    try:
        with open_parquet(path) as pf:
            check_schema(pf.schema_arrow, path)
            for group in range(pf.metadata.num_row_groups):
                column = pf.read_row_group(group, columns=["tokens"]).column("tokens").combine_chunks()
                offsets = view(column.offsets, np.int64)
                values = view(column.values, np.uint32)[offsets[0]:offsets[-1]]
                if len(values) and int(values.max()) >= vocab:
                    raise ShardFormatError(f"token id {int(values.max())} in row group {group} is outside the "
                                           f"vocabulary [0, {vocab}) of the corpus's tokenizer", path=str(path))
                docs, tokens = docs + len(column), tokens + len(values)
                yield values, np.diff(offsets)
    except ShardFormatError:
        raise
    except (OSError, ValueError, KeyError) as e:  # pyarrow raises ArrowInvalid (a ValueError) on garbage
        raise ShardFormatError(f"not a readable shard: {e}", path=str(path)) from e
    check_shard_counts(path, shard, docs, tokens)
