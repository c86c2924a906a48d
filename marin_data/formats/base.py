"""What a data format offers the rest of marin: a `Format` (how to recognise it, how to open it) and the
`Source` it opens (what the commands ask of it), plus the `ShardDecoder` the loader reads shards through.

A format answers for one kind of dataset. It is found in one of two ways (`marin_data.formats.registry`):
- a corpus whose ``manifest.json`` names it in ``format``: its files are pinned by the manifest and its
  shard index, and `Format.open_corpus` opens it; `Format.decoder` decodes its shards for the loader;
- a tree with no manifest that `Format.detect` recognises from its own files (a Levanter cache's
  ``shard_ledger.json``): nothing vouches for its bytes, so the loader refuses it until it is pinned.

A `Source` is what a command speaks to once the format is known. Every operation has a default that says
the operation does not apply to this kind of data (`NotApplicableError`, a usage error), so a format
implements only what it supports, and a command never asks which format it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from marin_data.corpus.manifest import Corpus, Manifest
from marin_data.corpus.records import ShardRecord
from marin_data.errors import NotApplicableError
from marin_data.fileio.parquet_io import ArrowBytes
from marin_data.formats.documents import Documents
from marin_data.stores.base import Store

__all__ = ["Format", "Source", "ShardDecoder", "Reader", "Downloaded", "MARIN", "LEVANTER", "TARGETS"]

MARIN = "marin"  # what `Source.convert` writes: a Parquet corpus
LEVANTER = "levanter"  # or a store of Levanter caches
TARGETS = (MARIN, LEVANTER)
Reader = Callable[[ShardRecord], bytes]  # a row's whole bytes, checked against its sha256 and size


class ShardDecoder(Protocol):
    """How the loader reads one corpus's shards: their order in each subset's token stream and their decode
    into the loader's local form (``tokens`` uint32, ``offsets`` int64, written as ``.npy`` files).

    ``pieces``: a shard decodes to pieces of documents cut at its ends (a chunk file of a token stream),
    so its offsets may count one more or one fewer entry than its whole documents."""

    pieces: bool

    def order(self, subsets: Sequence[str]) -> list[tuple[ShardRecord, ...]]:
        """Each subset's shards in the order of its flat tokens."""

    def context(self, shard: ShardRecord) -> str | None:
        """A digest of what a decode depends on besides the shard's own bytes (sealed with it), or None."""

    def decode_into(self, source: Path | ArrowBytes, shard: ShardRecord, tokens_path: Path, offsets_path: Path, *,
                    verify: bool) -> None:
        """Decode the shard file at ``source`` into the two ``.npy`` files, checking its SHA-256 and size first
        when ``verify``; or its bytes in memory, checked as they were fetched (`marin_data.transfer.body`),
        which ``verify`` does not hash again. Raises ShardMissingError, ShardChecksumError, ShardFormatError."""

    def documents(self, stream: Any) -> Documents:
        """Where the documents of ``stream`` lie (`marin_data.formats.documents`: which ones a window of a
        subset's tokens touches, where one with a given id is), for the loader's trace. ``stream`` is the
        loader's ``TokenStream`` over this decoder's corpus, read by duck typing (the loader comes after
        the formats): its ``subsets``, ``subset_tokens``, ``corpus``, ``source`` and ``shard_files()``."""


class Format(Protocol):
    """One registered format. ``name`` is what a manifest's ``format`` says for corpora of it; ``marker`` and
    ``what`` name the file that gives it away and what that file means (``("shard_ledger.json", "a Levanter
    cache")``), for the error that names everything a path could have held."""

    name: str
    marker: str
    what: str

    def detect(self, store: Store) -> Source | None:
        """This format's source if ``store`` holds one without a manifest, else None."""

    def open_corpus(self, store: Store, manifest: Manifest) -> Source:
        """A corpus whose manifest names this format."""

    def decoder(self, corpus: Corpus, read: Reader) -> ShardDecoder:
        """The loader's decoder of ``corpus``'s shards, reading files through ``read``."""


@dataclass(frozen=True)
class Downloaded:
    """What `Source.download` did, as the command prints it: ``lines`` in order, each ``(text, to_stderr)``,
    then ``error`` raised when the download failed (a file not fetched, a damaged copy); ``report`` is the
    format's own report, for callers that want its fields."""

    lines: tuple[tuple[str, bool], ...]
    error: Exception | None
    report: Any


class Source:
    """A dataset opened through its format: what `info`, `show`, `verify`, `download`, `datasheet`,
    `convert`, `adopt` and the loader ask of it. The defaults refuse (`NotApplicableError`).

    ``given`` is the path or URL as the caller named it (what reports and messages show); ``options`` the
    store options it was opened with (a local path ignores them: a command refusing them on a local path
    finds them there)."""

    kind: ClassVar[str] = "corpus"  # what it is, in words: "corpus", "cache" or "store"
    pinned: ClassVar[bool] = True  # a manifest vouches for every byte

    def __init__(self, store: Store, options: dict[str, Any] | None = None) -> None:
        self.store = store
        self.options = dict(options or {})  # the store options it was opened with (`open_store`)
        self.given = store.url

    @property
    def url(self) -> str:
        return self.store.url

    def _refuse(self, what: str) -> NotApplicableError:
        return NotApplicableError(f"{what} does not apply to a {self.describe()}", path=self.url)

    def describe(self) -> str:
        """What this source is, for messages: "marin corpus", "Levanter cache", ..."""
        return self.kind

    def datasheet(self, url: str | None = None) -> Any:
        """Its documentation (`marin_data.formats.datasheet`): ``subsets`` (whose questions it asks),
        ``check_options`` and ``write``; ``url``: the source as it was named (the datasheet quotes it)."""
        raise self._refuse("datasheet")

    def info(self, *, manifest_sha256: str | None = None) -> Any:
        """A summary with ``to_json()`` and ``str()``: subsets, totals, tokenizer (`marin-data info`)."""
        raise self._refuse("info")

    def tokenizer_for(self, given: str | None) -> tuple[str | None, str | None]:
        """The tokenizer a command that decodes this source takes, and a line to say on stderr about it (None:
        nothing to say): ``given`` (``--tokenizer``) as it is here; a source that carries none may offer the
        one its own files name."""
        return given, None

    def show(self, *, subset: str | None, n: int, doc_id: str | None = None, row: int | None = None,
             tokenizer: str | None = None, manifest_sha256: str | None = None) -> list:
        """Documents decoded back to text (`ShownDocument`s; `marin-data show`)."""
        raise self._refuse("show")

    def verify(self, *, subsets: Sequence[str] = (), workers: int | None = None, deep: bool = False,
               tokenizer: str | None = None, expect_bos: int | None = None, manifest_sha256: str | None = None,
               engine: str = "local", engine_address: str | None = None) -> Any:
        """Every byte checked, as far as this source can be (a `VerifyReport`; `marin-data verify`);
        ``engine``, ``engine_address``: where a Parquet corpus's hashing runs (`marin_data.engines`)."""
        raise self._refuse("verify")

    def data_store(self) -> Store:
        """The store holding the data's bytes: the source's own (a pin kept apart from its data names another).
        Whatever reads the data (a remote verify's hashing, a cell's checks) asks this, never ``store``."""
        return self.store

    def verify_remote(self, url: str | None = None, *, options: dict[str, Any] | None = None,
                      subsets: Sequence[str] = (), workers: int | None = None, deep: bool = False,
                      manifest_sha256: str | None = None, engine: str = "local",
                      engine_address: str | None = None) -> Any:
        """What this source lists compared with what a store holds (a `VerifyReport`; `verify --remote`): the
        copy published at ``url`` (opened with ``options``), or where ``url`` is None the stores of the data
        (`data_store`) and of the pin; from the store's own checksums, or with ``deep`` every byte re-hashed,
        jobs on ``engine`` (`marin_data.transfer.remote_verify`)."""
        raise self._refuse("verify --remote")

    def download(self, *, subsets: Sequence[str], dest: str | Path, mirrors: Sequence[str] = (),
                 manifest_sha256: str | None = None, workers: int = 8, part_bytes: int, dry_run: bool = False,
                 ) -> Downloaded:
        """The chosen subsets fetched into ``dest``, checked and resumable (`marin-data download`)."""
        raise self._refuse("download")

    def convert(self, *, to: str, dest: str | Path, subsets: Sequence[str] = (), **settings: Any) -> Any:
        """This source written as ``to`` (`TARGETS`; a `ConvertReport`; `marin-data convert`). ``settings``: those
        of either direction (``tokenizer``, ``name``, ``license``, ``shard_tokens`` to marin; ``dtype``,
        ``codec`` to levanter; ``workers``, ``manifest_sha256``); each direction takes its own."""
        raise self._refuse("convert")

    def adopt(self, *, tokenizer: str, name: str | None = None, license: str = "unknown",
              workers: int | None = None, tokenizer_name: str | None = None, meta: str | Path | None = None,
              pin_to: str | None = None, subsets: Sequence[str] = (), engine: str = "local",
              engine_address: str | None = None, work_dir: str | Path | None = None) -> Any:
        """This source pinned by a manifest (an `AdoptReport`; `marin-data adopt`): in place, or with ``pin_to``
        elsewhere; ``subsets`` (cells to add), ``engine``, ``engine_address``: where its files are hashed;
        ``work_dir``: where a pin for a remote destination is built."""
        raise self._refuse("adopt")
