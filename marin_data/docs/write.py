"""``marin-data datasheet``: write a corpus's documentation from its data.

Four outputs, all computed from the manifest, the shard index and the shards, plus curated answers from a
metadata file (`marin_data.docs.questions`): the dataset card ``README.md``, ``croissant.json``, the figures
``datasheets/*.png`` and the datasheet ``datasheets/datasheet.md``.

Where they go, and the one circularity, resolved deliberately:

- By default into the corpus, and the card, Croissant file and figures are then *listed in the manifest*
  (``commit_corpus(..., extra_files=...)``), so ``SHA256SUMS``, ``verify``, publish and mirrors cover them.
- The datasheet states the manifest's sha256 — the root of trust users pin with ``--manifest-sha256``.
  A file listed in the manifest cannot state the manifest's digest (the digest would have to cover
  itself), and stating the digest of the manifest *before* the documents were added would print download
  and verify commands that fail against the corpus actually published. So the datasheet is written last,
  states the digest of the manifest as finally committed, and is the one file of the corpus the manifest
  does not list (`UNLISTED`). Its numbers remain checkable (they are the manifest's); its authenticity,
  like any statement of a root digest, comes from where it is read, not from the corpus it vouches for.
- With ``out=DIR`` everything is written under ``DIR`` in the same layout and the corpus is not touched;
  the datasheet then states the corpus's current manifest digest.
- A pinned Levanter cache or store is documented the same way, its statistics from the cache
  (`marin_data.docs.cachestats`), its card and Croissant file its own (`marin_data.levanter.describe`). One
  nothing pins (local, ``s3://``, ``hf://``) is documented under ``out`` only, with the tokenizer it was
  built with: the datasheet and figures, saying it is not pinned; the card and Croissant file, which list
  what a pin vouches for, come with ``adopt``.

Re-running on an unchanged corpus rewrites nothing: outputs are byte-deterministic, a file whose bytes are
already right is not rewritten, and the manifest is re-committed only when the listed files changed — so
the stated digest stays the same. Publishing never changes the manifest: it records the mirror in
``mirrors.json``, which the datasheet lists, so regenerating after a publish changes the datasheet alone.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from marin_data.fileio.atomic import atomic_write_bytes, sha256_file
from marin_data.corpus.commit import commit_corpus, finish_commit
from marin_data.corpus.manifest import LEVANTER_CACHE, LEVANTER_STORE, Corpus, Manifest, load_corpus
from marin_data.corpus.mirrors import read_mirrors
from marin_data.corpus.names import as_subset_name
from marin_data.corpus.records import SubsetInfo
from marin_data.corpus.sample import SAMPLE_JSON, SAMPLE_META
from marin_data.docs.cachesheet import CacheSource
from marin_data.docs.cachestats import CacheStats, cache_stats
from marin_data.docs.card import render_card
from marin_data.docs.croissant import render_croissant
from marin_data.docs.datasheet import render_datasheet
from marin_data.docs.distribution import ENDPOINT_FLAGS
from marin_data.docs.figures import composition_png, heatmap_png, lengths_png
from marin_data.docs.questions import load_metadata, require_complete
from marin_data.docs.stats import SCAN_TOKENS, CorpusStats, corpus_stats
from marin_data.errors import InvalidTokenizerError, UnpinnedCacheError, UnsupportedFormatError
from marin_data.layout import CARD, CROISSANT, DATASHEET, FIGURES, HEATMAP, MANIFEST, SHARDS_INDEX, SUMS, TOKENIZER, \
    UNLISTED
from marin_data.levanter.cache import open_cache
from marin_data.levanter.describe import render_cache_card, render_cache_croissant
from marin_data.levanter.detect import CACHE, CORPUS, STORE, Source, detect
from marin_data.levanter.pinned import cell_prefixes, is_pinned_cache
from marin_data.transfer.read import read_file
from marin_data.levanter.summary import cell_bytes, open_cells
from marin_data.fileio.lock import corpus_lock
from marin_data.raw.tokenizer import load_tokenizer, tokenizer_from_bytes
from marin_data.stores.base import METADATA_LIMIT
from marin_data.stores.local import LocalStore

__all__ = ["DatasheetResult", "write_datasheet", "source_subsets"]


@dataclass(frozen=True)
class DatasheetResult:
    dest: Path  # the corpus root, or the --out directory
    in_corpus: bool
    manifest_sha256: str | None  # the digest the datasheet states (the manifest now on disk); None: not pinned
    written: tuple[str, ...]  # files whose bytes changed (relative to dest)
    unchanged: tuple[str, ...]  # files that already held exactly these bytes
    unanswered: tuple[str, ...]  # question ids marked "Not answered."
    previous_sha256: str | None = None  # the manifest's digest before this run, where the run changed it

    @property
    def datasheet(self) -> Path:
        return self.dest / DATASHEET


def _write_if_changed(dest: Path, rel: str, data: bytes) -> bool:
    """Write ``data`` to ``dest/rel`` atomically unless a regular file there already holds exactly it (keeps
    mtimes of a re-run); a link below ``dest`` is refused, never followed (`marin_data.fileio.atomic.SafeDir`)."""
    path = dest / rel
    try:
        if stat.S_ISREG(path.lstat().st_mode) and path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
    except (FileNotFoundError, NotADirectoryError):
        pass
    atomic_write_bytes(path, data, root=dest)
    return True


def _commit_listed(corpus: Corpus, generated: Sequence[str]) -> str:
    """List the generated files in the manifest (if not already, with these digests); return its sha256."""
    files = corpus.manifest.files
    current = all(
        rel in files and (files[rel].sha256, files[rel].bytes) == sha256_file(corpus.root / rel) for rel in generated
    ) and not any(rel in files for rel in UNLISTED)
    if current:
        return corpus.manifest_sha256
    keep = [rel for rel in files if rel not in {TOKENIZER, SHARDS_INDEX, SUMS, *generated, *UNLISTED}]
    return commit_corpus(corpus.root, corpus.manifest, corpus.shards, extra_files=sorted({*keep, *generated}))


def _figures(stats: CorpusStats) -> dict[str, bytes]:
    heatmap = heatmap_png(stats)
    return {FIGURES[0]: composition_png(stats), FIGURES[1]: lengths_png(stats),
            **({HEATMAP: heatmap} if heatmap is not None else {})}


def _pinned_stats(corpus: Corpus, scan_tokens: int) -> CacheStats:
    """The statistics of a pinned cache's cells, each checked against the manifest's totals, read with the
    pinned tokenizer (checked against the manifest's fingerprint)."""
    store, manifest = LocalStore(corpus.root), corpus.manifest
    tokenizer = tokenizer_from_bytes(read_file(store, TOKENIZER, limit=METADATA_LIMIT) or b"", manifest.tokenizer,
                                     where=str(corpus.root / TOKENIZER))
    return cache_stats({s: open_cache(store, p) for s, p in cell_prefixes(manifest).items()},
                       sizes={s: i.bytes for s, i in manifest.subsets.items()}, tokenizer=tokenizer,
                       licenses={s: i.license for s, i in manifest.subsets.items()}, expected=manifest.subsets,
                       scan_tokens=scan_tokens)


def _generate(corpus: Corpus, out: Path | None, meta_path, strict: bool, scan_tokens: int) -> DatasheetResult:
    meta = load_metadata(meta_path, subsets=corpus.manifest.subsets)
    if strict:
        require_complete(meta, corpus.manifest.subsets)  # before anything is written
    cache = None
    if is_pinned_cache(corpus.manifest):
        computed = _pinned_stats(corpus, scan_tokens)
        stats = computed.corpus
        outputs = {CARD: render_cache_card(corpus.manifest).encode(),
                   CROISSANT: render_cache_croissant(corpus.manifest, list(corpus.shards)).encode(), **_figures(stats)}
        cache = CacheSource(url=str(corpus.root), kind=STORE if corpus.manifest.format == LEVANTER_STORE else CACHE,
                            pinned=True, stats=computed, heatmap=HEATMAP in outputs)
    else:
        stats = corpus_stats(corpus, scan_tokens=scan_tokens)
        outputs = {CARD: render_card(corpus.manifest, stats, meta).encode(),
                   CROISSANT: render_croissant(corpus, stats, meta).encode(), **_figures(stats)}
    in_corpus = out is None
    dest = corpus.root if in_corpus else out
    before = corpus.manifest_sha256
    changed = {rel: _write_if_changed(dest, rel, data) for rel, data in outputs.items()}
    if in_corpus:
        digest = _commit_listed(corpus, list(outputs))
        corpus = load_corpus(corpus.root, manifest_sha256=digest)
    else:
        digest = corpus.manifest_sha256
    text = render_datasheet(corpus.manifest, stats, meta, manifest_sha256=digest, listed=in_corpus,
                            published=read_mirrors(corpus.root), cache=cache)
    changed[DATASHEET] = _write_if_changed(dest, DATASHEET, text.encode())
    return _result(dest, in_corpus, digest, changed, meta.unanswered(corpus.manifest.subsets),
                   previous=before if digest != before else None)


def _result(dest: Path, in_corpus: bool, digest: str | None, changed: dict[str, bool], unanswered, *,
            previous: str | None = None) -> DatasheetResult:
    return DatasheetResult(
        dest=dest, in_corpus=in_corpus, manifest_sha256=digest,
        written=tuple(k for k, v in changed.items() if v), unchanged=tuple(k for k, v in changed.items() if not v),
        unanswered=tuple(unanswered), previous_sha256=previous,
    )


def _source_name(url: str) -> str:
    """A cache's name from where it is: its folder's, or the last part of its URL (no ``@revision``)."""
    if "://" not in url:
        return as_subset_name(Path(url).resolve().name)
    return as_subset_name(PurePosixPath(url.split("://", 1)[1].rstrip("/")).name.split("@")[0])


def source_subsets(source: str | os.PathLike, **store_options) -> list[str]:
    """The subsets whose questions the datasheet of ``source`` asks: a corpus's, a store's cells, or the one
    subset of a single cache (named after its folder)."""
    found = detect(source, **store_options)
    if found.kind != CORPUS:
        return _cells(found, str(source))
    data = read_file(found.store, MANIFEST, limit=METADATA_LIMIT) or b""
    return sorted(Manifest.from_json(data, found.store.describe(MANIFEST)).subsets)


def _cells(found: Source, url: str) -> list[str]:
    return [_source_name(url)] if found.kind == CACHE else list(found.cells)


def _unpinned(found: Source, url: str, meta_path, out: Path | None, strict: bool, scan_tokens: int,
              tokenizer: str | None, store_options: dict) -> DatasheetResult:
    """The datasheet and figures of a cache or store nothing pins, under ``out``."""
    if tokenizer is None:
        raise InvalidTokenizerError("a Levanter cache carries no tokenizer: name the one it was built with",
                                    path=url)
    if out is None or ("://" not in url and Path(out).resolve().is_relative_to(Path(url).resolve())):
        raise UnpinnedCacheError("nothing pins this cache, so its datasheet is not written into it: name a folder "
                                 "outside it for the outputs, or pin it and document it in place", path=url)
    name = _source_name(url)
    names = _cells(found, url)
    meta = load_metadata(meta_path, subsets=names)
    if strict:
        require_complete(meta, names)  # before anything is read or written
    loaded = load_tokenizer(tokenizer)
    sizes = {k or name: v for k, v in cell_bytes(found).items()}
    computed = cache_stats({k or name: c for k, c in open_cells(found, None).items()}, sizes=sizes,
                           tokenizer=loaded, scan_tokens=scan_tokens)
    stats = computed.corpus
    manifest = Manifest(name=name, version="unpinned", tokenizer=loaded.info,
                        subsets={s.name: SubsetInfo(s.docs, s.tokens, s.bytes, s.shards) for s in stats.subsets},
                        format=LEVANTER_CACHE if found.kind == CACHE else LEVANTER_STORE)
    outputs = _figures(stats)
    cache = CacheSource(url=url, kind=found.kind, pinned=False, stats=computed, heatmap=HEATMAP in outputs,
                        store_flags={k: v for k, v in store_options.items() if k in ENDPOINT_FLAGS})
    outputs[DATASHEET] = render_datasheet(manifest, stats, meta, manifest_sha256=None, listed=False,
                                          cache=cache).encode()
    changed = {rel: _write_if_changed(out, rel, data) for rel, data in outputs.items()}
    return _result(out, False, None, changed, meta.unanswered(names))


def write_datasheet(
    source: str | os.PathLike,
    *,
    meta: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    strict: bool = False,
    scan_tokens: int = SCAN_TOKENS,
    tokenizer: str | None = None,
    **store_options,
) -> DatasheetResult:
    """Generate the datasheet, dataset card, Croissant file and figures of the corpus or cache at ``source``.

    Args:
        source: a local corpus directory (its shards must be present: lengths are read from them), a pinned
            Levanter cache or store (local), or one nothing pins: local, ``s3://...`` or
            ``hf://datasets/...`` (with ``store_options`` as `marin_data.stores.open_store` takes them).
        meta: the YAML metadata file with the curated answers; None leaves every question unanswered, except
            for a corpus made by `marin-data sample`, whose answers ship with marin (`SAMPLE_META`).
        out: write the outputs under this directory instead of into the corpus (which is then not touched);
            required for a cache nothing pins, which gets the datasheet and figures only.
        strict: refuse (before writing anything) while any question is unanswered.
        scan_tokens: per-subset budget of tokens decoded for the length statistics (0: everything);
            see `marin_data.docs.stats` (a cache: for duplicates and first documents, its lengths come from
            its offsets; `marin_data.docs.cachestats`).
        tokenizer: a cache nothing pins: the tokenizer it was built with (a ``tokenizer.json`` or a Hub repo id).

    Raises:
        UnknownSourceError: neither a corpus nor a Levanter cache or store.
        InvalidManifestError: a corpus whose description is inconsistent.
        InvalidMetadataError: the metadata file is malformed.
        DatasheetIncompleteError: ``strict`` and some questions are unanswered (``missing`` lists them).
        ShardFormatError: a shard is missing, unreadable, or disagrees with the index.
        CacheFormatError, CacheUnfinishedError, CacheCheckError: a cache's file is unreadable, its writer never
            finished it, or it contradicts itself, its manifest or the tokenizer's vocabulary.
        InvalidTokenizerError: ``tokenizer`` missing for a cache nothing pins, or given for a corpus.
        UnpinnedCacheError: a cache nothing pins without ``out`` (or with ``out`` inside it).
        UnsupportedFormatError: a published corpus (download it first).
        CorpusLockedError: another process is writing the corpus (in-corpus mode only).
    """
    found = detect(source, **store_options)  # fails cleanly on a non-corpus before any lock file is created
    if found.kind != CORPUS:
        return _unpinned(found, str(source), meta, Path(out) if out is not None else None, strict, scan_tokens,
                         tokenizer, store_options)
    if tokenizer is not None:
        raise InvalidTokenizerError("a corpus or pinned cache decodes with its own tokenizer: pass none",
                                    path=str(source))
    if not isinstance(found.store, LocalStore):
        raise UnsupportedFormatError("a published corpus is documented from a local copy: `marin-data download` it "
                                     "first", path=str(source))
    root = Path(source)
    loaded = load_corpus(root)
    if meta is None and (root / SAMPLE_JSON).is_file():
        meta = SAMPLE_META
    if strict:  # refuse before touching anything (the lock file included); checked again under the lock
        require_complete(load_metadata(meta, subsets=loaded.manifest.subsets), loaded.manifest.subsets)
    if out is not None and Path(out).resolve() != loaded.root.resolve():
        return _generate(loaded, Path(out), meta, strict, scan_tokens)
    with corpus_lock(root):  # the manifest is re-committed: no other writer may change the corpus meanwhile
        finish_commit(root)
        return _generate(load_corpus(root), None, meta, strict, scan_tokens)
