"""``marin-data verify``: re-hash a local corpus against its manifest (library: `marin_data.verify`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from marin_data.errors import VerificationFailedError
from marin_data.ui import human_bytes
from marin_data.verify import SCOPE_DOWNLOADED, VerifyReport, verify_corpus

__all__ = ["command"]


@click.command("verify")
@click.argument("corpus", type=click.Path(file_okay=False, path_type=Path))
@click.option("--subset", "subsets", multiple=True, metavar="NAME_OR_GLOB",
              help="Check only these subsets (repeatable; names, globs or parent paths). Default: all (in a "
                   "partial download: the subsets it fetched), plus the metadata files.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Hashing threads. Default: one per available core.")
@click.option("--deep", is_flag=True,
              help="Also read each shard's footer: schema, encodings, tokenizer, document/token counts.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report on stdout.")
@click.option("--manifest-sha256", metavar="HEX",
              help="Refuse the corpus unless manifest.json has this sha256 (the published root of trust).")
def command(corpus: Path, subsets: tuple[str, ...], workers: int | None, deep: bool, as_json: bool,
            manifest_sha256: str | None) -> None:
    """Check that every file of CORPUS holds exactly the bytes its manifest lists.

    Reports each missing, truncated, oversized, modified and unlisted file by path. Exit status: 0 all
    good, 1 problems found, 2 bad usage or a manifest that cannot be trusted (nothing checked).
    Leftover *.part files of interrupted writes are listed but do not fail the check.

    \b
    EXAMPLES
      marin-data verify out/sample
      marin-data verify out/sample --subset 'prose/*' --deep
      marin-data verify corpus/ --manifest-sha256 3f5a...e9 --json > report.json
    """
    if manifest_sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", manifest_sha256.strip()):
        raise click.UsageError(f"--manifest-sha256 must be 64 hex digits, got {manifest_sha256!r}")
    report = verify_corpus(corpus, subsets=subsets or None, workers=workers, deep=deep,
                           manifest_sha256=manifest_sha256)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else _human(report))
    if not report.ok:
        n = len(report.problems)
        raise VerificationFailedError(f"{n} problem{'s' * (n != 1)} found in {corpus}", problems=list(report.problems))


def _human(report: VerifyReport) -> str:
    width = max([len(p.kind.value) for p in report.problems] + [len("partial")])
    lines = [f"{p.kind.value:<{width}}  {p.path}  {p.message}" for p in report.problems]
    lines += [f"{'partial':<{width}}  {p}  leftover of an interrupted write: not a failure, safe to delete "
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
