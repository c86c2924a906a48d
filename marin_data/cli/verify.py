"""``marin-data verify``: re-hash a local corpus against its manifest (library: `marin_data.corpus.verify`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from marin_data.cli._engine_options import engine_kwargs, engine_options
from marin_data.cli._hf_options import check_hf_flags, hf_options
from marin_data.cli._store_options import check_sha256, store_kwargs, store_options
from marin_data.errors import VerificationFailedError
from marin_data.ui import echo, human_bytes, printable
from marin_data.corpus.verify import SCOPE_DOWNLOADED, VerifyReport, verify_corpus

__all__ = ["command"]


@click.command("verify")
@click.argument("corpus", type=click.Path(file_okay=False, path_type=Path))
@click.option("--subset", "subsets", multiple=True, metavar="NAME_OR_GLOB",
              help="Check only these subsets (repeatable; names, globs or parent paths). Default: all (in a "
                   "partial download: the subsets it fetched), plus the metadata files.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Hashing threads (with --engine ray: Ray tasks at once). Default: one per available core "
                   "(a Ray cluster: all its CPUs).")
@engine_options
@click.option("--deep", is_flag=True,
              help="Also read each shard's footer: schema, encodings, tokenizer, document/token counts.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report on stdout.")
@click.option("--manifest-sha256", metavar="HEX",
              help="Refuse the corpus unless manifest.json has this sha256 (the published root of trust).")
@click.option("--remote", metavar="URL",
              help="Instead of re-hashing local files, check that the published copy at URL (s3://bucket/prefix "
                   "or hf://datasets/org/name) holds exactly what CORPUS's manifest lists, from the store's own "
                   "checksums and sizes; no shard data is downloaded.")
@store_options
@hf_options
def command(corpus: Path, subsets: tuple[str, ...], workers: int | None, deep: bool, as_json: bool,
            manifest_sha256: str | None, engine: str, ray_address: str | None, remote: str | None,
            endpoint_url: str | None, profile: str | None, anonymous: bool, requester_pays: bool,
            endpoint: str | None, token: str | None) -> None:
    """Check that every file of CORPUS holds exactly the bytes its manifest lists.

    Reports each missing, truncated, oversized, modified and unlisted file by path. Exit status: 0 all
    good, 1 problems found, 2 bad usage or a manifest that cannot be trusted (nothing checked).
    Leftover *.part files of interrupted writes are listed but do not fail the check.

    \b
    EXAMPLES
      marin-data verify out/sample
      marin-data verify out/sample --subset 'prose/*' --deep
      marin-data verify corpus/ --manifest-sha256 3f5a...e9 --json > report.json
      marin-data verify /shared/corpus --deep --engine ray --ray-address auto   # on a node of a Ray cluster
      marin-data verify out/sample --remote s3://bucket/sample --endpoint-url http://127.0.0.1:9000
      marin-data verify out/sample --remote hf://datasets/org/sample --endpoint http://127.0.0.1:8080
    """
    check_sha256(manifest_sha256)
    if remote is None:
        if endpoint_url or profile or anonymous or requester_pays or endpoint or token:
            raise click.UsageError("store options (--endpoint-url, --endpoint, --token, ...) need --remote URL")
        report = verify_corpus(corpus, subsets=subsets or None, workers=workers, deep=deep,
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
        n = len(report.problems)
        raise VerificationFailedError(f"{n} problem{'s' * (n != 1)} found in {corpus}", problems=list(report.problems))


def _human(report: VerifyReport) -> str:
    width = max([len(p.kind.value) for p in report.problems] + [len("partial")])
    lines = [f"{p.kind.value:<{width}}  {printable(p.path)}  {printable(p.message)}" for p in report.problems]
    lines += [f"{'partial':<{width}}  {printable(p)}  leftover of an interrupted write: not a failure, safe to delete "
              f"when no marin-data process is writing" for p in report.partial_files]
    deep = " deep," if report.deep else ""
    downloaded = " (those downloaded here)" if report.scope == SCOPE_DOWNLOADED else ""
    lines.append(
        f"{'OK' if report.ok else 'FAILED'}:{deep} {report.files_checked} files, {human_bytes(report.bytes_checked)} "
        f"in {report.seconds:.2f}s ({human_bytes(report.bytes_per_second)}/s, {report.workers} workers), "
        f"{len(report.subsets)} subset{'s' * (len(report.subsets) != 1)}{downloaded}; "
        f"manifest sha256 {report.manifest_sha256}"
    )
    return "\n".join(lines)
