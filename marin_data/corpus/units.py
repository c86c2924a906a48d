"""The tokenize step of a build: one unit per input file, read, encoded and framed into staging.

`tokenize_unit` runs one `UnitJob` (a top-level function over a picklable job, so any engine runs it) and
leaves ``<key>.parquet`` (the documents), ``<key>.lengths.npy`` (their token counts, which the pack step cuts
shards from) and, last, the ``<key>.json`` done marker. `unit_jobs` makes a subset's jobs and takes the
results of those an earlier run finished, where this run would make them the same (docs/data.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from marin_data.fileio.atomic import atomic_path, atomic_write_bytes
from marin_data.fileio.arrays import numbers, strings
from marin_data.corpus.markers import canonical, read_marker
from marin_data.corpus.shard import TOKENS_VALUES, shard_schema
from marin_data.corpus.sources import InputFile
from marin_data.raw.documents import DEFAULT_MAX_DOC_BYTES, read_documents
from marin_data.raw.records import TOO_LONG, Document
from marin_data.raw.tokenizer import LoadedTokenizer, TokenizerInfo, tokenizer_from_bytes

__all__ = ["EMPTY", "UnitJob", "UnitResult", "unit_paths", "tokenize_unit", "unit_jobs"]

EMPTY = "empty"  # the skip reason of documents that encode to no tokens (always skipped)
# Documents per encode_batch call (and staging row group), or fewer when they are long. Small enough that a
# batch's encodings and arrays reuse freed memory: batches of 1,024 documents of ~4 KB took ~20,000 page
# faults and ~2% more time per 1M tokens than batches of 256 (*measured*, 2-vCPU Xeon); smaller row groups
# also let `pack_shard` decode fewer documents it does not need.
_BATCH_DOCS = 256
_BATCH_CHARS = 1 << 20


@dataclass(frozen=True)
class UnitJob:
    """Tokenize one input file into ``<staging>/<key>.parquet`` (+ ``.lengths.npy``, then ``.json``)."""

    input: InputFile
    key: str
    staging: str
    tokenizer_path: str
    tokenizer: TokenizerInfo
    text_field: str
    id_field: str
    skip_bad: bool
    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES


@dataclass(frozen=True)
class UnitResult:
    key: str
    docs: int
    tokens: int
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> records skipped (empty documents too)
    examples: dict[str, str] = field(default_factory=dict)  # reason -> the first such record, "path:line: why"
    max_doc_bytes: int | None = None  # the limit the unit was read under (None: a marker from before it was kept)


@functools.lru_cache(maxsize=2)
def _worker_tokenizer(path: str, info: TokenizerInfo) -> LoadedTokenizer:
    return tokenizer_from_bytes(Path(path).read_bytes(), info, where=path)


def unit_paths(job: UnitJob) -> tuple[Path, Path, Path]:
    base = Path(job.staging) / job.key
    return base.with_suffix(".parquet"), base.with_suffix(".lengths.npy"), base.with_suffix(".json")


def tokenize_unit(job: UnitJob) -> UnitResult:
    """Read, encode and frame one input file's documents into staging; return its counts.

    Writes ``<key>.parquet`` (the documents, in file order), ``<key>.lengths.npy`` (their token counts, for
    planning the shards without re-reading the tokens) and, last, the ``<key>.json`` done marker.

    Raises:
        BadRecordError: a malformed record, unless ``job.skip_bad``.
        UnreadableInputError: the file cannot be read to its end.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    tokenizer = _worker_tokenizer(job.tokenizer_path, job.tokenizer)
    parquet, lengths_path, marker = unit_paths(job)
    skipped: Counter[str] = Counter()
    examples: dict[str, str] = {}

    def skip(reason: str, example: str) -> None:
        skipped[reason] += 1
        examples.setdefault(reason, example)

    docs = read_documents(job.input.path, source=job.input.name, text_field=job.text_field,
                          id_field=job.id_field, on_bad=(lambda e: skip(e.reason, str(e))) if job.skip_bad else None,
                          max_doc_bytes=job.max_doc_bytes)
    all_lengths = []
    schema = shard_schema(job.tokenizer)
    with atomic_path(parquet) as tmp:
        with pq.ParquetWriter(tmp, schema, compression="zstd", use_dictionary=["id"],
                              use_byte_stream_split=[TOKENS_VALUES]) as writer:
            for batch in _batches(docs):
                tokens, lengths = tokenizer.encode_documents([d.text for d in batch])
                for d in (d for d, n in zip(batch, lengths) if n == 0):
                    skip(EMPTY, f"{d.path}:{d.line}: empty document")
                keep = lengths > 0
                if not keep.any():
                    continue
                offsets = np.concatenate([[0], np.cumsum(lengths[keep])])
                column = pa.LargeListArray.from_arrays(numbers(offsets, np.int64), numbers(tokens, np.uint32))
                ids = strings([d.id for d, k in zip(batch, keep) if k])
                writer.write_table(pa.table({"id": ids, "tokens": column}, schema=schema))
                all_lengths.append(lengths[keep])
    lengths = np.concatenate(all_lengths) if all_lengths else np.zeros(0, np.int64)
    with atomic_path(lengths_path) as tmp, open(tmp, "wb") as f:
        np.save(f, lengths)
    result = UnitResult(key=job.key, docs=len(lengths), tokens=int(lengths.sum()),
                        skipped=dict(sorted(skipped.items())), examples=dict(sorted(examples.items())),
                        max_doc_bytes=job.max_doc_bytes)
    atomic_write_bytes(marker, canonical(asdict(result)))
    return result


def _batches(docs: Iterable[Document]) -> Iterator[list[Document]]:
    batch: list[Document] = []
    chars = 0
    for doc in docs:
        batch.append(doc)
        chars += len(doc.text)
        if len(batch) >= _BATCH_DOCS or chars >= _BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _unit_key(f: InputFile, info: TokenizerInfo, text_field: str, id_field: str) -> str:
    # Everything that shapes a unit's output — but not skip_bad: a unit that had nothing to skip is the
    # same with or without it, which lets a failed run be retried with --skip-bad reusing the good units.
    doc = [f.sha256, f.name, asdict(info), text_field, id_field]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def unit_jobs(files: Sequence[InputFile], staging: Path, tokenizer_path: Path, info: TokenizerInfo, *,
               text_field: str, id_field: str, skip_bad: bool,
               max_doc_bytes: int) -> tuple[list[UnitJob], dict[int, UnitResult]]:
    """Every input's unit (in input order), and the results of those an earlier run finished, by position."""
    staging.mkdir(parents=True, exist_ok=True)
    jobs = [UnitJob(input=f, key=_unit_key(f, info, text_field, id_field), staging=str(staging),
                    tokenizer_path=str(tokenizer_path), tokenizer=info, text_field=text_field, id_field=id_field,
                    skip_bad=skip_bad, max_doc_bytes=max_doc_bytes) for f in files]
    reused: dict[int, UnitResult] = {}
    for i, job in enumerate(jobs):
        done = read_marker(unit_paths(job)[2])
        if done is not None and _reusable(UnitResult(**done), skip_bad=skip_bad, max_doc_bytes=max_doc_bytes):
            reused[i] = UnitResult(**done)
    return jobs, reused


def _reusable(done: UnitResult, *, skip_bad: bool, max_doc_bytes: int) -> bool:
    """Whether a unit an earlier run finished is what this run would make.

    One that skipped bad records only when skipping is asked for again. Under another ``max_doc_bytes``, only
    one that skipped nothing as too long, read under a lower limit: a higher one accepts the same records,
    while a lower one may refuse a record it accepted, and one that skipped too-long records would now keep
    some of them.
    """
    if set(done.skipped) - {EMPTY} and not skip_bad:
        return False
    if done.max_doc_bytes is None:
        return False
    return done.max_doc_bytes == max_doc_bytes or (done.max_doc_bytes < max_doc_bytes and TOO_LONG not in done.skipped)
