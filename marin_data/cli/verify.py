"""``marin-data verify``: re-hash a local corpus against its manifest (library: `marin_data.corpus.verify`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from marin_data.cli._engine_options import engine_kwargs, engine_options
from marin_data.cli._hf_options import check_hf_flags, hf_options
from marin_data.cli._store_options import check_sha256, is_url, store_kwargs, store_options
from marin_data.errors import VerificationFailedError
from marin_data.ui import echo, human_bytes, plural, printable
from marin_data.corpus.verify import FOREIGN_FOLDERS, SCOPE_DOWNLOADED, VerifyReport, verify_corpus

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
                   "Levanter cache: decode every token (ids inside the vocabulary).")
@click.option("--tokenizer", metavar="TOK",
              help="An unpinned Levanter cache: with --deep, token ids must be below this tokenizer's vocabulary.")
@click.option("--expect-bos", type=click.IntRange(min=0), metavar="ID",
              help="A Levanter cache: every non-empty document must start with this token (implies --deep).")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report on stdout.")
@click.option("--manifest-sha256", metavar="HEX",
              help="Refuse the corpus unless manifest.json has this sha256 (the published root of trust).")
@click.option("--remote", metavar="URL",
              help="Instead of re-hashing local files, check that the published copy at URL (s3://bucket/prefix "
                   "or hf://datasets/org/name) holds exactly what CORPUS's manifest lists, from the store's own "
                   "checksums and sizes; no shard data is downloaded.")
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
    folder of a copy made by `hf download --local-dir` (.cache/huggingface/) is skipped, and said so.

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
    """
    check_sha256(manifest_sha256)
    source = None if remote else _levanter_source(corpus, endpoint_url, profile, anonymous, requester_pays,
                                                  endpoint, token)
    if source is not None:
        from marin_data.levanter.verify import verify_source

        kind, options = source
        if kind == "pinned" and tokenizer:
            raise click.UsageError("a pinned cache has its own tokenizer: drop --tokenizer")
        if engine != "local" or ray_address:
            raise click.UsageError("--engine ray checks Parquet corpora; a Levanter cache is checked here")
        vocab = None
        if tokenizer:
            from marin_data.raw.tokenizer import load_tokenizer

            vocab = load_tokenizer(tokenizer).info.vocab_size
        report = verify_source(corpus, subsets=list(subsets) or None, tokens=deep or expect_bos is not None,
                               vocab_size=vocab, expect_bos=expect_bos, manifest_sha256=manifest_sha256,
                               workers=workers, **options)
    elif tokenizer or expect_bos is not None:
        raise click.UsageError("--tokenizer and --expect-bos apply to Levanter caches")
    elif is_url(corpus):
        raise click.UsageError(f"{corpus} is a published marin corpus: verify a local copy, or compare one with "
                               "it (verify LOCAL --remote URL)")
    elif remote is None:
        if endpoint_url or profile or anonymous or requester_pays or endpoint or token:
            raise click.UsageError("store options (--endpoint-url, --endpoint, --token, ...) need --remote URL")
        report = verify_corpus(Path(corpus), subsets=subsets or None, workers=workers, deep=deep,
                               manifest_sha256=manifest_sha256, **engine_kwargs(engine, ray_address))
    else:
        if deep:
            raise click.UsageError("--deep reads shard footers and cannot be combined with --remote")
        if engine != "local" or ray_address:
            raise click.UsageError("--engine ray hashes local files and cannot be combined with --remote")
        from marin_data.transfer.remote_verify import verify_remote

        is_hf = check_hf_flags(remote, endpoint, token, **{"--endpoint-url": endpoint_url, "--profile": profile,
                                                           "--anonymous": anonymous,
                                                           "--requester-pays": requester_pays})
        options = {k: v for k, v in {"endpoint": endpoint, "token": token}.items() if v} if is_hf else \
            store_kwargs(endpoint_url, profile, anonymous, requester_pays)
        report = verify_remote(corpus, remote, subsets=subsets or None, manifest_sha256=manifest_sha256,
                               **({"workers": workers} if workers else {}), **options)
    echo(json.dumps(report.to_json(), indent=2) if as_json else _human(report))
    if not report.ok:
        raise VerificationFailedError(f"{plural(len(report.problems), 'problem')} found in {corpus}",
                                      problems=list(report.problems))


def _levanter_source(corpus: str, endpoint_url, profile, anonymous, requester_pays, endpoint,
                     token) -> tuple[str, dict] | None:
    """("cache"|"pinned", store options) when CORPUS holds Levanter caches, None for a Parquet corpus."""
    from marin_data.cli.info import remote_options
    from marin_data.levanter.detect import CORPUS, detect

    if is_url(corpus):
        options = remote_options(corpus, endpoint_url, profile, anonymous, requester_pays, endpoint, token)
    elif not Path(corpus).is_dir():
        return None  # verify_corpus names what is missing
    else:
        options = {}
    found = detect(corpus, **options)
    if found.kind == CORPUS:
        return ("pinned", options) if found.pinned_cache and not is_url(corpus) else None
    if not is_url(corpus) and (endpoint_url or profile or anonymous or requester_pays or endpoint or token):
        raise click.UsageError("the store options apply to s3:// and hf:// URLs")
    return "cache", options


def _human(report: VerifyReport) -> str:
    width = max([len(p.kind.value) for p in report.problems] + [len("partial")])
    lines = [f"{p.kind.value:<{width}}  {printable(p.path)}  {printable(p.message)}" for p in report.problems]
    lines += [f"{'partial':<{width}}  {printable(p)}  leftover of an interrupted write: not a failure, safe to delete "
              f"when no marin-data process is writing" for p in report.partial_files]
    lines += [f"{'ignored':<{width}}  {p}/  {FOREIGN_FOLDERS[p]}: not part of the corpus, not checked"
              for p in report.ignored]
    deep = " deep," if report.deep else ""
    downloaded = " (those downloaded here)" if report.scope == SCOPE_DOWNLOADED else ""
    rate = (f"{human_bytes(report.bytes_checked)} in {report.seconds:.2f}s ({human_bytes(report.bytes_per_second)}/s, "
            f"{plural(report.workers, 'worker')})" if report.bytes_checked else f"in {report.seconds:.2f}s")
    lines.append(
        f"{'OK' if report.ok else 'FAILED'}:{deep} {plural(report.files_checked, 'file')}, {rate}, "
        f"{plural(len(report.subsets), 'subset')}{downloaded}; "
        + (f"manifest sha256 {report.manifest_sha256}" if report.manifest_sha256 else
           "not pinned: structure checked, no hashes (`marin-data adopt` pins it)")
    )
    return "\n".join(lines)
