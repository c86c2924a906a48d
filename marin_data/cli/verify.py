"""``marin-data verify``: re-hash a local corpus against its manifest, check a Levanter cache's structure
(library: the source `marin_data.formats.open_source` opens, its ``verify``), or compare a local corpus with
its published copy (`marin_data.transfer.remote_verify`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from marin_data.cli._engine_options import engine_kwargs, engine_options
from marin_data.cli._hf_options import hf_options
from marin_data.cli._store_options import check_sha256, is_url, remote_options, source_options, store_options, \
    usage_errors
from marin_data.errors import VerificationFailedError
from marin_data.layout import CHECKED
from marin_data.ui import echo, human_bytes, plural, printable
from marin_data.corpus.foreign import skipped_groups
from marin_data.corpus.verify import SCOPE_DOWNLOADED, VerifyReport

__all__ = ["command"]


@click.command("verify")
@click.argument("corpus", metavar="CORPUS|CACHE|URL")
@click.option("--subset", "subsets", multiple=True, metavar="NAME_OR_GLOB",
              help="Check only these subsets (repeatable; names, globs or parent paths). Default: all (in a "
                   "partial download: the subsets it fetched), plus the metadata files.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Hashing threads (with --engine ray: Ray tasks at once). Default: one per available core "
                   "(a Ray cluster: all its CPUs).")
@engine_options
@click.option("--deep", is_flag=True,
              help="Also read each shard's footer: schema, encodings, tokenizer, document/token counts. On a "
                   "Levanter cache: decode every token (ids inside the vocabulary). With --remote: stream and "
                   "re-hash every byte the store holds (jobs on --engine) instead of trusting its checksums.")
@click.option("--tokenizer", metavar="TOK",
              help="An unpinned Levanter cache: with --deep, token ids must be below this tokenizer's vocabulary.")
@click.option("--expect-bos", type=click.IntRange(min=0), metavar="ID",
              help="A Levanter cache: every non-empty document must start with this token (implies --deep).")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report on stdout.")
@click.option("--manifest-sha256", metavar="HEX",
              help="Refuse the corpus unless manifest.json has this sha256 (the published root of trust).")
@click.option("--remote", metavar="[URL]", is_flag=False, flag_value="",
              help="Check a copy where it is stored instead of local files. With URL (s3://bucket/prefix or "
                   "hf://datasets/org/name): the published copy of the local CORPUS, against CORPUS's manifest. "
                   "Alone: the pin CORPUS (a URL, or a local pin whose data lives in a store) against the store "
                   "holding its data. From the store's own checksums and sizes (no shard data downloaded), or "
                   "with --deep every byte re-hashed, and a pinned Levanter store's cells checked.")
@store_options
@hf_options
def command(corpus: str, subsets: tuple[str, ...], workers: int | None, deep: bool, tokenizer: str | None,
            expect_bos: int | None, as_json: bool, manifest_sha256: str | None, engine: str, ray_address: str | None,
            remote: str | None, endpoint_url: str | None, profile: str | None, anonymous: bool,
            requester_pays: bool, endpoint: str | None, token: str | None) -> None:
    """Check that every file of CORPUS holds exactly the bytes its manifest lists.

    Reports each missing, truncated, oversized, modified and unlisted file by path. Exit status: 0 all
    good, 1 problems found, 2 bad usage or a manifest that cannot be trusted (nothing checked).
    Leftover *.part files of interrupted writes are listed but do not fail the check; the bookkeeping
    folder of a copy made by `hf download --local-dir` (.cache/huggingface/) and the .executor_info and
    .executor_status files Marin's executor writes beside its outputs are skipped, and said so.

    A Levanter cache or store of caches (local, s3:// or hf://) gets the structural checks Levanter never
    makes: ledgers finished, zarr.json present, offsets consistent with the ledger, sub-cache totals,
    .success markers, .stats.json, dtypes, every chunk file's index; --deep decodes every token. A cache
    pinned by `marin-data adopt` is hashed as a corpus, then checked so.

    \b
    EXAMPLES
      marin-data verify out/sample
      marin-data verify out/sample --subset 'prose/*' --deep
      marin-data verify corpus/ --manifest-sha256 3f5a...e9 --json > report.json
      marin-data verify /shared/corpus --deep --engine ray --ray-address auto   # on a node of a Ray cluster
      marin-data verify out/sample --remote s3://bucket/sample --endpoint-url http://127.0.0.1:9000
      marin-data verify out/sample --remote hf://datasets/org/sample --endpoint http://127.0.0.1:8080
      marin-data verify /data/store --subset 'cluster=*/quality=4' --expect-bos 128000
      marin-data verify s3://bucket/store --endpoint-url http://127.0.0.1:9000 --deep --tokenizer gpt2
      marin-data verify s3://bucket/pinned-store --remote --deep --endpoint-url http://127.0.0.1:9000
      marin-data verify s3://bucket/pinned-store --remote --deep --engine ray --ray-address auto --workers 64
      marin-data verify s3://bucket/sample --remote --endpoint-url https://storage.googleapis.com   # GCS (HMAC keys)
    """
    check_sha256(manifest_sha256)
    if remote is not None:
        report = _verify_remote(corpus, remote, subsets=subsets, workers=workers, deep=deep, tokenizer=tokenizer,
                                expect_bos=expect_bos, manifest_sha256=manifest_sha256, engine=engine,
                                ray_address=ray_address, endpoint_url=endpoint_url, profile=profile,
                                anonymous=anonymous, requester_pays=requester_pays, endpoint=endpoint, token=token)
    else:
        from marin_data.formats import open_source
        from marin_data.formats.corpus import verify_folder

        options = source_options(corpus, endpoint_url, profile, anonymous, requester_pays, endpoint, token)
        checks = {"subsets": subsets, "workers": workers, "deep": deep, "tokenizer": tokenizer,
                  "expect_bos": expect_bos, "manifest_sha256": manifest_sha256, "engine": engine,
                  "engine_address": ray_address}
        with usage_errors():
            if is_url(corpus) or Path(corpus).is_dir():
                report = open_source(corpus, **options).verify(**checks)
            else:  # no folder: the corpus check names what is missing
                report = verify_folder(corpus, options, **checks)
    echo(json.dumps(report.to_json(), indent=2) if as_json else _human(report))
    if not report.ok:
        raise VerificationFailedError(f"{plural(len(report.problems), 'problem')} found in {corpus}",
                                      problems=list(report.problems))


def _verify_remote(corpus: str, remote: str, *, subsets: tuple[str, ...], workers: int | None, deep: bool,
                   tokenizer: str | None, expect_bos: int | None, manifest_sha256: str | None, engine: str,
                   ray_address: str | None, endpoint_url: str | None, profile: str | None, anonymous: bool,
                   requester_pays: bool, endpoint: str | None, token: str | None) -> VerifyReport:
    """``verify LOCAL --remote URL``: the published copy against LOCAL's manifest; ``verify PIN --remote``: the
    pin against the store holding its data (`Source.verify_remote`)."""
    from marin_data.formats import open_source

    if tokenizer or expect_bos is not None:
        raise click.UsageError("--tokenizer and --expect-bos apply to Levanter caches")
    if remote and is_url(corpus):
        raise click.UsageError(f"{corpus} is a published marin corpus: verify a local copy, or compare one with "
                               "it (verify LOCAL --remote URL), or check it where it is (verify URL --remote)")
    if (engine != "local" or ray_address) and not deep:
        raise click.UsageError("--engine ray runs the re-hashing of --remote --deep; plain --remote asks the "
                               "store's checksums from here")
    kwargs = engine_kwargs(engine, ray_address)
    with usage_errors():
        if remote:
            opened = remote_options(remote, endpoint_url, profile, anonymous, requester_pays, endpoint, token)
            return open_source(corpus).verify_remote(remote, options=opened, subsets=subsets, workers=workers,
                                                     deep=deep, manifest_sha256=manifest_sha256, **kwargs)
        opened = source_options(corpus, endpoint_url, profile, anonymous, requester_pays, endpoint, token)
        return open_source(corpus, **opened).verify_remote(subsets=subsets, workers=workers, deep=deep,
                                                           manifest_sha256=manifest_sha256, **kwargs)


def _human(report: VerifyReport) -> str:
    width = max([len(p.kind.value) for p in report.problems] + [len("partial")])
    lines = [f"{p.kind.value:<{width}}  {printable(p.path)}  {printable(p.message)}" for p in report.problems]
    lines += [f"{'partial':<{width}}  {printable(p)}  leftover of an interrupted write: not a failure, safe to delete "
              f"when no marin-data process is writing" for p in report.partial_files]
    lines += [f"{'ignored':<{width}}  {what}  {why}: not part of the corpus, not checked"
              for what, why in skipped_groups(report.ignored)]
    deep = " deep," if report.deep else ""
    downloaded = " (those downloaded here)" if report.scope == SCOPE_DOWNLOADED else ""
    rate = (f"{human_bytes(report.bytes_checked)} in {report.seconds:.2f}s ({human_bytes(report.bytes_per_second)}/s, "
            f"{plural(report.workers, 'worker')})" if report.bytes_checked else f"in {report.seconds:.2f}s")
    lines.append(
        f"{'OK' if report.ok else 'FAILED'}:{deep} {plural(report.files_checked, 'file')}, {rate}, "
        f"{plural(len(report.subsets), 'subset')}{downloaded}; "
        + (f"manifest sha256 {report.manifest_sha256}" if report.manifest_sha256 else
           f"not pinned: structure checked, files re-hashed against {CHECKED} (`marin-data adopt` pins it)"
           if report.recorded else "not pinned: structure checked, no hashes (`marin-data adopt` pins it)")
    )
    return "\n".join(lines)
