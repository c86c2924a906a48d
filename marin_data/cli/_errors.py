"""One table from exception type to (one-line message, exit code).

Subclasses come before their parents: the first matching row wins. The traceback is shown only under
``MARIN_DEBUG=1``.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from marin_data import errors as E
from marin_data.fileio.atomic import NO_SPACE

__all__ = ["EXIT_OK", "EXIT_PROBLEMS", "EXIT_USAGE", "EXIT_DENIED", "EXIT_LIMIT", "ERROR_TABLE", "describe"]

EXIT_OK = 0
EXIT_PROBLEMS = 1  # verify found missing/modified/unlisted files; some downloads failed
EXIT_USAGE = 2  # bad flags (click's own code) or an invalid manifest: nothing was checked
EXIT_LIMIT = 23  # a store's answer passed a bound marin sets (a listing too long)


def _with_fix(fix: str) -> Callable[[Exception], str]:
    return lambda e: f"{e}\n  -> {fix}"


ERROR_TABLE: list[tuple[type[BaseException], Callable[[Exception], str], int]] = [
    (E.ManifestHashMismatchError, _with_fix("the manifest is not the one you pinned: use a trusted mirror, "
                                            "or check the --manifest-sha256 value"), EXIT_USAGE),
    (E.UnsafePathError, _with_fix("refusing to follow it; the corpus description was tampered with or "
                                  "corrupted"), EXIT_USAGE),
    (E.UnknownSubsetError, _with_fix("check the name: `marin-data info CORPUS` lists the subsets"), EXIT_USAGE),
    (E.InvalidManifestError, _with_fix("is this the root of a marin corpus? `marin-data info DIR` shows one"),
     EXIT_USAGE),
    (E.UnknownSourceError, _with_fix("point at a marin corpus (manifest.json), a Levanter cache "
                                     "(shard_ledger.json) or a folder of caches"), EXIT_USAGE),
    (E.VerificationFailedError, str, EXIT_PROBLEMS),
    (E.BadRecordError, _with_fix("fix the input, or pass --skip-bad to skip and count such records"), 3),
    (E.UnreadableInputError, _with_fix("check that the file exists, is readable and is not truncated"), 3),
    (E.ModelTokenizerMismatchError, _with_fix("evaluate on a corpus tokenized with the model's tokenizer (the "
                                              "one its training corpus has)"), 4),
    (E.TokenizerMismatchError, _with_fix("shard this subset with the corpus's tokenizer, or into a new "
                                         "corpus"), 4),
    (E.ConvertConflictError, _with_fix("nothing was changed: convert into another destination, or leave that "
                                       "subset out (--subset)"), 4),
    (E.CorpusConflictError, _with_fix("nothing was changed; shard into a new subset name (a child such as "
                                      "NAME/2025 is still selected by --subset NAME) or a new corpus"), 4),
    (E.TokenizerChecksumError, _with_fix("the corpus's tokenizer.json is damaged or was replaced: `marin-data "
                                         "verify` names what else is; download it again, or restore it"),
     EXIT_USAGE),
    (E.UnknownDocumentError, _with_fix("check the id: `marin-data show CORPUS --subset NAME --json` prints "
                                       "documents with their ids"), EXIT_USAGE),
    (E.UnknownModelTokenizerError, _with_fix("pass --tokenizer tokenizer.json (or a Hugging Face repo id), or "
                                             "--data CORPUS to use that corpus's tokenizer"), EXIT_USAGE),
    (E.InvalidTokenizerError, _with_fix("pass a tokenizer.json path or a Hugging Face repo id; name the EOS "
                                        "token with --eos-token if it has none marked special"), EXIT_USAGE),
    (E.CorpusLockedError, _with_fix("another marin-data process is writing this corpus; wait for it to finish "
                                    "(the lock is released when its holder exits, even if it is killed)"), 5),
    (E.ContextLengthError, _with_fix("ask for fewer new tokens (--max-new-tokens): the prompt, cut to its last "
                                     "tokens, and the new tokens share the model's context"), EXIT_USAGE),
    (E.InvalidMetadataError, _with_fix("fix the metadata file (the datasheet's answers); `marin-data datasheet "
                                       "CORPUS --meta-template` prints its shape"), EXIT_USAGE),
    (E.DatasheetIncompleteError, _with_fix("answer them in the --meta file (`marin-data datasheet CORPUS "
                                           "--meta-template` prints every question with its key), or drop "
                                           "--strict to mark them 'Not answered.'"), 11),
    (E.StaleDatasheetError, _with_fix("run `marin-data datasheet CORPUS` (it states the current digest), then "
                                      "publish; nothing was uploaded"), 15),
    (E.InvalidScheduleError, _with_fix("fix the schedule file (its format: docs/training.md, \"Schedules\"; an "
                                       "example: examples/schedules/)"), EXIT_USAGE),
    (E.UnsupportedOrderKeyError, _with_fix("marin reproduces only the keys docs/what-did-the-model-see.md lists; "
                                           "a run that sets this one cannot be traced"), EXIT_USAGE),
    (E.TrainConfigError, _with_fix("fix the run's YAML (the one train_lm read), or point --store at the folder "
                                   "holding its caches"), EXIT_USAGE),
    (E.LoaderConfigError, _with_fix("fix the loader settings (mixture weights, --subset, seq_len)"), EXIT_USAGE),
    (E.LoaderStateMismatchError, _with_fix("resume (or trace) with the data, mixture, seed, seq_len, packing and "
                                           "held-out fraction the checkpoint was written with; to change the "
                                           "mixture from a step on, marin-train takes --mixture-from (the Python "
                                           "API: strict=False)"), 12),
    (E.StoreDigestMismatchError, _with_fix("nothing was pinned: the store's copy is damaged, or was replaced "
                                           "while it was read; have its owner restore it, then adopt again"), 6),
    (E.ShardChecksumError, _with_fix("the file is corrupt: delete it and fetch it again"), 6),
    (E.ShardMissingError, _with_fix("download it (`marin-data download --subset NAME`) or select fewer "
                                    "subsets"), 6),
    (E.ShardFormatError, _with_fix("the file is not a complete marin shard: delete it and re-create or "
                                   "re-fetch it"), 6),
    (E.CacheUnfinishedError, _with_fix("the cache's writer did not finish it: finish or rebuild it with "
                                       "Levanter; nothing was written"), 20),
    (E.CacheFormatError, _with_fix("the file is not what a Levanter cache holds there: re-fetch or rebuild "
                                   "the cache; nothing was written"), 19),
    (E.CacheCheckError, _with_fix("`marin-data verify PATH` lists every finding; rebuild the cache (or pass "
                                  "the tokenizer it was built with); nothing was written"), 21),
    (E.UnpinnedCacheError, _with_fix("pin it in place first: `marin-data adopt PATH --tokenizer TOK` hashes every "
                                     "file and rewrites none (a remote store: `marin-data download` copies it, then adopt)"), 22),
    (E.UnexportableModelError, _with_fix("nothing was written; docs/training.md (\"Export for transformers\") "
                                         "lists what the transformers export maps and what it refuses"), EXIT_USAGE),
    (E.NotApplicableError, _with_fix("`marin-data COMMAND --help` says what each option applies to"), EXIT_USAGE),
    (E.UnsupportedFormatError, _with_fix("nothing was read or written; `marin-data download` it (the subsets you "
                                         "need) and run the command on the local copy"), 22),
    (E.ObjectTooLargeError, _with_fix("re-shard with smaller shards (production shards are 256 MiB-2 GiB); "
                                      "nothing was uploaded"), 10),
    (E.TransferFailedError, _with_fix("finished files are kept: run the same command again to resume (a "
                                      "download also takes --mirror URL)"), EXIT_PROBLEMS),
    (E.NoSuchBucketError, lambda e: f"{e}\n  -> check the bucket's name (and --endpoint-url); to publish to a new "
                                    f"bucket, create it first: aws s3 mb s3://{e.bucket or 'BUCKET'}"
                                    + (f" --endpoint-url {e.endpoint_url}" if e.endpoint_url else ""), 8),
    (E.PublishInProgressError, _with_fix("a publish is writing this copy, or was interrupted: wait for it to "
                                         "finish (or run it again), or read another copy (--mirror URL); "
                                         "nothing was written"), 25),
    (E.RetryableRemoteError, _with_fix("a transient network failure outlasted the retries: run the same "
                                       "command again to resume"), 7),
    (E.RemoteLimitError, _with_fix("the server sent more than marin accepts from it (docs/security.md, \"Memory "
                                   "limits\"): use another mirror, or raise the bound it names if the corpus "
                                   "really is that large"), EXIT_LIMIT),
    (E.RemoteError, _with_fix("check the URL, credentials and endpoint"), 8),
    (E.MissingExtraError, _with_fix("install the optional extra it names (in a checkout: pip install -e "
                                    "'.[NAME]')"), 13),
    (E.EngineError, _with_fix("check the cluster (`ray status` on its head node), then run the same command "
                              "again: finished work is kept"), 14),
    (E.UnsafeDestinationError, _with_fix("nothing was written through it: move it out of the way (or choose "
                                         "another destination), then run the same command again"), 16),
    (E.DestinationExistsError, _with_fix("nothing was written: pass --force to replace it, or choose another "
                                         "path"), EXIT_USAGE),
    (E.InsufficientSpaceError, _with_fix("free space on that file system or choose another destination, then run "
                                         "the same command again to resume"), 17),
    (E.CheckpointDamagedError, str, 24),  # the message names the checkpoint to resume from instead
    (E.InvalidCheckpointError, _with_fix("name a step-NNNNNNNN checkpoint directory, a run directory (its "
                                         "--checkpoint-dir: the latest checkpoint) or an `export`ed model"), 24),
    (E.MarinDataError, str, 9),
]


EXIT_DENIED = 18  # the system refused access to a path: permissions, or a read-only file system
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)
EXIT_NO_SPACE = 17  # as `InsufficientSpaceError`: a full file system, a quota, a file too large for it


def describe(exc: BaseException) -> tuple[str, int] | None:
    """Message and exit code for a known error, or None for an unexpected exception."""
    if type(exc) in (PermissionError, OSError) and exc.errno in _DENIED:  # the system's, by errno, not marin's
        where = exc.filename if exc.filename is not None else "a path"
        return (f"{where}: {exc.strerror}\n  -> check the permissions of that path (or choose another destination), "
                "then run the same command again: finished work is kept"), EXIT_DENIED
    if isinstance(exc, OSError) and not isinstance(exc, E.MarinDataError) and exc.errno in NO_SPACE:
        # any writer's, pyarrow's too: every write is atomic, so what is under a final name is whole
        where = f"{exc.filename}: " if exc.filename is not None else "cannot write: "
        return (f"{where}{exc.strerror or exc}\n  -> free space on that file system (or choose another destination), "
                "then run the same command again to resume: finished work is kept"), EXIT_NO_SPACE
    for etype, fmt, code in ERROR_TABLE:
        if isinstance(exc, etype):
            return fmt(exc), code
    return None
