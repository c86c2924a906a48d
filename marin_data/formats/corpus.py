"""A corpus: a source whose ``manifest.json`` (and through it the shard index) vouches for every file, whatever
its shards are. The format its manifest names subclasses `CorpusSource` for what its shards change.

What every corpus answers alike lives here: ``info`` (its manifest and shard index, local or published),
``verify`` (a local copy re-hashed against its manifest, `verify_folder`) and ``download`` (planned from the
manifest detection read, `marin_data.transfer.download`). `UnreadCorpus` is what a download starts from when
the source could not be told: it may still be served by a mirror.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marin_data.corpus.manifest import Manifest
from marin_data.errors import NotApplicableError, RemoteError
from marin_data.formats.base import Downloaded, Source
from marin_data.layout import RECORD
from marin_data.stores.base import Store
from marin_data.stores.local import LocalStore
from marin_data.ui import format_table, human_bytes, human_count, plural, printable

__all__ = ["CorpusSource", "UnreadCorpus", "download_corpus", "verify_folder"]


class CorpusSource(Source):
    """A corpus at ``store``, with its parsed ``manifest`` (its digest is checked where it is pinned) and, when
    it was read from the root, its verbatim bytes (``manifest_bytes``)."""

    kind = "corpus"
    pinned = True

    def __init__(self, store: Store, manifest: Manifest, options: dict[str, Any] | None = None) -> None:
        super().__init__(store, options)
        self.manifest = manifest
        self.manifest_bytes: bytes | None = None
        self._files: Store | None = None  # `files_store`, once opened

    @property
    def format(self) -> str:
        return self.manifest.format

    @property
    def local(self) -> bool:
        return isinstance(self.store, LocalStore)

    def describe(self) -> str:
        return "marin corpus"

    def info(self, *, manifest_sha256: str | None = None) -> Any:
        if self.local:
            from marin_data.corpus.info import corpus_info

            return corpus_info(self.given)
        from marin_data.transfer.remote_corpus import remote_info

        return remote_info(self.given, manifest_sha256=manifest_sha256, **self.options)

    def verify(self, *, subsets: Sequence[str] = (), workers: int | None = None, deep: bool = False,
               tokenizer: str | None = None, expect_bos: int | None = None, manifest_sha256: str | None = None,
               engine: str = "local", engine_address: str | None = None) -> Any:
        if not self.local:
            raise self.published(tokenizer, expect_bos)
        return verify_folder(self.given, self.options, subsets=subsets, workers=workers, deep=deep,
                             tokenizer=tokenizer, expect_bos=expect_bos, manifest_sha256=manifest_sha256,
                             engine=engine, engine_address=engine_address)

    def data_store(self) -> Store:
        """The store the manifest's ``data`` names (a pin kept apart from its data; `data_url`: not for a local
        download of one, which holds its shards), opened with this source's options; else the source's own."""
        data = self.apart()
        if not data:
            return self.store
        from marin_data.stores import open_store

        return open_store(data, **self.options)

    def apart(self) -> str:
        """Where this pin's shards are when it is kept apart from them (`data_url`), else ""."""
        from marin_data.transfer.apart import data_url

        return data_url(self.manifest, self.given if self.local else None)

    def files_store(self) -> Store:
        """The store this corpus's files are read through (``show``, a datasheet): its own, or for a pin kept
        apart from its data one reading the files its shard index lists from the data's store (`kept_apart`)."""
        data = self.apart()
        if not data:
            return self.store
        if self._files is None:
            from marin_data.transfer.apart import kept_apart
            from marin_data.transfer.plan import plan_download

            plan, _, _ = plan_download([self.store], subsets=None, known_manifest=self.manifest_bytes)
            self._files = kept_apart(self.store, data, (f.path for f in plan.files if f.subset is not None),
                                     self.options)
        return self._files

    def verify_remote(self, url: str | None = None, *, options: dict[str, Any] | None = None,
                      subsets: Sequence[str] = (), workers: int | None = None, deep: bool = False,
                      manifest_sha256: str | None = None, engine: str = "local",
                      engine_address: str | None = None) -> Any:
        from marin_data.stores import open_store
        from marin_data.transfer.remote_verify import REMOTE_WORKERS, check_listing, held_by, local_listing, \
            published_listing

        options = dict(self.options if url is None else options or {})
        if url is None:
            data, pin = self.data_store(), self.store
            if isinstance(data, LocalStore):
                raise NotApplicableError(f"the data of {self.given} is on this machine: `verify {self.given}` "
                                         "re-hashes it (--remote URL compares it with a published copy)")
        else:
            if not self.local:
                raise self.published(None, None)
            pin = open_store(url, max_connections=(workers or REMOTE_WORKERS) + 2, **options)
        pinned = {"subsets": subsets, "manifest_sha256": manifest_sha256}
        listing = local_listing(self.given, **pinned) if self.local else published_listing(self.store, **pinned)
        if url is not None:
            listing, data, pin = held_by(listing, pin, options, workers)
        return check_listing(listing, data=data, pin=pin, options=options, workers=workers, deep=deep,
                             engine=engine, engine_address=engine_address,
                             also=self.remote_checks(data, options, listing.subsets) if deep else ())

    def remote_checks(self, data: Store, options: dict[str, Any], subsets: Sequence[str]) -> list:
        """The jobs a deep remote verify runs beside the hashing (`check_listing`'s ``also``): a format's own
        checks of the chosen subsets in ``data``. A corpus of Parquet shards has none (bytes whose SHA-256 is
        the manifest's are the shards it lists, footers and all)."""
        return []

    def published(self, tokenizer: str | None, expect_bos: int | None) -> NotApplicableError:
        """Why ``verify`` refuses a published corpus (its options first)."""
        if tokenizer or expect_bos is not None:
            return NotApplicableError("--tokenizer and --expect-bos apply to Levanter caches")
        return NotApplicableError(f"{self.given} is a published marin corpus: verify a local copy, compare one "
                                  "with it (verify LOCAL --remote URL), or check it where it is (verify URL "
                                  "--remote [--deep])")

    def download(self, *, subsets: Sequence[str], dest: str | Path, mirrors: Sequence[str] = (),
                 manifest_sha256: str | None = None, workers: int = 8, part_bytes: int, dry_run: bool = False,
                 ) -> Downloaded:
        return download_corpus(self.given, self.options, known_manifest=self.manifest_bytes, subsets=subsets,
                               dest=dest, mirrors=mirrors, manifest_sha256=manifest_sha256, workers=workers,
                               part_bytes=part_bytes, dry_run=dry_run)

    def adopt(self, *, tokenizer: str, name: str | None = None, license: str = "unknown",
              workers: int | None = None, tokenizer_name: str | None = None, meta: str | Path | None = None,
              **where: Any) -> Any:
        from marin_data.levanter.adopt import adopt_corpus  # a pin a killed run committed, finished

        return adopt_corpus(self.given)


class UnreadCorpus(Source):
    """A source that could not be read or told (``error`` says why), downloaded as a corpus: its mirrors may
    serve one. Where none does and the source had no manifest either, ``error`` is the news."""

    def __init__(self, given: str, options: dict[str, Any], error: Exception) -> None:
        self.store, self.options, self.given, self.error = None, dict(options), given, error

    @property
    def url(self) -> str:
        return self.given

    def download(self, *, subsets: Sequence[str], dest: str | Path, mirrors: Sequence[str] = (),
                 manifest_sha256: str | None = None, workers: int = 8, part_bytes: int, dry_run: bool = False,
                 ) -> Downloaded:
        try:
            return download_corpus(self.given, self.options, subsets=subsets, dest=dest, mirrors=mirrors,
                                   manifest_sha256=manifest_sha256, workers=workers, part_bytes=part_bytes,
                                   dry_run=dry_run)
        except RemoteError as e:
            if e.status == 404 and isinstance(self.error, RemoteError):
                raise self.error from e  # no manifest where the listing failed: the listing's failure is the news
            raise


def download_corpus(given: str, options: dict[str, Any], *, subsets: Sequence[str], dest: str | Path,
                    mirrors: Sequence[str], manifest_sha256: str | None, workers: int, part_bytes: int,
                    dry_run: bool, known_manifest: bytes | None = None) -> Downloaded:
    """`marin_data.transfer.download.download` of the corpus ``given``, as ``marin-data download`` prints it."""
    from marin_data.transfer.download import download

    report = download(given, subsets=list(subsets) or None, dest=dest, mirrors=list(mirrors),
                      manifest_sha256=manifest_sha256, workers=workers, part_bytes=part_bytes, dry_run=dry_run,
                      known_manifest=known_manifest, **options)
    lines = [(_dry_run(report) if dry_run else _summary(report), False)]
    lines += [(f"note: {note}", True) for note in report.notes]
    return Downloaded(tuple(lines), None if report.ok else report.error(), report)


def _dry_run(report) -> str:
    plan = report.plan
    rows = [(f.path, human_bytes(f.bytes)) for f in plan.files]
    return "\n".join([
        format_table(["file", "bytes"], rows),
        f"Would fetch {plural(len(plan.files), 'file')}, {human_bytes(plan.bytes)}, {human_count(plan.tokens)} "
        f"tokens ({plural(len(plan.subsets), 'subset')}: {printable(', '.join(plan.subsets))}) into {report.dest}, "
        f"and the datasheet if the source has one; files already there and verified will be skipped.",
        f"manifest sha256: {plan.manifest_sha256}",
    ])


def _summary(report) -> str:
    rate = report.bytes_fetched / report.seconds if report.seconds else 0.0
    return (f"{'Downloaded' if report.ok else 'INCOMPLETE'}: {plural(len(report.fetched), 'file')} fetched "
            f"({human_bytes(report.bytes_fetched)} in {report.seconds:.1f}s, {human_bytes(rate)}/s), "
            f"{len(report.skipped)} already present and verified, {len(report.failed)} failed; "
            f"subsets {printable(', '.join(report.plan.subsets))} in {report.dest} (recorded in {RECORD}).\n"
            f"manifest sha256: {report.plan.manifest_sha256}")


def verify_folder(path: str, options: dict[str, Any], *, subsets: Sequence[str] = (), workers: int | None = None,
                  deep: bool = False, tokenizer: str | None = None, expect_bos: int | None = None,
                  manifest_sha256: str | None = None, engine: str = "local",
                  engine_address: str | None = None) -> Any:
    """``verify`` of the local corpus folder ``path`` (`marin_data.corpus.verify.verify_corpus`), refusing the
    options that do not apply to one; also what a path that is no folder gets (its error names what is
    missing). ``options``: the store options given (a local folder takes none)."""
    from marin_data.corpus.verify import verify_corpus

    if tokenizer or expect_bos is not None:
        raise NotApplicableError("--tokenizer and --expect-bos apply to Levanter caches")
    if options:
        raise NotApplicableError("store options (--endpoint-url, --endpoint, --token, ...) need --remote URL")
    if engine_address is not None and engine != "ray":
        raise NotApplicableError("--ray-address needs --engine ray")
    return verify_corpus(Path(path), subsets=subsets or None, workers=workers, deep=deep,
                         manifest_sha256=manifest_sha256, engine=engine, engine_address=engine_address)
