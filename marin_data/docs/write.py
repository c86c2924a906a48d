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

Re-running on an unchanged corpus rewrites nothing: outputs are byte-deterministic, a file whose bytes are
already right is not rewritten, and the manifest is re-committed only when the listed files changed — so
the stated digest stays the same. Publishing never changes the manifest: it records the mirror in
``mirrors.json``, which the datasheet lists, so regenerating after a publish changes the datasheet alone.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from marin_data.atomic import atomic_write_bytes, sha256_file
from marin_data.corpus.commit import commit_corpus, finish_commit
from marin_data.corpus.manifest import MARIN, Corpus, load_corpus
from marin_data.corpus.mirrors import read_mirrors
from marin_data.corpus.sample import SAMPLE_JSON, SAMPLE_META
from marin_data.docs.card import render_card
from marin_data.docs.croissant import render_croissant
from marin_data.docs.datasheet import render_datasheet
from marin_data.docs.figures import composition_png, lengths_png
from marin_data.docs.questions import load_metadata, require_complete
from marin_data.docs.stats import SCAN_TOKENS, corpus_stats
from marin_data.errors import UnsupportedFormatError
from marin_data.layout import CARD, CROISSANT, DATASHEET, FIGURES, LISTED, SHARDS_INDEX, SUMS, TOKENIZER, UNLISTED
from marin_data.lock import corpus_lock

__all__ = ["DatasheetResult", "write_datasheet"]



@dataclass(frozen=True)
class DatasheetResult:
    dest: Path  # the corpus root, or the --out directory
    in_corpus: bool
    manifest_sha256: str  # the digest the datasheet states: the manifest as it is now on disk
    written: tuple[str, ...]  # files whose bytes changed (relative to dest)
    unchanged: tuple[str, ...]  # files that already held exactly these bytes
    unanswered: tuple[str, ...]  # question ids marked "Not answered."

    @property
    def datasheet(self) -> Path:
        return self.dest / DATASHEET


def _write_if_changed(dest: Path, rel: str, data: bytes) -> bool:
    """Write ``data`` to ``dest/rel`` atomically unless a regular file there already holds exactly it (keeps
    mtimes of a re-run); a link below ``dest`` is refused, never followed (`marin_data.atomic.SafeDir`)."""
    path = dest / rel
    try:
        if stat.S_ISREG(path.lstat().st_mode) and path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
    except (FileNotFoundError, NotADirectoryError):
        pass
    atomic_write_bytes(path, data, root=dest)
    return True


def _commit_listed(corpus: Corpus) -> str:
    """List the generated files in the manifest (if not already, with these digests); return its sha256."""
    files = corpus.manifest.files
    current = all(
        rel in files and (files[rel].sha256, files[rel].bytes) == sha256_file(corpus.root / rel) for rel in LISTED
    ) and not any(rel in files for rel in UNLISTED)
    if current:
        return corpus.manifest_sha256
    keep = [rel for rel in files if rel not in {TOKENIZER, SHARDS_INDEX, SUMS, *LISTED, *UNLISTED}]
    return commit_corpus(corpus.root, corpus.manifest, corpus.shards, extra_files=sorted({*keep, *LISTED}))


def _generate(corpus: Corpus, out: Path | None, meta_path, strict: bool, scan_tokens: int) -> DatasheetResult:
    meta = load_metadata(meta_path, subsets=corpus.manifest.subsets)
    if strict:
        require_complete(meta, corpus.manifest.subsets)  # before anything is written
    stats = corpus_stats(corpus, scan_tokens=scan_tokens)
    outputs = {
        CARD: render_card(corpus.manifest, stats, meta).encode(),
        CROISSANT: render_croissant(corpus, stats, meta).encode(),
        FIGURES[0]: composition_png(stats),
        FIGURES[1]: lengths_png(stats),
    }
    in_corpus = out is None
    dest = corpus.root if in_corpus else out
    changed = {rel: _write_if_changed(dest, rel, data) for rel, data in outputs.items()}
    if in_corpus:
        digest = _commit_listed(corpus)
        corpus = load_corpus(corpus.root, manifest_sha256=digest)
    else:
        digest = corpus.manifest_sha256
    text = render_datasheet(corpus.manifest, stats, meta, manifest_sha256=digest, listed=in_corpus,
                            published=read_mirrors(corpus.root))
    changed[DATASHEET] = _write_if_changed(dest, DATASHEET, text.encode())
    return DatasheetResult(
        dest=dest, in_corpus=in_corpus, manifest_sha256=digest,
        written=tuple(k for k, v in changed.items() if v), unchanged=tuple(k for k, v in changed.items() if not v),
        unanswered=tuple(meta.unanswered(corpus.manifest.subsets)),
    )


def write_datasheet(
    corpus: str | os.PathLike,
    *,
    meta: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    strict: bool = False,
    scan_tokens: int = SCAN_TOKENS,
) -> DatasheetResult:
    """Generate the datasheet, dataset card, Croissant file and figures of the corpus at ``corpus``.

    Args:
        corpus: a local corpus directory (its shards must be present: lengths are read from them).
        meta: the YAML metadata file with the curated answers; None leaves every question unanswered, except
            for a corpus made by `marin-data sample`, whose answers ship with marin (`SAMPLE_META`).
        out: write the outputs under this directory instead of into the corpus (which is then not touched).
        strict: refuse (before writing anything) while any question is unanswered.
        scan_tokens: per-subset budget of tokens decoded for the length statistics (0: everything);
            see `marin_data.docs.stats`.

    Raises:
        InvalidManifestError: not a corpus, or one whose description is inconsistent.
        InvalidMetadataError: the metadata file is malformed.
        DatasheetIncompleteError: ``strict`` and some questions are unanswered (``missing`` lists them).
        ShardFormatError: a shard is missing, unreadable, or disagrees with the index.
        CorpusLockedError: another process is writing the corpus (in-corpus mode only).
    """
    root = Path(corpus)
    loaded = load_corpus(root)  # fails cleanly on a non-corpus before any lock file is created
    if loaded.manifest.format != MARIN:  # its rows are Zarr chunk files: nothing here reads them yet
        raise UnsupportedFormatError(f"the datasheet of a pinned Levanter cache ({loaded.manifest.format}) is not "
                                     "supported yet", path=str(root), actual=loaded.manifest.format)
    if meta is None and (root / SAMPLE_JSON).is_file():
        meta = SAMPLE_META
    if strict:  # refuse before touching anything (the lock file included); checked again under the lock
        require_complete(load_metadata(meta, subsets=loaded.manifest.subsets), loaded.manifest.subsets)
    if out is not None and Path(out).resolve() != loaded.root.resolve():
        return _generate(loaded, Path(out), meta, strict, scan_tokens)
    with corpus_lock(root):  # the manifest is re-committed: no other writer may change the corpus meanwhile
        finish_commit(root)
        return _generate(load_corpus(root), None, meta, strict, scan_tokens)
