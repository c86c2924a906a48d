"""Every typed error of marin_data, in one place.

Each error is named by what the caller should do about it (docs/design.md, "Conventions"):

- *abort*: the input as a whole is unusable (invalid manifest, tokenizer mismatch, corpus locked);
- *fail the shard / the record*: one file or one record is bad and the rest may go on
  (`BadRecordError` can be skipped with ``--skip-bad``, a `ShardChecksumError` re-fetched);
- *retry*: a transient remote failure (`RetryableRemoteError`).

Every error also inherits from the matching stdlib type, so ``except ValueError`` keeps working, and carries
``path``, ``expected`` and ``actual`` where they make sense. `marin_data.cli._errors` maps each type to a
one-line message and an exit code.
"""

from __future__ import annotations

from typing import Any

from marin_data.ui import printable

__all__ = [
    "MarinDataError",
    "InvalidManifestError",
    "UnsafePathError",
    "ManifestHashMismatchError",
    "UnknownSubsetError",
    "BadRecordError",
    "UnreadableInputError",
    "TokenizerMismatchError",
    "CorpusLockedError",
    "CorpusConflictError",
    "ConvertConflictError",
    "InvalidTokenizerError",
    "TokenizerChecksumError",
    "UnknownDocumentError",
    "InvalidMetadataError",
    "DatasheetIncompleteError",
    "StaleDatasheetError",
    "LoaderConfigError",
    "LoaderStateMismatchError",
    "ShardFormatError",
    "ShardChecksumError",
    "StoreDigestMismatchError",
    "ShardMissingError",
    "VerificationFailedError",
    "RemoteError",
    "RetryableRemoteError",
    "TooSlowError",
    "NoSuchBucketError",
    "RemoteLimitError",
    "ObjectTooLargeError",
    "TransferFailedError",
    "MissingExtraError",
    "EngineError",
    "UnsafeDestinationError",
    "DestinationExistsError",
    "InsufficientSpaceError",
    "UnknownSourceError",
    "CacheFormatError",
    "CacheUnfinishedError",
    "CacheCheckError",
    "UnsupportedFormatError",
    "NotApplicableError",
    "UnexportableModelError",
    "CheckpointDamagedError",
    "PublishInProgressError",
    "InvalidCheckpointError",
    "ContextLengthError",
    "UnknownModelTokenizerError",
    "ModelTokenizerMismatchError",
    "InvalidScheduleError",
    "UnpinnedCacheError",
    "TrainConfigError",
    "UnsupportedOrderKeyError",
]


class MarinDataError(Exception):
    """Base of every marin_data error.

    Args:
        message: what went wrong, in one sentence.
        path: the file (or URL) concerned, when there is one.
        expected: what the file should have held (a digest, a size, a tokenizer fingerprint...).
        actual: what it held instead.
    """

    def __init__(
        self, message: str, *, path: str | None = None, expected: Any = None, actual: Any = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = None if path is None else str(path)
        self.expected = expected
        self.actual = actual

    def __str__(self) -> str:
        # A path may come from a store or an index: escaped, it cannot end the line or move the cursor.
        return f"{printable(self.path)}: {self.message}" if self.path else self.message

    def __reduce__(self) -> tuple:
        # Errors raised in worker processes (a process pool, Ray tasks) cross a pickle. The keyword fields
        # are not in `args`, so the default reduce would call __init__ without them and fail; rebuild the
        # instance from its attributes instead.
        return _rebuild_error, (type(self), self.args, self.__dict__)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # `class E(ValueError, MarinDataError)` would otherwise take ValueError's __init__ and __str__ (first
        # in the MRO), which refuse keyword arguments. Subclasses that define their own keep theirs.
        super().__init_subclass__(**kwargs)
        for name in ("__init__", "__str__"):
            if name not in cls.__dict__:
                setattr(cls, name, next(getattr(k, name) for k in cls.__mro__ if name in k.__dict__
                                        and issubclass(k, MarinDataError)))


def shown(value: Any, limit: int = 120) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters: a name from a hostile file may be
    400 MB long, and an error must stay one readable line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def _rebuild_error(cls: type, args: tuple, state: dict) -> BaseException:
    """Unpickle a `MarinDataError` without calling its ``__init__`` (see ``MarinDataError.__reduce__``)."""
    err = cls.__new__(cls, *args)
    BaseException.__init__(err, *args)
    err.__dict__.update(state)
    return err


# --- abort: the corpus description itself cannot be trusted --------------------------------------
class InvalidManifestError(ValueError, MarinDataError):
    """manifest.json (or shards.parquet) is malformed or inconsistent: abort."""


class UnknownSubsetError(InvalidManifestError):
    """A subset name or pattern matches no subset of the corpus (a typo, or another corpus): fix the name."""


class UnsafePathError(InvalidManifestError):
    """A manifest names a path that is absolute or escapes the corpus (``..``): never followed."""


class ManifestHashMismatchError(InvalidManifestError):
    """The manifest's own sha256 differs from the one pinned with ``--manifest-sha256``."""


class TokenizerMismatchError(ValueError, MarinDataError):
    """A subset was tokenized with a different tokenizer than the corpus it joins: abort."""


class CorpusLockedError(RuntimeError, MarinDataError):
    """Another process is writing this corpus: retry when it has finished."""


class CorpusConflictError(ValueError, MarinDataError):
    """The run contradicts what the corpus already holds (a subset built from other inputs or settings,
    another corpus name, a non-empty directory that is no corpus): abort, nothing was changed."""


class ConvertConflictError(CorpusConflictError):
    """A convert's destination already holds something of another origin where it would write (a subset or a
    cache made from other data, a corpus where a store of caches goes), or the source cannot take that form
    (a subset nested in another cannot be a cache of a store): abort, nothing was changed."""


class InvalidTokenizerError(ValueError, MarinDataError):
    """The tokenizer cannot be loaded, or has no EOS token to append (name one with ``--eos-token``): abort."""


class TokenizerChecksumError(InvalidTokenizerError):
    """A ``tokenizer.json`` is not the one the manifest names (its sha256 differs): damaged or replaced.
    Abort; fetch it again (or restore it)."""


class UnknownDocumentError(LookupError, MarinDataError):
    """No document of the subset has the id asked for (``show --id``): check the id."""


class UnknownModelTokenizerError(InvalidTokenizerError):
    """A model whose run recorded no tokenizer, and none was given: name one (``--tokenizer``, ``--data``)."""


class ModelTokenizerMismatchError(TokenizerMismatchError):
    """Data tokenized with another tokenizer (or vocabulary) than the model was trained on: its token ids mean
    other things to the model. Abort: evaluate on data tokenized like the model's training corpus."""


class InvalidCheckpointError(ValueError, MarinDataError):
    """A path that is not a checkpoint, a run directory or an exported model, or one that cannot be read (an
    earlier single-file format, a missing or malformed config): abort, nothing was changed."""


class ContextLengthError(ValueError, MarinDataError):
    """What is asked of a model does not fit its context (``max_seq_len`` positions): abort before any work."""


class InvalidMetadataError(ValueError, MarinDataError):
    """The datasheet's metadata file is unreadable or malformed (unknown key, wrong kind of answer): abort."""


class DatasheetIncompleteError(ValueError, MarinDataError):
    """``datasheet --strict``: some questions have no answer; ``missing`` lists their ids. Nothing written."""

    def __init__(self, message: str, *, path: str | None = None, missing: list | tuple = ()) -> None:
        MarinDataError.__init__(self, message, path=path)
        self.missing = list(missing)


class StaleDatasheetError(ValueError, MarinDataError):
    """The datasheet states another manifest sha256 than the corpus's: regenerate it before publishing."""


class LoaderConfigError(ValueError, MarinDataError):
    """Loader settings that cannot work (bad mixture weights, a subset shorter than one sequence): abort."""


class InvalidScheduleError(LoaderConfigError):
    """A run's schedule file (``marin-train --schedule``) is unreadable, malformed, or does not fit the run
    (another global batch, a phase boundary the loader would round elsewhere): abort, nothing was trained."""


class TrainConfigError(ValueError, MarinDataError):
    """A Levanter ``train_lm`` YAML that cannot be read, or one whose order marin cannot answer (a cache missing,
    a value Levanter itself would refuse): abort, nothing is guessed."""


class UnsupportedOrderKeyError(TrainConfigError):
    """The run's YAML sets a key that changes Levanter's order and that marin does not reproduce (``key`` names
    it): refused, never answered differently."""

    def __init__(self, message: str, *, key: str | None = None, path: str | None = None) -> None:
        super().__init__(message, path=path)
        self.key = key


class LoaderStateMismatchError(ValueError, MarinDataError):
    """A loader checkpoint was written for other data, mixture, seed or seq_len: resuming would not continue
    the same stream. Abort, or pass ``strict=False`` to continue from its position anyway."""


# --- fail the record / the input file -------------------------------------------------------------
class BadRecordError(ValueError, MarinDataError):
    """One input record is malformed (bad JSON, missing field, undecodable bytes): skippable.

    ``line`` is the 1-based line (or row) number, ``reason`` a short key used to count skips.
    """

    def __init__(self, message: str, *, path: str, line: int, reason: str) -> None:
        MarinDataError.__init__(self, message, path=path)
        self.line = line
        self.reason = reason

    def __str__(self) -> str:
        return f"{printable(self.path)}:{self.line}: {self.message}"


class UnreadableInputError(OSError, MarinDataError):
    """An input file cannot be opened or decompressed at all."""


# --- fail the shard: its bytes are wrong ----------------------------------------------------------
class ShardFormatError(ValueError, MarinDataError):
    """A shard is not a valid marin shard (half-written, wrong schema or encodings)."""


class ShardChecksumError(ValueError, MarinDataError):
    """A file's sha256 or size differs from the manifest's: re-fetch it or fail it."""


class StoreDigestMismatchError(ShardChecksumError):
    """A store's object streamed with bytes that contradict the digest (or size) the store itself gives for it:
    ``adopt`` pins nothing over it."""


class ShardMissingError(FileNotFoundError, MarinDataError):
    """A shard the manifest lists is not on local disk (a partial download): fetch it, or select less."""


class VerificationFailedError(MarinDataError):
    """``verify`` found problems; ``problems`` lists them (exit code 1, not an invalid manifest)."""

    def __init__(self, message: str, *, problems: list) -> None:
        MarinDataError.__init__(self, message)
        self.problems = problems


# --- remote stores ----------------------------------------------------------------------------------
class RemoteError(OSError, MarinDataError):
    """A remote store refused a request in a way retrying will not fix (403, 404, bad URL).

    ``status`` is the HTTP status when there was a response (None for a connection failure);
    ``retry_after`` the seconds a server asked us to wait (``Retry-After``), read by `marin_data.retry`.
    """

    def __init__(self, message: str, *, path: str | None = None, expected: Any = None, actual: Any = None,
                 status: int | None = None, retry_after: float | None = None) -> None:
        MarinDataError.__init__(self, message, path=path, expected=expected, actual=actual)
        self.status = status
        self.retry_after = retry_after


class RetryableRemoteError(RemoteError):
    """A transient remote failure (dropped connection, 429, 5xx, truncated body): retry, then fail over."""


class TooSlowError(RetryableRemoteError):
    """A request cut for time: below its floor (`marin_data.stores.limits.RequestClock`) or silent past a
    timeout. Retry; a store that keeps doing it is tried after the others (`marin_data.stores.order`)."""


class NoSuchBucketError(RemoteError):
    """The S3 bucket does not exist at that endpoint: check its name, or create it before publishing.

    ``bucket`` is its name; ``endpoint_url`` the S3-compatible endpoint asked (None: AWS).
    """

    bucket: str = ""
    endpoint_url: str | None = None

    def __init__(self, message: str, *, path: str | None = None, bucket: str = "", endpoint_url: str | None = None,
                 status: int | None = 404) -> None:
        RemoteError.__init__(self, message, path=path, status=status)
        self.bucket = bucket
        self.endpoint_url = endpoint_url


class RemoteLimitError(RemoteError):
    """A store's answer is larger than marin accepts (a listing past its bound, a body past what was asked or
    listed): a broken or hostile server. Not retried; a download tries the next mirror."""


class PublishInProgressError(RemoteError):
    """A store's manifest lists a file it does not hold as listed: a publish is under way there, or one was
    interrupted. Wait for it (or run it again), or read another mirror; the copy is not corrupt."""


class ObjectTooLargeError(ValueError, MarinDataError):
    """A file is larger than a store accepts in one request (S3: 5 GiB per PUT): re-shard it smaller."""


class TransferFailedError(MarinDataError):
    """Some files of a download or publish failed after every retry and mirror; the rest are done.

    ``failures`` lists ``(path, reason)`` pairs; running the same command again resumes.
    """

    def __init__(self, message: str, *, path: str | None = None, failures: list | tuple = ()) -> None:
        MarinDataError.__init__(self, message, path=path)
        self.failures = list(failures)


# --- compute engines --------------------------------------------------------------------------------
class MissingExtraError(ImportError, MarinDataError):
    """An optional dependency is not installed: install the extra the message names
    (``pip install 'marin[ray]'``). Abort; nothing was done."""


class EngineError(RuntimeError, MarinDataError):
    """The compute engine failed: a Ray cluster that does not answer, or a task whose worker process or
    node died more times than it is retried. Finished work is kept: fix the cluster, run the command again."""


# --- the destination: where marin writes ----------------------------------------------------------
class UnsafeDestinationError(OSError, MarinDataError):
    """A path where marin would write is a symbolic link below the destination the user chose, or the wrong
    kind of file (a directory where a file goes, a file where a folder goes). Abort: nothing of it was
    written, renamed or removed; move it away and run again."""


class DestinationExistsError(FileExistsError, MarinDataError):
    """A file is already where a new one would be written, and replacing it was not asked for (``--force``).
    Abort before any work; nothing was written."""


class InsufficientSpaceError(OSError, MarinDataError):
    """The destination's file system lacks the free space the files need (or refuses a file that large).
    Abort before writing them; free space or choose another destination, then run again to resume."""


# --- Levanter token caches (`marin_data.levanter`) ------------------------------------------------------
class UnknownSourceError(ValueError, MarinDataError):
    """A path holds neither a marin corpus, nor a Levanter cache, nor a tree of caches: abort, guessing
    nothing."""


class CacheFormatError(ValueError, MarinDataError):
    """A Levanter cache's file cannot be read as what it should be (a ledger, a ``zarr.json``, a chunk file):
    missing, malformed, over its size bound or in a form this reader does not support."""


class CacheUnfinishedError(CacheFormatError):
    """A Levanter cache that its writer never finished: the ledger says so, or a sub-cache has no ``.success``."""


class CacheCheckError(ValueError, MarinDataError):
    """A Levanter cache reads but contradicts itself or its tokenizer (offsets, totals, ``.stats.json``,
    vocabulary, BOS); ``problems`` lists every finding."""

    def __init__(self, message: str, *, path: str | None = None, problems: list | tuple = ()) -> None:
        MarinDataError.__init__(self, message, path=path)
        self.problems = list(problems)


class UnsupportedFormatError(ValueError, MarinDataError):
    """A command that does not read this source where it is (the datasheet of a published corpus, which is
    documented from a local copy): abort before reading or writing anything."""


# --- training checkpoints ---------------------------------------------------------------------------
class CheckpointDamagedError(ValueError, MarinDataError):
    """A training checkpoint is missing, incomplete or not what its seal says (a file's size or sha256, its
    step). Abort the resume: the message names the file and the newest intact checkpoint to resume from."""


class NotApplicableError(ValueError, MarinDataError):
    """An operation or option that does not apply to what a source holds (``--row`` on a Parquet corpus, ``adopt``
    of a corpus that is already pinned): a usage error, raised before anything is read or written."""


class UnexportableModelError(NotApplicableError):
    """A model that uses an option the export's target architecture cannot compute (``marin-train export
    --format transformers`` of a model routed by sigmoid): the message names the option; nothing was written."""


class UnpinnedCacheError(UnsupportedFormatError):
    """A Levanter cache (or a store of them) that was never pinned, where a pin is needed: the loader and
    ``publish`` deal only in files checked against a SHA-256, and the datasheet writes into a corpus only once
    a manifest lists what it writes. Pin it in place (``marin-data adopt``), or document it under another
    folder."""
