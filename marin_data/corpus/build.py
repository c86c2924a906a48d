"""``marin-data shard``: tokenize raw documents into one subset of a corpus — parallel, deterministic,
restartable.

`shard_subset` plans the run (inputs hashed, tokenizer checked against the corpus, under the corpus lock),
tokenizes one unit per input file (`tokenize_unit`), packs the documents into shards of at most
``shard_tokens`` tokens (`pack_shard`, each shard as soon as the units it reads are done), and commits the
subset: shards renamed into ``data/<subset>/``, its inputs recorded in ``sources/<subset>.json``, the manifest
written last. Both middle steps run on an engine (`marin_data.engines`) and leave done markers under
``.staging/``, so a re-run redoes only unfinished work and any worker count writes the same bytes. A subset
already built from other inputs is refused (`CorpusConflictError`): add a child subset instead. How each step
works, and why: docs/data.md.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import urllib.parse
from collections import Counter
from collections.abc import Container, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from marin_data.arrays import numbers, strings, view
from marin_data.atomic import SafeDir, atomic_path, atomic_write_bytes, sha256_file
from marin_data.corpus.commit import commit_corpus, finish_commit
from marin_data.corpus.manifest import Corpus, Manifest, load_corpus
from marin_data.corpus.names import check_subset_name
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.corpus.shard import TOKENS_VALUES, ShardStats, shard_path, shard_schema, write_shard
from marin_data.engines import Engine, make_engine
from marin_data.errors import CorpusConflictError, ShardFormatError, TokenizerMismatchError, UnreadableInputError
from marin_data.layout import DATA, LOCK_NAME, MANIFEST, SHARDS_INDEX, SOURCES, STAGING, SUMS, TOKENIZER
from marin_data.lock import corpus_lock
from marin_data.parquet_io import open_parquet
from marin_data.raw.documents import (DEFAULT_MAX_DOC_BYTES, TOO_LONG, Document, expand_inputs, read_documents,
                                      source_names)
from marin_data.raw.tokenizer import LoadedTokenizer, TokenizerInfo, load_tokenizer, tokenizer_from_bytes
from marin_data.ui import progress
from marin_data.untrusted_json import loads

__all__ = [
    "DEFAULT_SHARD_TOKENS",
    "EMPTY",
    "InputFile",
    "UnitJob",
    "UnitResult",
    "PackJob",
    "ShardReport",
    "sources_path",
    "tokenize_unit",
    "pack_shard",
    "run_job",
    "shard_subset",
]

# 2**28 tokens: ~350 MB at the measured 0.33 x 4 bytes per token, inside docs/design.md's 256 MiB-2 GiB; a
# packing worker holds one shard's tokens in memory (~1 GiB of uint32).
DEFAULT_SHARD_TOKENS = 1 << 28
EMPTY = "empty"  # the skip reason of documents that encode to no tokens (always skipped)
# Documents per encode_batch call (and staging row group), or fewer when they are long. Small enough that a
# batch's encodings and arrays reuse freed memory: batches of 1,024 documents of ~4 KB took ~20,000 page
# faults and ~2% more time per 1M tokens than batches of 256 (*measured*, 2-vCPU Xeon); smaller row groups
# also let `pack_shard` decode fewer documents it does not need.
_BATCH_DOCS = 256
_BATCH_CHARS = 1 << 20
_PART = re.compile(r"part-\d{5}\.parquet")


@dataclass(frozen=True)
class InputFile:
    path: str  # absolute path to read
    name: str  # path relative to the inputs' common directory: default ids, the subset's record
    bytes: int
    sha256: str


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


@dataclass(frozen=True)
class PackJob:
    """Write staging shard ``out`` from documents ``[first, end)`` of each listed unit file, in order."""

    out: str
    pieces: tuple[tuple[str, int, int], ...]
    tokenizer: TokenizerInfo


@dataclass(frozen=True)
class ShardReport:
    """What a run did; the CLI prints it as the summary table."""

    corpus: str
    subset: str
    docs: int
    tokens: int
    shards: int
    bytes: int
    skipped: dict[str, int]
    examples: dict[str, str]
    units: int  # input files
    units_reused: int  # of which finished by an earlier, interrupted run
    manifest_sha256: str
    unchanged: bool  # the subset already held exactly these inputs: nothing was done


def sources_path(subset: str) -> str:
    """The corpus-relative path of a subset's record of its inputs and settings."""
    return f"{SOURCES}/{subset}.json"


# --- the work units: top-level functions over picklable jobs (run by any engine) --------------------------


@functools.lru_cache(maxsize=2)
def _worker_tokenizer(path: str, info: TokenizerInfo) -> LoadedTokenizer:
    return tokenizer_from_bytes(Path(path).read_bytes(), info, where=path)


def _unit_paths(job: UnitJob) -> tuple[Path, Path, Path]:
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
    parquet, lengths_path, marker = _unit_paths(job)
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
    atomic_write_bytes(marker, _canonical(asdict(result)))
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


def run_job(job: UnitJob | PackJob) -> UnitResult | ShardStats:
    """`tokenize_unit` or `pack_shard`, as ``job`` asks: one function for the engine, so packs can join the units."""
    return tokenize_unit(job) if isinstance(job, UnitJob) else pack_shard(job)


def pack_shard(job: PackJob) -> ShardStats:
    """Write one shard from slices of unit staging files, then its ``.json`` done marker."""
    ids: list[str] = []
    tokens: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    for path, first, end in job.pieces:
        piece_ids, piece_tokens, piece_offsets = _read_docs(path, first, end)
        ids += piece_ids
        tokens.append(piece_tokens)
        lengths.append(np.diff(piece_offsets))
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int64)
    stats = write_shard(job.out, ids, np.concatenate(tokens), offsets, job.tokenizer)
    atomic_write_bytes(Path(job.out).with_suffix(".json"), _canonical(asdict(stats)))
    return stats


def _read_docs(path: str, first: int, end: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Documents ``[first, end)`` of a staging file, reading only the row groups that hold them."""
    pf = open_parquet(path)
    starts = np.concatenate([[0], np.cumsum([pf.metadata.row_group(i).num_rows
                                             for i in range(pf.metadata.num_row_groups)])])
    groups = list(range(int(np.searchsorted(starts, first, "right")) - 1, int(np.searchsorted(starts, end, "left"))))
    table = pf.read_row_groups(groups).slice(first - int(starts[groups[0]]), end - first)
    column = table.column("tokens").combine_chunks()
    offsets = view(column.offsets, np.int64)
    values = view(column.values, np.uint32)[offsets[0] : offsets[-1]]
    return table.column("id").to_pylist(), values, offsets - offsets[0]


def _canonical(doc: object) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


# --- the run ----------------------------------------------------------------------------------------------


def shard_subset(
    inputs: Sequence[str | os.PathLike],
    *,
    subset: str,
    tokenizer: str | LoadedTokenizer,
    out: str | os.PathLike,
    workers: int | None = None,
    engine: str | Engine = "local",
    engine_address: str | None = None,
    text_field: str = "text",
    id_field: str = "id",
    add_bos: bool = False,
    eos_token: str | None = None,
    bos_token: str | None = None,
    tokenizer_name: str | None = None,
    skip_bad: bool = False,
    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES,
    license: str = "unknown",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    name: str | None = None,
    version: str | None = None,
    extra_files: Sequence[str] = (),
) -> ShardReport:
    """Tokenize ``inputs`` into subset ``subset`` of the corpus at ``out`` (created if needed).

    Args:
        inputs: files, directories and globs (.jsonl/.ndjson/.json, optionally .gz/.zst/.zstd; .parquet).
        subset: the subset's name, a path such as ``pretrain/dclm``.
        tokenizer: a tokenizer.json path, a Hugging Face repo id, or an already loaded tokenizer.
        out: the corpus directory.
        workers: worker processes (None: one per usable CPU).
        engine: the name of a registered engine (`marin_data.engines.ENGINES`), or a running engine to share
            between runs (the caller closes it; ``workers`` is then ignored).
        engine_address: for ``engine="ray"``, the Ray cluster (``auto``, ``HOST:PORT``); None starts a local
            Ray instance. The cluster's nodes must see ``inputs`` and ``out`` at the same paths.
        text_field, id_field: the record fields (Parquet columns) holding text and id.
        add_bos, eos_token, bos_token: framing, see `marin_data.raw.tokenizer.load_tokenizer`.
        tokenizer_name: the tokenizer's name in a new corpus's manifest (default: derived from ``tokenizer``);
            a corpus keeps the name it was created with.
        skip_bad: skip malformed records and count them by reason instead of stopping.
        max_doc_bytes: the longest document (its JSON line, or Parquet text) in bytes; a longer one is a bad
            record. It bounds a worker's memory: tokenizing takes many times a document's size.
        license: the subset's SPDX license id, recorded in the manifest.
        shard_tokens: the most tokens a shard holds (a longer document gets a shard of its own).
        name, version: the corpus's name and version when it is created (default: the directory's name
            and ``0.1.0``); for an existing corpus they must match if given.
        extra_files: further corpus-relative files to list in the manifest and ``SHA256SUMS``.

    Raises:
        BadRecordError, UnreadableInputError: bad input (see `marin_data.raw.documents`).
        TokenizerMismatchError: the corpus was tokenized with another tokenizer or framing.
        CorpusConflictError: the subset exists with other inputs or settings, a name/version differs, or
            ``out`` is a non-empty directory that is not a corpus.
        CorpusLockedError: another process is writing this corpus.
        MissingExtraError, EngineError: ``engine="ray"`` without Ray installed, or a Ray cluster that fails.
    """
    check_subset_name(subset, "--subset")
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be positive, not {shard_tokens}")
    paths = expand_inputs(inputs)
    loaded = tokenizer if isinstance(tokenizer, LoadedTokenizer) else load_tokenizer(
        tokenizer, eos_token=eos_token, bos_token=bos_token, add_bos=add_bos, name=tokenizer_name)
    root = Path(out)
    with corpus_lock(root):
        finish_commit(root)  # a commit a crash interrupted is finished first
        existing = load_corpus(root) if (root / MANIFEST).exists() else None
        info = _check_corpus(root, existing, loaded, name=name, version=version, extra_files=extra_files)
        files = _hash_inputs(paths)
        recipe = _recipe(files, text_field=text_field, id_field=id_field, shard_tokens=shard_tokens)
        if existing is not None and subset in existing.manifest.subsets:
            return _unchanged(root, existing, subset, recipe)
        if existing is None:
            manifest = Manifest(name=name or root.resolve().name, version=version or "0.1.0", tokenizer=info)
            _write_if_changed(root / TOKENIZER, loaded.data)
        else:
            manifest = existing.manifest
        staging = root / STAGING / urllib.parse.quote(subset, safe="")
        for folder in (staging, root / DATA / subset, (root / sources_path(subset)).parent):
            SafeDir(root, folder.relative_to(root)).close()  # refuses a link or a file on the way, up front
        units, reused = _unit_jobs(files, staging / "units", root / TOKENIZER, info, text_field=text_field,
                                   id_field=id_field, skip_bad=skip_bad, max_doc_bytes=max_doc_bytes)
        plan = _ShardPlan(units, staging, subset, shard_tokens, info)
        owned = isinstance(engine, str)
        pool = make_engine(engine, workers, address=engine_address) if owned else engine
        with contextlib.closing(pool) if owned else contextlib.nullcontext(pool):
            results, stats = _build(pool, units, reused, plan)
        skipped, examples = _merge_skips(results)
        if not any(result.docs for result in results):
            raise UnreadableInputError(f"the inputs hold no documents to shard (skipped: {skipped or 'none'})",
                                       path=files[0].path if len(files) == 1 else f"{len(files)} inputs")
        shards = _place(root, subset, plan.packs, stats)
        record = {**recipe, "subset": subset, "tokenizer_sha256": info.sha256, "add_bos": info.add_bos,
                  "docs": sum(s.docs for s in shards), "tokens": sum(s.tokens for s in shards), "skipped": skipped}
        atomic_write_bytes(root / sources_path(subset), _canonical(record), root=root)
        manifest = replace(manifest, subsets={**manifest.subsets, subset: SubsetInfo(0, 0, 0, 0, license=license)})
        kept = [f for f in manifest.files if f not in (TOKENIZER, SHARDS_INDEX, SUMS)]
        digest = commit_corpus(root, manifest, [*(existing.shards if existing else ()), *shards],
                               extra_files=sorted({*kept, sources_path(subset), *extra_files}))
        _remove_staging(root, staging)
    return ShardReport(corpus=str(root), subset=subset, docs=record["docs"], tokens=record["tokens"],
                       shards=len(shards), bytes=sum(s.bytes for s in shards), skipped=skipped, examples=examples,
                       units=len(units), units_reused=len(reused), manifest_sha256=digest, unchanged=False)


def _framing(info: TokenizerInfo) -> tuple:
    """What must agree between a corpus and a subset joining it: the tokenizer's bytes and the framing."""
    return info.sha256, info.vocab_size, info.eos_id, info.add_bos, info.bos_id if info.add_bos else None


def _check_corpus(root: Path, existing: Corpus | None, loaded: LoadedTokenizer, *, name: str | None,
                  version: str | None, extra_files: Sequence[str]) -> TokenizerInfo:
    """Check the run fits the corpus; return the tokenizer facts its shards will carry."""
    if existing is None:
        ours = {TOKENIZER, DATA, STAGING, SOURCES, LOCK_NAME, *(Path(f).parts[0] for f in extra_files)}
        foreign = sorted(p.name for p in root.iterdir() if p.name not in ours and not p.name.endswith(".part"))
        if foreign:
            raise CorpusConflictError(
                f"not empty and not a marin corpus (no {MANIFEST}; holds {', '.join(foreign[:5])})", path=str(root))
        return loaded.info
    m = existing.manifest
    if _framing(m.tokenizer) != _framing(loaded.info):
        raise TokenizerMismatchError(
            f"the corpus was tokenized with {m.tokenizer.name} (sha256 {m.tokenizer.sha256[:12]}…, eos "
            f"{m.tokenizer.eos_id}, bos {'on' if m.tokenizer.add_bos else 'off'}), this run with "
            f"{loaded.info.name} (sha256 {loaded.info.sha256[:12]}…, eos {loaded.info.eos_id}, bos "
            f"{'on' if loaded.info.add_bos else 'off'})",
            path=str(root / MANIFEST), expected=asdict(m.tokenizer), actual=asdict(loaded.info))
    for what, given, have in (("name", name, m.name), ("version", version, m.version)):
        if given is not None and given != have:
            raise CorpusConflictError(f"the corpus's {what} is {have!r}, not {given!r}", path=str(root / MANIFEST))
    return m.tokenizer  # new shards carry the corpus's own tokenizer facts (its name included)


def _hash_inputs(paths: Sequence[Path]) -> list[InputFile]:
    """sha256 and size of every input, in parallel threads (hashlib releases the GIL), with a bytes bar."""
    total = sum(p.stat().st_size for p in paths)

    def one(path: Path) -> tuple[str, int]:
        try:
            return sha256_file(path, on_bytes=bar.update)
        except OSError as e:
            raise UnreadableInputError(f"cannot read: {e.strerror or e}", path=str(path)) from e

    with progress(total, "hashing inputs", "B", unit_scale=True) as bar, \
            ThreadPoolExecutor(min(8, max(1, len(paths)))) as threads:
        digests = list(threads.map(one, paths))
    return [InputFile(path=str(p), name=n, bytes=size, sha256=digest)
            for p, n, (digest, size) in zip(paths, source_names(paths), digests)]


def _recipe(files: Sequence[InputFile], *, text_field: str, id_field: str, shard_tokens: int) -> dict:
    """Everything besides the tokenizer that determines a subset's bytes (what a re-run must match)."""
    return {
        "format": 1,
        "inputs": [{"name": f.name, "bytes": f.bytes, "sha256": f.sha256} for f in files],
        "text_field": text_field,
        "id_field": id_field,
        "shard_tokens": shard_tokens,
    }


def _unchanged(root: Path, existing: Corpus, subset: str, recipe: dict) -> ShardReport:
    """The no-op for a subset already built from these inputs; `CorpusConflictError` for anything else."""
    path = root / sources_path(subset)
    try:
        recorded = loads(path.read_bytes())
    except (OSError, ValueError):
        recorded = None
    if recorded is None:
        raise CorpusConflictError(f"the corpus already holds subset {subset!r}, with no record of its inputs "
                                  f"({sources_path(subset)})", path=str(root))
    differ = [k for k in recipe if recorded.get(k) != recipe[k]]
    if differ:
        raise CorpusConflictError(
            f"the corpus already holds subset {subset!r}, made with different {' and '.join(differ)} (see "
            f"{sources_path(subset)}); a subset is only ever the output of one set of inputs and settings",
            path=str(root))
    _remove_staging(root, root / STAGING / urllib.parse.quote(subset, safe=""))  # left by a crash after commit
    info = existing.manifest.subsets[subset]
    return ShardReport(corpus=str(root), subset=subset, docs=info.docs, tokens=info.tokens, shards=info.shards,
                       bytes=info.bytes, skipped=recorded.get("skipped", {}), examples={},
                       units=len(recipe["inputs"]), units_reused=len(recipe["inputs"]),
                       manifest_sha256=existing.manifest_sha256, unchanged=True)


def _write_if_changed(path: Path, data: bytes) -> None:
    if not path.exists() or path.read_bytes() != data:
        atomic_write_bytes(path, data)


def _unit_key(f: InputFile, info: TokenizerInfo, text_field: str, id_field: str) -> str:
    # Everything that shapes a unit's output — but not skip_bad: a unit that had nothing to skip is the
    # same with or without it, which lets a failed run be retried with --skip-bad reusing the good units.
    doc = [f.sha256, f.name, asdict(info), text_field, id_field]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def _unit_jobs(files: Sequence[InputFile], staging: Path, tokenizer_path: Path, info: TokenizerInfo, *,
               text_field: str, id_field: str, skip_bad: bool,
               max_doc_bytes: int) -> tuple[list[UnitJob], dict[int, UnitResult]]:
    """Every input's unit (in input order), and the results of those an earlier run finished, by position."""
    staging.mkdir(parents=True, exist_ok=True)
    jobs = [UnitJob(input=f, key=_unit_key(f, info, text_field, id_field), staging=str(staging),
                    tokenizer_path=str(tokenizer_path), tokenizer=info, text_field=text_field, id_field=id_field,
                    skip_bad=skip_bad, max_doc_bytes=max_doc_bytes) for f in files]
    reused: dict[int, UnitResult] = {}
    for i, job in enumerate(jobs):
        done = _read_marker(_unit_paths(job)[2])
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


def _read_marker(path: Path) -> dict | None:
    try:
        return loads(path.read_bytes())
    except (OSError, ValueError):
        return None


class _ShardPlan:
    """Cuts the units' documents, in unit order, into shards of at most ``shard_tokens`` tokens, as units finish.

    `advance` cuts the finished units that come next in input order and returns the shards they closed, and
    once every unit is cut, the last shard. A cut reads only a unit's document lengths (bounded memory for
    any subset size), so the shards are the same whatever order the units finish in and whatever the
    worker count. Packs of an interrupted run over other inputs are removed when the plan starts.
    """

    def __init__(self, units: Sequence[UnitJob], staging: Path, subset: str, shard_tokens: int,
                 info: TokenizerInfo) -> None:
        key = hashlib.sha256(json.dumps([[j.key for j in units], shard_tokens]).encode()).hexdigest()[:16]
        self.out_dir = staging / "shards" / key
        for stale in (staging / "shards").glob("*"):
            if stale != self.out_dir:
                shutil.rmtree(stale)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.units, self.subset, self.shard_tokens, self.info = units, subset, shard_tokens, info
        self.packs: list[PackJob] = []  # the shards cut so far
        self._next = 0  # the first unit not cut yet
        self._pieces: list[tuple[str, int, int]] = []  # the open shard
        self._filled = 0  # its tokens

    def advance(self, finished: Container[int]) -> list[tuple[int, PackJob]]:
        """Cut the units from the first not cut yet up to the first not in ``finished``; the new shards, numbered."""
        start = len(self.packs)
        while self._next < len(self.units) and self._next in finished:
            self._cut(self.units[self._next])
            self._next += 1
        if self._next == len(self.units) and self._pieces:
            self._close()
        return list(enumerate(self.packs[start:], start))

    def _cut(self, unit: UnitJob) -> None:
        parquet, lengths_path, _ = _unit_paths(unit)
        ends = np.cumsum(np.load(lengths_path))  # ends[i]: tokens of documents [0, i]
        first = 0
        while first < len(ends):
            before = int(ends[first - 1]) if first else 0
            end = int(np.searchsorted(ends, before + self.shard_tokens - self._filled, "right"))
            if end == first and self._filled == 0:
                end = first + 1  # a document longer than a shard: a shard of its own
            if end > first:
                self._pieces.append((str(parquet), first, end))
                self._filled += int(ends[end - 1]) - before
                first = end
            if first < len(ends):  # the next document does not fit: close this shard
                self._close()

    def _close(self) -> None:
        n = len(self.packs)
        shard_path(self.subset, n)  # refuses a subset of more shards than a Hub folder holds
        self.packs.append(PackJob(out=str(self.out_dir / f"part-{n:05d}.parquet"), pieces=tuple(self._pieces),
                                  tokenizer=self.info))
        self._pieces, self._filled = [], 0


def _build(pool: Engine, units: Sequence[UnitJob], reused: dict[int, UnitResult],
           plan: _ShardPlan) -> tuple[list[UnitResult], list[ShardStats]]:
    """Run the units not finished before, and each shard's pack as soon as the units it reads are finished.

    The engine gets one growing list of jobs: the units, then each pack as `plan` cuts its shard, queued
    behind the units still waiting, so packing fills the workers that would otherwise idle while the last
    units finish instead of waiting for all of them. Packs finished before are not run again. Returns every
    unit's result (in input order) and every shard's stats (in shard order).
    """
    results = dict(reused)
    stats: dict[int, ShardStats] = {}
    jobs: list[UnitJob | PackJob] = [job for i, job in enumerate(units) if i not in results]
    slots = [i for i in range(len(units)) if i not in results]  # jobs[k] is unit, or shard, number slots[k]
    total = sum(job.input.bytes for job in jobs)
    _queue_packs(plan.advance(results), jobs, slots, stats)
    with progress(total, "tokenizing", "B", unit_scale=True) as bar:
        tokens = 0
        for k, result in pool.map_unordered(run_job, jobs):
            if isinstance(jobs[k], PackJob):
                stats[slots[k]] = result
            else:
                results[slots[k]] = result
                tokens += result.tokens
                bar.update(jobs[k].input.bytes)
                _queue_packs(plan.advance(results), jobs, slots, stats)
            bar.set_postfix_str(f"{tokens:,} tokens, {len(stats)} shards written", refresh=False)
    return [results[i] for i in range(len(units))], [stats[n] for n in range(len(plan.packs))]


def _queue_packs(packs: Iterable[tuple[int, PackJob]], jobs: list[UnitJob | PackJob], slots: list[int],
                 stats: dict[int, ShardStats]) -> None:
    """Append the packs not finished before to ``jobs`` (``slots``: their shard numbers); take the others' stats."""
    for n, pack in packs:
        done = _read_marker(Path(pack.out).with_suffix(".json"))
        if done is not None:
            stats[n] = ShardStats(**done)
        else:
            jobs.append(pack)
            slots.append(n)


def _place(root: Path, subset: str, packs: Sequence[PackJob], stats: Sequence[ShardStats]) -> list[ShardRecord]:
    """Rename the staging shards to their final names; return their index rows.

    The subset is not in the manifest yet, so ``part-*.parquet`` files already in its folder come from an
    interrupted run: those this run wrote (checked by sha256) stay, others are replaced or removed.
    """
    records = []
    for n, (job, st) in enumerate(zip(packs, stats)):
        rel = shard_path(subset, n)
        dst = root / rel
        if Path(job.out).exists():
            with SafeDir.of(dst, root) as folder:  # renamed into the folder reached without following links
                folder.regular(dst.name)
                os.replace(job.out, folder.proc_path(dst.name))
        elif not dst.exists() or sha256_file(dst) != (st.sha256, st.bytes):  # placed by a crashed run?
            Path(job.out).with_suffix(".json").unlink(missing_ok=True)
            raise ShardFormatError("a staged shard vanished before it was placed; run the command again to "
                                   "rewrite it", path=str(dst))
        records.append(ShardRecord(path=rel, subset=subset, bytes=st.bytes, sha256=st.sha256, docs=st.docs,
                                   tokens=st.tokens, row_groups=st.row_groups))
    folder = root / DATA / subset
    placed = {Path(r.path).name for r in records}
    for leftover in folder.glob("part-*.parquet") if folder.exists() else ():
        if _PART.fullmatch(leftover.name) and leftover.name not in placed:
            leftover.unlink()
    return records


def _merge_skips(results: Sequence[UnitResult]) -> tuple[dict[str, int], dict[str, str]]:
    skipped: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for result in results:
        skipped.update(result.skipped)
        for reason, example in result.examples.items():
            examples.setdefault(reason, example)
    return dict(sorted(skipped.items())), dict(sorted(examples.items()))


def _remove_staging(root: Path, staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(OSError):
        (root / STAGING).rmdir()  # only when no other subset's staging is left
