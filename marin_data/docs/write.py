"""Where the documentation of ``marin-data datasheet`` goes, whatever the format: the building blocks each
format's datasheet (`marin_data.formats.marin.datasheet`, `marin_data.levanter.datasheet`) composes.

Four outputs: the dataset card ``README.md``, ``croissant.json``, the figures ``datasheets/*.png`` and the
datasheet ``datasheets/datasheet.md``. Where they go, and the one circularity, resolved deliberately:

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
  the datasheet then states the corpus's current manifest digest. A source nothing pins is documented
  under ``out`` only (its format writes it there: `write_outputs`).

Re-running on an unchanged corpus rewrites nothing: outputs are byte-deterministic, a file whose bytes are
already right is not rewritten, and the manifest is re-committed only when the listed files changed — so
the stated digest stays the same. Publishing never changes the manifest: it records the mirror in
``mirrors.json``, which the datasheet lists, so regenerating after a publish changes the datasheet alone.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from marin_data.corpus.commit import commit_corpus, finish_commit
from marin_data.corpus.manifest import Corpus, Manifest, load_corpus
from marin_data.corpus.mirrors import read_mirrors
from marin_data.corpus.names import as_subset_name
from marin_data.corpus.sample import SAMPLE_JSON, SAMPLE_META
from marin_data.docs.datasheet import SheetParts, render_datasheet
from marin_data.docs.figures import composition_png, heatmap_png, lengths_png
from marin_data.docs.questions import Metadata, load_metadata, require_complete
from marin_data.docs.stats import SCAN_TOKENS, CorpusStats
from marin_data.errors import InvalidTokenizerError, NotApplicableError, UnsupportedFormatError
from marin_data.fileio.atomic import atomic_write_bytes, sha256_file
from marin_data.fileio.lock import corpus_lock
from marin_data.layout import DATASHEET, FIGURES, HEATMAP, SHARDS_INDEX, SUMS, TOKENIZER, UNLISTED
from marin_data.stores.base import Store
from marin_data.stores.local import LocalStore

__all__ = ["DatasheetResult", "Assembled", "CorpusDatasheet", "figures", "write_outputs", "result", "source_name"]


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


@dataclass(frozen=True)
class Assembled:
    """What a format computed of a corpus: its statistics, the files beside the datasheet (card, Croissant
    file, figures: relative path -> bytes) and what its datasheet says in its own words."""

    stats: CorpusStats
    outputs: dict[str, bytes]
    parts: SheetParts


Assemble = Callable[[Corpus, Metadata, int], Assembled]  # (corpus, answers, scan_tokens) -> what it computed


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


def write_outputs(dest: Path, outputs: dict[str, bytes]) -> dict[str, bool]:
    """Write each file under ``dest`` whose bytes changed; relative path -> whether it was written."""
    return {rel: _write_if_changed(dest, rel, data) for rel, data in outputs.items()}


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


def figures(stats: CorpusStats) -> dict[str, bytes]:
    """The composition and lengths figures, and the cluster x quality heat map where the subsets form one."""
    heatmap = heatmap_png(stats)
    return {FIGURES[0]: composition_png(stats), FIGURES[1]: lengths_png(stats),
            **({HEATMAP: heatmap} if heatmap is not None else {})}


def result(dest: Path, in_corpus: bool, digest: str | None, changed: dict[str, bool], unanswered, *,
           previous: str | None = None) -> DatasheetResult:
    return DatasheetResult(
        dest=dest, in_corpus=in_corpus, manifest_sha256=digest,
        written=tuple(k for k, v in changed.items() if v), unchanged=tuple(k for k, v in changed.items() if not v),
        unanswered=tuple(unanswered), previous_sha256=previous,
    )


def source_name(url: str) -> str:
    """A source's name from where it is: its folder's, or the last part of its URL (no ``@revision``)."""
    if "://" not in url:
        return as_subset_name(Path(url).resolve().name)
    return as_subset_name(PurePosixPath(url.split("://", 1)[1].rstrip("/")).name.split("@")[0])


def _generate(corpus: Corpus, out: Path | None, meta_path, strict: bool, scan_tokens: int,
              assemble: Assemble) -> DatasheetResult:
    meta = load_metadata(meta_path, subsets=corpus.manifest.subsets)
    if strict:
        require_complete(meta, corpus.manifest.subsets)  # before anything is written
    made = assemble(corpus, meta, scan_tokens)
    in_corpus = out is None
    dest = corpus.root if in_corpus else out
    before = corpus.manifest_sha256
    changed = write_outputs(dest, made.outputs)
    if in_corpus:
        digest = _commit_listed(corpus, list(made.outputs))
        corpus = load_corpus(corpus.root, manifest_sha256=digest)
    else:
        digest = corpus.manifest_sha256
    text = render_datasheet(corpus.manifest, made.stats, meta, manifest_sha256=digest, listed=in_corpus,
                            published=read_mirrors(corpus.root), parts=made.parts)
    changed[DATASHEET] = _write_if_changed(dest, DATASHEET, text.encode())
    return result(dest, in_corpus, digest, changed, meta.unanswered(corpus.manifest.subsets),
                  previous=before if digest != before else None)


class CorpusDatasheet:
    """The datasheet of a corpus (a manifest vouches for its files), whatever its shards: ``assemble``
    computes what its format says. Written into the corpus (the manifest then lists the card, Croissant
    file and figures) or under ``out``."""

    def __init__(self, store: Store, manifest: Manifest, assemble: Assemble, url: str | None = None) -> None:
        self.store, self.manifest, self.assemble = store, manifest, assemble
        self.url = url or store.url  # as it was named (errors say it)

    @property
    def subsets(self) -> list[str]:
        """The subsets whose questions the datasheet asks."""
        return sorted(self.manifest.subsets)

    def check_options(self, *, tokenizer: str | None, out: Path | None) -> None:
        """Raise NotApplicableError: an option the command line takes that a corpus does not."""
        if tokenizer:
            raise NotApplicableError("a corpus, or a pinned Levanter cache, decodes with its own tokenizer: drop "
                                     "--tokenizer")
        if not isinstance(self.store, LocalStore):
            raise NotApplicableError("a published corpus is documented from a local copy: `marin-data download` "
                                     "it, then run the datasheet on the copy")

    def write(self, *, meta: str | os.PathLike | None = None, out: str | os.PathLike | None = None, strict: bool = False, scan_tokens: int = SCAN_TOKENS,
              tokenizer: str | None = None) -> DatasheetResult:
        """Generate the card, Croissant file, figures and datasheet (`marin_data.formats.datasheet`)."""
        where = self.url
        if tokenizer is not None:
            raise InvalidTokenizerError("a corpus or pinned cache decodes with its own tokenizer: pass none",
                                        path=where)
        if not isinstance(self.store, LocalStore):
            raise UnsupportedFormatError("a published corpus is documented from a local copy: `marin-data "
                                         "download` it first", path=where)
        root = self.store.root
        loaded = load_corpus(root)
        if meta is None and (root / SAMPLE_JSON).is_file():
            meta = SAMPLE_META
        if strict:  # refuse before touching anything (the lock file included); checked again under the lock
            require_complete(load_metadata(meta, subsets=loaded.manifest.subsets), loaded.manifest.subsets)
        if out is not None and Path(out).resolve() != loaded.root.resolve():
            return _generate(loaded, Path(out), meta, strict, scan_tokens, self.assemble)
        with corpus_lock(root):  # the manifest is re-committed: no other writer may change the corpus meanwhile
            finish_commit(root)
            return _generate(load_corpus(root), None, meta, strict, scan_tokens, self.assemble)
