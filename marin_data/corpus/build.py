"""``marin-data shard``: tokenize raw documents into one subset of a corpus — parallel, deterministic,
restartable.

`shard_subset` runs a build: it plans (inputs hashed, `marin_data.corpus.sources`; tokenizer checked against
the corpus, under the corpus lock), tokenizes one unit per input file (`marin_data.corpus.units`), packs the
documents into shards of at most ``shard_tokens`` tokens (`marin_data.corpus.packs`, each shard as soon as the
units it reads are done), and commits the subset: shards renamed into ``data/<subset>/``, its inputs recorded
in ``sources/<subset>.json``, the manifest written last. Both middle steps run on an engine
(`marin_data.engines`, through `run_job`) and leave done markers under ``.staging/``, so a re-run redoes only
unfinished work and any worker count writes the same bytes. A subset already built from other inputs is
refused (`CorpusConflictError`): add a child subset instead. How each step works, and why: docs/data.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from marin_data.fileio.atomic import SafeDir, atomic_write_bytes, sha256_file
from marin_data.corpus.commit import commit_corpus, finish_commit
from marin_data.corpus.manifest import Corpus, Manifest, load_corpus
from marin_data.corpus.markers import canonical, read_marker
from marin_data.corpus.names import check_subset_name
from marin_data.corpus.packs import PackJob, ShardPlan, pack_shard
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.corpus.shard import ShardStats, shard_path
from marin_data.corpus.sources import check_recorded, hash_inputs, make_recipe, sources_path
from marin_data.corpus.units import UnitJob, UnitResult, tokenize_unit, unit_jobs
from marin_data.engines import Engine, make_engine
from marin_data.errors import CorpusConflictError, ShardFormatError, TokenizerMismatchError, UnreadableInputError
from marin_data.layout import DATA, LOCK_NAME, MANIFEST, SHARDS_INDEX, SOURCES, STAGING, SUMS, TOKENIZER
from marin_data.fileio.lock import corpus_lock
from marin_data.raw.documents import DEFAULT_MAX_DOC_BYTES, expand_inputs
from marin_data.raw.tokenizer import LoadedTokenizer, TokenizerInfo, load_tokenizer
from marin_data.ui import plural, progress

__all__ = ["DEFAULT_SHARD_TOKENS", "ShardReport", "run_job", "shard_subset", "check_corpus", "place_shards",
           "remove_staging"]

# 2**28 tokens: ~350 MB at the measured 0.33 x 4 bytes per token, inside docs/design.md's 256 MiB-2 GiB; a
# packing worker holds one shard's tokens in memory (~1 GiB of uint32).
DEFAULT_SHARD_TOKENS = 1 << 28
_PART = re.compile(r"part-\d{5}\.parquet")


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


def run_job(job: UnitJob | PackJob) -> UnitResult | ShardStats:
    """`tokenize_unit` or `pack_shard`, as ``job`` asks: one function for the engine, so packs can join the units."""
    return tokenize_unit(job) if isinstance(job, UnitJob) else pack_shard(job)


def shard_subset(inputs: Sequence[str | os.PathLike], *, subset: str, tokenizer: str | LoadedTokenizer,
                 out: str | os.PathLike, workers: int | None = None, engine: str | Engine = "local",
                 engine_address: str | None = None, text_field: str = "text", id_field: str = "id",
                 add_bos: bool = False, eos_token: str | None = None, bos_token: str | None = None,
                 tokenizer_name: str | None = None, skip_bad: bool = False,
                 max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES, license: str = "unknown",
                 shard_tokens: int = DEFAULT_SHARD_TOKENS, name: str | None = None, version: str | None = None,
                 extra_files: Sequence[str] = ()) -> ShardReport:
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
        info = check_corpus(root, existing, loaded, name=name, version=version, extra_files=extra_files)
        files = hash_inputs(paths)
        recipe = make_recipe(files, text_field=text_field, id_field=id_field, shard_tokens=shard_tokens)
        if existing is not None and subset in existing.manifest.subsets:
            return _unchanged(root, existing, subset, recipe)
        manifest, staging = _start_subset(root, subset, existing, loaded, info, name=name, version=version)
        units, reused = unit_jobs(files, staging / "units", root / TOKENIZER, info, text_field=text_field,
                                   id_field=id_field, skip_bad=skip_bad, max_doc_bytes=max_doc_bytes)
        plan = ShardPlan(units, staging, subset, shard_tokens, info)
        results, stats = _build_on(engine, workers, engine_address, units, reused, plan)
        skipped, examples = _merge_skips(results)
        if not any(result.docs for result in results):
            raise UnreadableInputError(f"the inputs hold no documents to shard (skipped: {skipped or 'none'})",
                                       path=files[0].path if len(files) == 1 else f"{len(files)} inputs")
        shards, record, digest = _commit_subset(root, subset, existing, manifest, plan, stats, recipe, info, skipped,
                                                license=license, extra_files=extra_files)
        remove_staging(root, staging)
    return ShardReport(corpus=str(root), subset=subset, docs=record["docs"], tokens=record["tokens"],
                       shards=len(shards), bytes=sum(s.bytes for s in shards), skipped=skipped, examples=examples,
                       units=len(units), units_reused=len(reused), manifest_sha256=digest, unchanged=False)


def _framing(info: TokenizerInfo) -> tuple:
    """What must agree between a corpus and a subset joining it: the tokenizer's bytes and the framing."""
    return info.sha256, info.vocab_size, info.eos_id, info.add_bos, info.bos_id if info.add_bos else None


def check_corpus(root: Path, existing: Corpus | None, loaded: LoadedTokenizer, *, name: str | None,
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


def _staging(root: Path, subset: str) -> Path:
    return root / STAGING / urllib.parse.quote(subset, safe="")


def _unchanged(root: Path, existing: Corpus, subset: str, recipe: dict) -> ShardReport:
    """The no-op for a subset already built from these inputs; `CorpusConflictError` for anything else."""
    recorded = check_recorded(root, subset, recipe)
    remove_staging(root, _staging(root, subset))  # left by a crash after commit
    info = existing.manifest.subsets[subset]
    return ShardReport(corpus=str(root), subset=subset, docs=info.docs, tokens=info.tokens, shards=info.shards,
                       bytes=info.bytes, skipped=recorded.get("skipped", {}), examples={},
                       units=len(recipe["inputs"]), units_reused=len(recipe["inputs"]),
                       manifest_sha256=existing.manifest_sha256, unchanged=True)


def _start_subset(root: Path, subset: str, existing: Corpus | None, loaded: LoadedTokenizer, info: TokenizerInfo,
                  *, name: str | None, version: str | None) -> tuple[Manifest, Path]:
    """The manifest a new subset joins (a new corpus's, with its ``tokenizer.json`` written) and the subset's
    staging folder; every folder the run writes in is checked first."""
    if existing is None:
        manifest = Manifest(name=name or root.resolve().name, version=version or "0.1.0", tokenizer=info)
        _write_if_changed(root / TOKENIZER, loaded.data)
    else:
        manifest = existing.manifest
    staging = _staging(root, subset)
    for folder in (staging, root / DATA / subset, (root / sources_path(subset)).parent):
        SafeDir(root, folder.relative_to(root)).close()  # refuses a link or a file on the way, up front
    return manifest, staging


def _write_if_changed(path: Path, data: bytes) -> None:
    if not path.exists() or path.read_bytes() != data:
        atomic_write_bytes(path, data)


def _build_on(engine: str | Engine, workers: int | None, engine_address: str | None, units: Sequence[UnitJob],
              reused: dict[int, UnitResult], plan: ShardPlan) -> tuple[list[UnitResult], list[ShardStats]]:
    """`_build` on ``engine``: a running one, or one started by name here and closed when done."""
    owned = isinstance(engine, str)
    pool = make_engine(engine, workers, address=engine_address) if owned else engine
    with contextlib.closing(pool) if owned else contextlib.nullcontext(pool):
        return _build(pool, units, reused, plan)


def _build(pool: Engine, units: Sequence[UnitJob], reused: dict[int, UnitResult],
           plan: ShardPlan) -> tuple[list[UnitResult], list[ShardStats]]:
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
            bar.set_postfix_str(f"{tokens:,} tokens, {plural(len(stats), 'shard')} written", refresh=False)
    return [results[i] for i in range(len(units))], [stats[n] for n in range(len(plan.packs))]


def _commit_subset(root: Path, subset: str, existing: Corpus | None, manifest: Manifest, plan: ShardPlan,
                   stats: Sequence[ShardStats], recipe: dict, info: TokenizerInfo, skipped: dict[str, int], *,
                   license: str, extra_files: Sequence[str]) -> tuple[list[ShardRecord], dict, str]:
    """Commit a built subset: its shards placed, its inputs recorded in ``sources/<subset>.json``, then the
    manifest that lists it. Returns the shards' index rows, the record and the manifest's sha256."""
    shards = place_shards(root, subset, [p.out for p in plan.packs], stats)
    record = {**recipe, "subset": subset, "tokenizer_sha256": info.sha256, "add_bos": info.add_bos,
              "docs": sum(s.docs for s in shards), "tokens": sum(s.tokens for s in shards), "skipped": skipped}
    atomic_write_bytes(root / sources_path(subset), canonical(record), root=root)
    manifest = replace(manifest, subsets={**manifest.subsets, subset: SubsetInfo(0, 0, 0, 0, license=license)})
    kept = [f for f in manifest.files if f not in (TOKENIZER, SHARDS_INDEX, SUMS)]
    digest = commit_corpus(root, manifest, [*(existing.shards if existing else ()), *shards],
                           extra_files=sorted({*kept, sources_path(subset), *extra_files}))
    return shards, record, digest


def _queue_packs(packs: Iterable[tuple[int, PackJob]], jobs: list[UnitJob | PackJob], slots: list[int],
                 stats: dict[int, ShardStats]) -> None:
    """Append the packs not finished before to ``jobs`` (``slots``: their shard numbers); take the others' stats."""
    for n, pack in packs:
        done = read_marker(Path(pack.out).with_suffix(".json"))
        if done is not None:
            stats[n] = ShardStats(**done)
        else:
            jobs.append(pack)
            slots.append(n)


def place_shards(root: Path, subset: str, staged: Sequence[str | os.PathLike],
                 stats: Sequence[ShardStats]) -> list[ShardRecord]:
    """Rename a subset's staged shards (``staged[n]`` becomes its part ``n``, each with its done marker
    ``.json`` beside it) to their final names; return their index rows.

    The subset is not in the manifest yet, so ``part-*.parquet`` files already in its folder come from an
    interrupted run: those this run wrote (checked by sha256) stay, others are replaced or removed.
    """
    records = []
    for n, (out, st) in enumerate(zip(staged, stats)):
        rel = shard_path(subset, n)
        dst = root / rel
        if Path(out).exists():
            with SafeDir.of(dst, root) as folder:  # renamed into the folder reached without following links
                folder.regular(dst.name)
                os.replace(out, folder.proc_path(dst.name))
        elif not dst.exists() or sha256_file(dst) != (st.sha256, st.bytes):  # placed by a crashed run?
            Path(out).with_suffix(".json").unlink(missing_ok=True)
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


def remove_staging(root: Path, staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(OSError):
        (root / STAGING).rmdir()  # only when no other subset's staging is left
