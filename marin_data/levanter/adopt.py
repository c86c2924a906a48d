"""``adopt``: pin a Levanter cache, or a store of them, in place, rewriting none of its bytes.

After the structural checks (`check_cache`) pass, every file of every cell is hashed and becomes a row of
``shards.parquet``: a data chunk file is a *shard* (its tokens, the documents that start in it, its stored
inner chunks), an offsets chunk file an ``offsets`` row, every other file (ledgers, ``zarr.json``,
``.success``, ``.stats.json``) a ``meta`` row, all under the subset of their cell, so that a download of a
subset fetches, and verify hashes, exactly its files; other tools' bookkeeping (`marin_data.corpus.foreign`:
``.cache/huggingface/``, Marin's executor files) is left in place, unpinned, and named in the report. A data
chunk file is decoded frame by frame as it is hashed, and a token id outside the tokenizer's vocabulary
refuses the whole adoption. Then ``tokenizer.json``, the card, ``croissant.json``, ``SHA256SUMS`` and last
``manifest.json`` (``format``: a store or a single cache) move in beside the cache's files as one commit
(`commit_corpus`): a run killed before its manifest leaves the cache as it was, one killed after it is finished
by the next run. From then on the folder is a corpus: verify, publish, download and serve it as any other.
docs/design.md ("Levanter caches") says why a chunk file is the shard.

A copy an unpinned download made carries the download's record (`marin_data.levanter.checked`): a file
whose SHA-256 differs from the one it arrived with refuses the adoption, and ``vouched.json`` (listed in
the manifest, written only beside such a copy) states per file whether its digest was checked against the
source, and by what, or first seen locally. Without a record every digest is first seen locally.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from marin_data.fileio.atomic import read_pieces, sha256_file
from marin_data.corpus.commit import commit_corpus, finish_commit
from marin_data.corpus.foreign import foreign
from marin_data.corpus.manifest import Manifest, load_corpus, summarize_subsets
from marin_data.corpus.names import as_subset_name
from marin_data.corpus.records import META, OFFSETS, SHARD, ShardRecord, SubsetInfo
from marin_data.engines.local import default_workers
from marin_data.errors import CorpusConflictError, ShardChecksumError
from marin_data.layout import ADOPT_JOURNAL, BY_SHA256, CARD, CHECKED, COMMIT, CROISSANT, LISTED, LOCK_NAME, \
    MANIFEST, MIRRORS, RECORD, SHARDS_INDEX, STAGING, SUMS, TOKENIZER, UNLISTED, VOUCHED
from marin_data.levanter.arraymeta import ArrayMeta
from marin_data.levanter.cache import LevanterCache, open_cache
from marin_data.levanter.checked import Checked, read_checked
from marin_data.levanter.checks import check_cache, refuse_problems
from marin_data.docs.questions import load_metadata
from marin_data.levanter.describe import descriptions_of, render_cache_card, render_cache_croissant
from marin_data.levanter.detect import CACHE, CORPUS, Source, detect
from marin_data.levanter.filehash import ChunkCheck, hash_stream
from marin_data.levanter.ledgermeta import agreed, load_framed
from marin_data.levanter.pinned import LEVANTER_CACHE, LEVANTER_STORE
from marin_data.fileio.lock import corpus_lock
from marin_data.stores.local import LocalStore

__all__ = ["AdoptReport", "CacheFile", "FIRST_SEEN", "adopt", "commit_pin", "adopt_found", "adopt_corpus", "cache_rows",
           "cache_files", "is_ours", "tokenizer_name_for", "vouched_by"]

NAME_GIVEN = "given with --tokenizer-name"
NAME_FROM_LEDGERS = "from the caches' ledgers"
NAME_FROM_TOKENIZER = "from the --tokenizer path or repo id"
NAME_FROM_PIN = "from the pin the stopped run committed"

_OURS = {MANIFEST, SHARDS_INDEX, SUMS, TOKENIZER, MIRRORS, RECORD, CHECKED, VOUCHED, LOCK_NAME, ADOPT_JOURNAL, *LISTED,
         *UNLISTED}
FIRST_SEEN = "first-seen-locally"


@dataclass(frozen=True)
class AdoptReport:
    root: str
    manifest_sha256: str
    subsets: tuple[str, ...]
    files: int
    bytes: int
    seconds: float | None  # hashing; None: a killed run's pin, moved in (nothing hashed again)
    skipped: tuple[str, ...] = ()  # other tools' bookkeeping left in place, unpinned (`foreign`)
    tokenizer: str = ""  # the tokenizer's name the manifest records
    tokenizer_from: str = ""  # where that name came from: one of the NAME_* phrases
    checked: dict[str, int] = field(default_factory=dict)  # digest algorithm -> files checked against the source
    first_seen: tuple[str, ...] = ()  # files whose digest was first seen locally (no source vouched for one)
    data: str = ""  # where the pinned files are, when the pin is kept apart from them (``root``: the pin)
    reused: int = 0  # files not hashed again: an earlier run's (its journal) or an earlier pin's rows
    read_at: str = ""  # the data as it was read, where that says more than its URL: an hf:// repo's commit


@dataclass(frozen=True)
class CacheFile:
    """One file of a cell to hash and what its row says beyond its bytes (`cache_files`)."""

    path: str  # relative to the root
    subset: str
    kind: str
    tokens: int = 0
    docs: int = 0
    meta: object = None  # the data array's ArrayMeta, to count a data chunk file's stored inner chunks


def adopt(path: str | os.PathLike, *, tokenizer: str, name: str | None = None, version: str = "1",
          license: str = "unknown", workers: int | None = None, tokenizer_name: str | None = None,
          meta: str | os.PathLike | None = None) -> AdoptReport:
    """Pin the Levanter cache or store at ``path`` (a local folder) in place.

    Args:
        tokenizer: the tokenizer the cache was built with (a ``tokenizer.json`` path or a Hub repo id);
            its ``tokenizer.json`` is copied beside the cache and fingerprinted in the manifest.
        name: the corpus's name (default: the folder's); for a single cache, also its one subset's.
        license: an SPDX id recorded for every subset the metadata file gives none.
        workers: hashing threads (default: one per available core).
        tokenizer_name: the tokenizer's name in the manifest (default: the one every cache's ledger gives,
            when they agree; else derived from ``tokenizer``). Its BOS id is recorded when every ledger says
            ``append_bos: true`` (`marin_data.levanter.ledgermeta`).
        meta: a datasheet metadata file (`marin_data.docs.questions`) whose ``subsets`` blocks may also give a
            ``license``: each cell's license, and its description for the card and Croissant file.

    Raises:
        UnknownSourceError: ``path`` holds no cache; CorpusConflictError: it is a corpus already, or holds a
            file adopt would write (a Hub repo's ``README.md``).
        CacheFormatError, CacheUnfinishedError, CacheCheckError: a structural check failed, or a token id lies
            outside the tokenizer's vocabulary (checked while each data chunk file is hashed; nothing written).
        InvalidTokenizerError: the tokenizer cannot be loaded; InvalidMetadataError: a bad metadata file.
    """
    root = Path(path)
    if _killed(root):
        return _finish(root)
    return adopt_found(detect(root), root, tokenizer=tokenizer, name=name, version=version, license=license,
                       workers=workers, tokenizer_name=tokenizer_name, meta=meta)


def adopt_corpus(path: str | os.PathLike) -> AdoptReport:
    """`adopt` of a folder holding a manifest: a pin a killed run committed is moved in (and reported), any
    other corpus refused (CorpusConflictError)."""
    root = Path(path)
    if _killed(root):
        return _finish(root)
    raise CorpusConflictError(f"already a marin corpus ({MANIFEST} is there): nothing to adopt", path=str(root))


def _killed(root: Path) -> bool:
    """A run killed past its commit point (its journal not yet cleared): the next one finishes it."""
    return (root / COMMIT / MANIFEST).exists() or (root / MANIFEST).exists() and (root / STAGING).exists()


def adopt_found(found: Source, path: str | os.PathLike, *, tokenizer: str, name: str | None = None,
                version: str = "1", license: str = "unknown", workers: int | None = None,
                tokenizer_name: str | None = None, meta: str | os.PathLike | None = None) -> AdoptReport:
    """`adopt` of the source ``found`` (`detect`) at the local folder ``path``."""
    root = Path(path)
    if found.kind == CORPUS:
        raise CorpusConflictError(f"already a marin corpus ({MANIFEST} is there): nothing to adopt", path=str(root))
    taken = [n for n in (TOKENIZER, CARD, CROISSANT, SHARDS_INDEX, SUMS, VOUCHED) if (root / n).exists()]
    if taken:
        raise CorpusConflictError(f"{', '.join(taken)} already there: adopt writes its own and overwrites no file; "
                                  "move them away first", path=str(root), actual=taken)
    name = name or as_subset_name(root.resolve().name)
    cells = {as_subset_name(name): ""} if found.kind == CACHE else {c: c for c in found.cells}
    answers = load_metadata(meta, subsets=cells, licenses=True)
    caches = {s: open_cache(found.store, p, require_finished=False) for s, p in cells.items()}
    named, named_from = tokenizer_name_for(tokenizer_name, caches.values())
    loaded = load_framed(tokenizer, caches.values(), name=named)
    licenses = {s: answers.licenses.get(s, license) for s in cells}
    descriptions = descriptions_of(answers, cells)
    refuse_problems([p for c in caches.values() for p in check_cache(c, vocab_size=loaded.info.vocab_size)],
                    str(root))
    with corpus_lock(root):
        files, skipped = _cell_files(root, caches, found.skipped)
        jobs = [j for subset, cache in caches.items() for j in cache_files(subset, cache, files[subset])]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, min(workers or default_workers(), len(jobs) or 1))) as pool:
            rows = list(pool.map(lambda j: _hash(root, j, loaded.info.vocab_size), jobs))
        seconds = time.perf_counter() - t0
        record = read_checked(root)
        vouched = _vouched(rows, record[1] if record else {}, str(root))
        manifest = Manifest(name=name, version=version, tokenizer=loaded.info,
                            subsets={s: SubsetInfo(0, 0, 0, 0, licenses[s]) for s in cells},
                            format=LEVANTER_CACHE if found.kind == CACHE else LEVANTER_STORE)
        # vouched.json only beside a downloaded copy: a cache adopted where it was built pins as before
        digest = commit_pin(root, manifest, rows, licenses=licenses, descriptions=descriptions,
                            tokenizer=loaded.data, vouched=(record[0], vouched) if record is not None else None)
    return AdoptReport(root=str(root), manifest_sha256=digest, subsets=tuple(sorted(cells)), files=len(rows),
                       bytes=sum(r.bytes for r in rows), seconds=seconds, skipped=skipped,
                       tokenizer=loaded.info.name, tokenizer_from=named_from, **vouched_by(vouched))


def vouched_by(vouched: dict[str, dict]) -> dict:
    """`AdoptReport`'s ``checked`` (algorithm -> files checked against the source by it) and ``first_seen``
    (the files no source vouched for) of a ``vouched.json``'s ``files``."""
    checked: dict[str, int] = {}
    for v in vouched.values():
        if v["checked"] != FIRST_SEEN:
            checked[v["checked"]] = checked.get(v["checked"], 0) + 1
    return {"checked": checked, "first_seen": tuple(p for p, v in vouched.items() if v["checked"] == FIRST_SEEN)}


def commit_pin(root: Path, manifest: Manifest, rows: list[ShardRecord], *, licenses: dict[str, str],
               descriptions: dict[str, str], tokenizer: bytes, vouched: tuple[str, dict] | None) -> str:
    """Commit the pin of ``rows`` in ``root`` (`commit_corpus`: one commit, the manifest last) with its
    ``tokenizer.json``, card, ``croissant.json`` and, given ``(source, files)``, ``vouched.json``; return the
    manifest's sha256."""
    described = replace(manifest, subsets=summarize_subsets(rows, licenses))
    staged = {TOKENIZER: tokenizer, CARD: render_cache_card(described, descriptions).encode(),
              CROISSANT: render_cache_croissant(described, rows, descriptions).encode()}
    if vouched is not None:
        staged[VOUCHED] = json.dumps({"source": vouched[0], "files": vouched[1]}, indent=1).encode()
    return commit_corpus(root, manifest, rows, staged=staged)


def tokenizer_name_for(given: str | None, caches: Iterable[LevanterCache]) -> tuple[str | None, str]:
    """The tokenizer's name for the manifest and where it came from: ``given``, else the name every cache's
    ledger records, else None (`load_tokenizer` derives one from the tokenizer's path or repo id)."""
    if given:
        return given, NAME_GIVEN
    recorded = agreed(caches, "tokenizer")
    if isinstance(recorded, str) and recorded:
        return recorded, NAME_FROM_LEDGERS
    return None, NAME_FROM_TOKENIZER


def _vouched(rows: list[ShardRecord], record: dict[str, Checked], where: str) -> dict[str, dict]:
    """Per row, path -> how its digest is vouched for: ``{"checked": algorithm, "digest": the source's}`` when
    the download checked it against the source, else ``{"checked": "first-seen-locally"}``.

    Raises:
        ShardChecksumError: a file whose bytes changed since the download recorded them.
    """
    out = {}
    for r in sorted(rows, key=lambda r: r.path):
        e = record.get(r.path)
        if e is not None and (e.sha256, e.bytes) != (r.sha256, r.bytes):
            raise ShardChecksumError(f"sha256 {r.sha256[:12]}… differs from the {e.sha256[:12]}… it had when it "
                                     f"was downloaded ({CHECKED}): changed since; download it again", path=r.path,
                                     expected=e.sha256, actual=r.sha256)
        out[r.path] = ({"checked": e.checked, "digest": e.vouched[e.checked]} if e is not None and e.against_source
                       else {"checked": FIRST_SEEN})
    return out


def _finish(root: Path) -> AdoptReport:
    """Move in the pin a killed run had committed (what its journal still holds), and report it."""
    with corpus_lock(root):
        finish_commit(root)
        corpus = load_corpus(root)
    if corpus.manifest.format not in (LEVANTER_CACHE, LEVANTER_STORE):
        raise CorpusConflictError(f"already a marin corpus ({MANIFEST} is there): nothing to adopt", path=str(root))
    return AdoptReport(root=str(root), manifest_sha256=corpus.manifest_sha256,
                       subsets=tuple(sorted(corpus.manifest.subsets)), files=len(corpus.shards),
                       bytes=sum(r.bytes for r in corpus.shards), seconds=None,
                       tokenizer=corpus.manifest.tokenizer.name, tokenizer_from=NAME_FROM_PIN)


def cache_rows(cache: LevanterCache) -> dict[str, tuple[str, int, int]]:
    """Every chunk file of ``cache`` that the index lists apart: path -> (kind, tokens, documents starting in
    it). A data chunk file's documents are those whose first token lies in it (the last file also takes
    empty documents at the very end), so they add up to the cache's rows."""
    out = {}
    for part in cache.parts:
        ends = cache.document_ends(part)
        starts = np.concatenate([[0], ends[:-1]]) if len(ends) else ends
        chunks = part.data_chunks()
        for i, c in enumerate(chunks):
            stop = c.stop if i < len(chunks) - 1 else np.iinfo(np.int64).max
            docs = int(np.searchsorted(starts, stop, "left") - np.searchsorted(starts, c.start, "left"))
            out[c.path] = (SHARD, c.count, docs)
        for c in part.offsets_chunks():
            out[c.path] = (OFFSETS, 0, 0)
    return out


def _cell_files(root: Path, caches: dict[str, LevanterCache],
                beside: tuple[str, ...]) -> tuple[dict[str, list[str]], tuple[str, ...]]:
    """Each cell's files but other tools' bookkeeping (`foreign`), and that bookkeeping, with what detection
    skipped ``beside`` the cells (sorted, each folder once)."""
    files: dict[str, list[str]] = {}
    skipped = set(beside)
    for subset, cache in caches.items():
        listed = [o.path for o in LocalStore(root).list(cache.prefix)]
        files[subset] = [f for f in listed if not foreign(f)]
        skipped.update(foreign(f) for f in listed if foreign(f))
    return files, tuple(sorted(skipped))


def is_ours(path: str) -> bool:
    """Whether ``path`` (relative to a pinned cache's root) is a file the pin or its writers put there."""
    return path in _OURS or path.split("/")[0] in (STAGING, BY_SHA256)


def cache_files(subset: str, cache: LevanterCache, files: list[str]) -> list[CacheFile]:
    """A job per file of ``cache`` (``files``: those its folder holds, other tools' bookkeeping left out): its
    kind, tokens and documents (`cache_rows`), a data chunk file's array."""
    known = cache_rows(cache)
    data_meta = {c.path: p.data for p in cache.parts for c in p.data_chunks()}
    if not cache.prefix:  # a single cache at the corpus root: our own files are no part of it
        files = [f for f in files if not is_ours(f)]
    return [CacheFile(f, subset, *known.get(f, (META, 0, 0)), meta=data_meta.get(f)) for f in files]


def _hash(root: Path, job: CacheFile, vocab_size: int) -> ShardRecord:
    if job.kind == SHARD:
        digest, size, row_groups = _hash_chunk(root / job.path, job.meta, job.tokens, vocab_size)
    else:
        (digest, size), row_groups = sha256_file(root / job.path), 0
    return ShardRecord(path=job.path, subset=job.subset, bytes=size, sha256=digest, docs=job.docs,
                       tokens=job.tokens, row_groups=row_groups, kind=job.kind)


def _hash_chunk(path: Path, meta: ArrayMeta, count: int, vocab_size: int) -> tuple[str, int, int]:
    """A data chunk file's sha256, size and stored inner chunks, its ``count`` token ids checked against the
    vocabulary in the same pass (`hash_stream`): its index read first, then the file once from its start.

    Raises:
        CacheCheckError: a token id outside ``[0, vocab_size)``; CacheFormatError: a bad index or frame, or
            the file changed while it was read.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, meta.index_bytes, max(0, size - meta.index_bytes))
    except BaseException:
        os.close(fd)
        raise
    hashed = hash_stream(read_pieces(fd), size=size, where=str(path), chunk=ChunkCheck(meta, count, vocab_size),
                         tail=tail)  # read_pieces closes the descriptor
    return hashed.digests["sha256"], size, hashed.row_groups
