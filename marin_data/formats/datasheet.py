"""``marin-data datasheet`` as a library call: open the source through its format (`open_source`) and write
its documentation the way its format does (`Source.datasheet`; where the files go: `marin_data.docs.write`)."""

from __future__ import annotations

import os

from marin_data.docs.stats import SCAN_TOKENS
from marin_data.docs.write import DatasheetResult
from marin_data.formats.registry import open_source

__all__ = ["write_datasheet"]


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
            its offsets; `marin_data.levanter.cachestats`).
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
    sheet = open_source(source, **store_options).datasheet(str(source))  # before any lock file is created
    return sheet.write(meta=meta, out=out, strict=strict, scan_tokens=scan_tokens, tokenizer=tokenizer)
