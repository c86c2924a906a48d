"""``adopt`` of a Levanter cache or store where it lives: ``s3://``, ``hf://``, or a local folder whose pin goes
elsewhere, each file read once, hashed on an engine, and the pin written beside the data or apart from it.

The order of work, each step before the next:

1. The data is listed once (`SnapshotStore`: detection, checks and hashing all see that one listing; a pin
   already beside the data is hidden from it) and the chosen cells (``subsets``, globs as download takes them)
   are opened and their structure checked remotely (`check_cells`: ledgers, ``zarr.json``, offsets, sub-cache
   totals, ``.success``, each chunk file's index in a ranged read). A defect refuses the run, as a local
   adopt refuses it; a listed name that no copy could hold refuses it as a download does (`cell_listing`).
2. The pin already at the destination, if any, is read (`PinPlace.earlier`): its cells are kept, their rows
   re-used once the listing still gives each file the size (and digests) it was pinned with; a run adds the
   cells it does not hold yet. It must pin the same data with the same tokenizer.
3. Every file of every new cell is a `FileJob` on the engine (threads here, or Ray tasks: `--engine ray`),
   streamed once and checked against every digest the store vouches for (`marin_data.levanter.adopt_files`).
   Each file hashed is appended to the journal where the pin is built (`Journal`): a killed run, run again,
   hashes only the files it had not finished. A job opens the data at the URL `Store.reopen_url` gives: an
   ``hf://`` repo's names the commit the listing was taken at, so a branch moved mid-run is not read.
4. The pin (`commit_pin`: the same files as a local adopt, and ``vouched.json`` stating per file which store
   digest it was checked against, or that its digest was first seen here) is committed where it is built and,
   for a remote destination, uploaded with the manifest last (`PinPlace.publish`). A pin apart from its data
   names the data's URL in the manifest's ``data`` field (docs/design.md, "Levanter caches").

Nothing is written under the data's prefix unless the pin goes beside it: no lock, marker or temporary object.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from marin_data.corpus.commit import finish_commit
from marin_data.corpus.foreign import foreign
from marin_data.corpus.manifest import Manifest
from marin_data.corpus.names import as_subset_name, select_subsets
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.docs.questions import load_metadata
from marin_data.engines import make_engine
from marin_data.engines.local import default_workers
from marin_data.engines.threads import ThreadEngine
from marin_data.errors import CorpusConflictError, StoreDigestMismatchError, TokenizerMismatchError, \
    UnknownSubsetError
from marin_data.fileio.lock import corpus_lock
from marin_data.levanter.adopt import FIRST_SEEN, AdoptReport, cache_files, commit_pin, is_ours, \
    tokenizer_name_for, vouched_by
from marin_data.levanter.adopt_dest import Earlier, PinPlace, is_remote
from marin_data.levanter.adopt_files import FileJob, hash_file, identity
from marin_data.levanter.adopt_journal import Finished, Journal
from marin_data.levanter.adopt_reads import CheckedReads
from marin_data.levanter.cache import LevanterCache, open_cache
from marin_data.levanter.checks import refuse_problems
from marin_data.levanter.describe import descriptions_of
from marin_data.levanter.detect import CACHE, CORPUS, Source, detect_store
from marin_data.levanter.download import cell_listing
from marin_data.levanter.filehash import ChunkCheck
from marin_data.levanter.ledgermeta import load_framed
from marin_data.levanter.pinned import LEVANTER_CACHE, LEVANTER_STORE
from marin_data.levanter.verify import REMOTE_WORKERS, check_cells
from marin_data.retry import RetryPolicy
from marin_data.stores import open_store
from marin_data.stores.checksums import strongest
from marin_data.stores.snapshot import SnapshotStore
from marin_data.transfer.plan import DOWNLOAD_POLICY

__all__ = ["adopt_store"]


@dataclass
class _Run:
    """One adopt of a store: where the data and the pin are, and what the data holds."""

    url: str  # the data, as jobs open it
    data: SnapshotStore
    found: Source
    place: PinPlace
    beside: bool  # the pin goes beside the data (the data's own URL)
    options: dict = field(default_factory=dict)


@dataclass
class _Plan:
    """What a run pins: the cells (those pinned before first), the rows kept, the files to hash."""

    name: str
    version: str
    subsets: list[str]  # every cell of the pin, earlier and new
    licenses: dict[str, str]
    descriptions: dict[str, str]
    kept: list[ShardRecord]
    kept_vouched: dict[str, dict]
    jobs: list[FileJob]
    skipped: tuple[str, ...]
    loaded: object  # the tokenizer (`LoadedTokenizer`)
    named_from: str


def adopt_store(url: str | os.PathLike, *, tokenizer: str, pin_to: str | None = None, subsets: list[str] = (),
                engine: str = "local", engine_address: str | None = None, workers: int | None = None,
                work_dir: str | os.PathLike | None = None, name: str | None = None, version: str = "1",
                license: str = "unknown", tokenizer_name: str | None = None, meta: str | os.PathLike | None = None,
                policy: RetryPolicy = DOWNLOAD_POLICY, **store_options) -> AdoptReport:
    """Pin the Levanter cache or store at ``url`` where it lives (module docstring).

    Args:
        pin_to: the pin's destination (a local folder, ``s3://``, ``hf://``); default: beside the data.
        subsets: cell names or globs to pin (default: every cell); cells already pinned there are kept.
        engine, engine_address, workers: where files are hashed (``"local"``: threads; ``"ray"``: Ray tasks).
        work_dir: where a remote destination's pin is built (default under the user's cache folder).
        policy: retries of each store request (a damaged transfer is retried too).
        **store_options: for the data's store and the destination's (`open_store`).
        Others as `marin_data.levanter.adopt.adopt`.

    Raises:
        StoreDigestMismatchError: a file's bytes contradict a digest the store gives, or a file pinned earlier
            changed since: nothing pinned over it.
        CorpusConflictError: the data holds a corpus, the destination lies inside the data, or its pin pins
            other data; TokenizerMismatchError: its pin has another tokenizer.
        UnsafePathError, UnknownSubsetError, CacheFormatError, CacheUnfinishedError, CacheCheckError, RemoteError:
            as a download, or a local adopt, of the same store.
    """
    run = _open(os.fspath(url), pin_to, work_dir, store_options)
    run.place.folder.mkdir(parents=True, exist_ok=True)
    with corpus_lock(run.place.folder):
        if not run.place.remote:
            finish_commit(run.place.folder)  # a commit a killed run left moving in
        plan = _plan(run, run.place.earlier(), subsets=list(subsets or []), tokenizer=tokenizer,
                     tokenizer_name=tokenizer_name, name=name, version=version, license=license, meta=meta,
                     policy=policy)
        t0 = time.perf_counter()
        journal = Journal(run.place.folder, run.url)
        hashed, reused = _hash_all(plan.jobs, journal, run, engine, engine_address, workers)
        seconds = time.perf_counter() - t0
        rows = [*plan.kept, *(f.row for f in hashed.values())]
        vouched = dict(sorted({**plan.kept_vouched, **{p: _how(f.vouched) for p, f in hashed.items()}}.items()))
        manifest = Manifest(name=plan.name, version=plan.version, tokenizer=plan.loaded.info,
                            subsets={s: SubsetInfo(0, 0, 0, 0, plan.licenses[s]) for s in plan.subsets},
                            format=LEVANTER_CACHE if run.found.kind == CACHE else LEVANTER_STORE,
                            data="" if run.beside else run.url)
        read_at = run.data.reopen_url()  # an hf:// repo's at the commit listed: the version every job read
        digest = commit_pin(run.place.folder, manifest, rows, licenses=plan.licenses, tokenizer=plan.loaded.data,
                            descriptions=plan.descriptions, vouched=(read_at, vouched))
        run.place.publish()
        journal.remove()  # only once the pin is where it goes
    return AdoptReport(root=run.place.url, manifest_sha256=digest, subsets=tuple(sorted(plan.subsets)),
                       files=len(rows), bytes=sum(r.bytes for r in rows), seconds=seconds, skipped=plan.skipped,
                       tokenizer=plan.loaded.info.name, tokenizer_from=plan.named_from,
                       data="" if run.beside else run.url, reused=reused + len(plan.kept), **vouched_by(vouched),
                       read_at="" if read_at == run.url else read_at)


def _plan(run: _Run, earlier: Earlier | None, *, subsets: list[str], tokenizer: str, tokenizer_name: str | None,
          name: str | None, version: str, license: str, meta: str | os.PathLike | None,
          policy: RetryPolicy) -> _Plan:
    """The cells to add to the pin at the destination (if any), checked; their files as jobs.

    Raises:
        as `adopt_store`: a structural defect, an unsafe listing, another pin there, a pinned file changed.
    """
    _refuse_other_pin(run, earlier)
    name = earlier.manifest.name if earlier else name or as_subset_name(run.url.rstrip("/").rsplit("/", 1)[-1])
    cells = _cells(run.found, subsets, earlier, name)
    new = {s: p for s, p in cells.items() if not earlier or s not in earlier.manifest.subsets}
    kept, kept_vouched = _kept(run, earlier)
    reads = CheckedReads(run.data)  # what the checks read, kept for the jobs: not fetched again for them
    caches = _open_caches(reads, new)
    named, named_from = tokenizer_name_for(tokenizer_name, caches.values())
    loaded = load_framed(tokenizer, caches.values(), name=named)
    if earlier and earlier.manifest.tokenizer.sha256 != loaded.info.sha256:
        raise TokenizerMismatchError(f"the pin at {run.place.url} has the tokenizer "
                                     f"{earlier.manifest.tokenizer.name}, not {loaded.info.name}: adopt with it",
                                     path=run.place.url)
    problems, _, _ = check_cells(reads, caches, vocab_size=loaded.info.vocab_size)  # opened once
    refuse_problems(problems, run.url)
    jobs, skipped = _jobs(run, caches, loaded.info.vocab_size, policy, reads)
    before = earlier.manifest.subsets if earlier else {}
    every = sorted({*before, *new})
    answers = load_metadata(meta, subsets=every, licenses=True)
    licenses = {s: before[s].license if s in before else answers.licenses.get(s, license) for s in every}
    return _Plan(name, earlier.manifest.version if earlier else version, every, licenses,
                 descriptions_of(answers, every), kept, kept_vouched, jobs, skipped, loaded, named_from)


def _open(url: str, pin_to: str | None, work_dir: str | os.PathLike | None, options: dict) -> _Run:
    """The data (listed once) and the pin's place; what the data holds.

    Raises:
        CorpusConflictError: the data is a corpus already, or the destination lies inside the data.
    """
    data_url = url.rstrip("/") if is_remote(url) else str(Path(url).resolve())
    place = PinPlace(pin_to or data_url, options, work_dir)
    beside = place.url.rstrip("/") == data_url.rstrip("/")
    if not beside and place.url.rstrip("/").startswith(data_url.rstrip("/") + "/"):
        raise CorpusConflictError(f"the pin would go inside the data it pins ({data_url}): nothing is written "
                                  "under the data's prefix but a pin beside it; --pin-to another place",
                                  path=place.url)
    data = SnapshotStore(open_store(data_url, **options), hide=is_ours if beside else lambda path: False)
    found = detect_store(data)
    if found.kind == CORPUS:
        raise CorpusConflictError(f"already a marin corpus ({data_url}): nothing to adopt", path=data_url)
    return _Run(data_url, data, found, place, beside, options)


def _refuse_other_pin(run: _Run, earlier: Earlier | None) -> None:
    """A pin at the destination must be one of this data, of the same kind: cells are added to it."""
    if earlier is None:
        return
    kind = LEVANTER_CACHE if run.found.kind == CACHE else LEVANTER_STORE
    pins = earlier.manifest.data or run.place.url  # no data field: the data beside it
    if earlier.manifest.format != kind or pins.rstrip("/") != run.url.rstrip("/"):
        raise CorpusConflictError(f"{run.place.url} holds another pin (a {earlier.manifest.format} of {pins}): "
                                  "adopt adds cells only to a pin of the same data", path=run.place.url)


def _cells(found: Source, subsets: list[str], earlier: Earlier | None, name: str) -> dict[str, str]:
    """The chosen cells, subset name -> cache root (a single cache: its one subset at the root)."""
    if found.kind == CACHE:
        if subsets:
            raise UnknownSubsetError("--subset selects cells of a store; this is one cache", actual=list(subsets))
        return {next(iter(earlier.manifest.subsets)) if earlier else as_subset_name(name): ""}
    return {c: c for c in select_subsets(found.cells, list(subsets or []), what="cell")}


def _kept(run: _Run, earlier: Earlier | None) -> tuple[list[ShardRecord], dict[str, dict]]:
    """The rows (and ``vouched.json`` entries) of the pin already there, each file still listed as pinned.

    Raises:
        StoreDigestMismatchError: a pinned file is gone, or listed with another size or digest.
    """
    if earlier is None:
        return [], {}
    for row in earlier.rows:
        info = run.data.head(row.path)
        if info is None:
            raise StoreDigestMismatchError(f"pinned in {run.place.url}, gone from the data since; nothing pinned",
                                           path=run.data.describe(row.path))
        said = {**info.digests(), "bytes": info.size}
        pinned = {"bytes": row.bytes, "sha256": row.sha256}
        how = earlier.vouched.get(row.path, {})
        if how.get("checked") not in (None, FIRST_SEEN):
            pinned[how["checked"]] = how.get("digest")
        changed = [k for k in pinned if k in said and said[k] != pinned[k]]
        if changed:
            raise StoreDigestMismatchError(
                f"listed with {changed[0]} {said[changed[0]]}, pinned with {pinned[changed[0]]}: changed since it "
                f"was pinned in {run.place.url}; nothing pinned", path=run.data.describe(row.path),
                expected=pinned[changed[0]], actual=said[changed[0]])
    return list(earlier.rows), {r.path: earlier.vouched[r.path] for r in earlier.rows if r.path in earlier.vouched}


def _open_caches(store: CheckedReads, cells: dict[str, str]) -> dict[str, LevanterCache]:
    with ThreadPoolExecutor(max_workers=max(1, min(REMOTE_WORKERS, len(cells)))) as pool:
        opened = list(pool.map(lambda p: open_cache(store, p, require_finished=False), cells.values()))
    return dict(zip(cells, opened))


def _jobs(run: _Run, caches: dict[str, LevanterCache], vocab_size: int, policy: RetryPolicy,
          reads: CheckedReads) -> tuple[list[FileJob], tuple[str, ...]]:
    """A `FileJob` per file of each new cell, with what the checks read of it (``reads``), and the other tools'
    bookkeeping left out (sorted, each once)."""
    options, url = tuple(sorted(run.options.items())), run.data.reopen_url()  # hf://: the commit listed
    jobs, skipped = [], set(run.found.skipped)
    for subset, cache in caches.items():
        listed = {o.path: o for o in cell_listing(run.data, cache.prefix)}
        skipped.update(f for o in run.data.list(cache.prefix) if (f := foreign(o.path)))
        for f in cache_files(subset, cache, list(listed)):
            info = listed[f.path]
            chunk = ChunkCheck(f.meta, f.tokens, vocab_size) if f.meta is not None else None
            seen = {"tail": reads.tail(f.path, info.size, f.meta.index_bytes)} if chunk else \
                {"checked": reads.digests(f.path)}
            jobs.append(FileJob(url, options, info, subset, f.kind, f.tokens, f.docs, chunk, policy, **seen))
    return jobs, tuple(sorted(skipped))


def _hash_all(jobs: list[FileJob], journal: Journal, run: _Run, engine: str, address: str | None,
              workers: int | None) -> tuple[dict[str, Finished], int]:
    """Every job's result: the journal's where the listing still says the same of the file, the others hashed
    on the engine (each appended to the journal as it arrives); and how many came from the journal."""
    listed = {j.info.path: identity(j.info) for j in jobs}
    done = {p: f for p, f in journal.read().items() if listed.get(p) == f.listed}
    journal.start(done)
    todo = [j for j in jobs if j.info.path not in done]
    if engine == "ray":
        runner = make_engine("ray", workers, address=address)
    elif address is not None:
        raise ValueError("--ray-address needs --engine ray")
    else:
        runner = ThreadEngine(workers or (REMOTE_WORKERS if is_remote(run.url) else default_workers()))
    out = dict(done)
    try:
        for _, finished in runner.map_unordered(hash_file, todo):
            journal.append(finished)
            out[finished.row.path] = finished
    finally:
        runner.close()
    return dict(sorted(out.items())), len(done)


def _how(vouched: dict[str, str]) -> dict:
    """A ``vouched.json`` entry: the strongest store digest the file was checked against, or first seen."""
    best = strongest(vouched)
    return {"checked": best, "digest": vouched[best]} if best else {"checked": FIRST_SEEN}
