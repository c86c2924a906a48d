"""``marin-data download``: fetch chosen subsets, verified and resumable (library: the source
`marin_data.formats.open_for_download` opens, its ``download``)."""

from __future__ import annotations

from pathlib import Path

import click

from marin_data.cli._hf_options import check_hf_flags, hf_options
from marin_data.cli._store_options import check_s3_flags, check_sha256, data_of, show_retries, store_kwargs, \
    store_options, usage_errors
from marin_data.transfer.fetch import PART_BYTES
from marin_data.ui import echo

__all__ = ["command"]


@click.command("download")
@click.argument("source", metavar="SOURCE")
@click.option("--subset", "subsets", multiple=True, metavar="NAME_OR_GLOB",
              help="Subsets to fetch (repeatable; names, globs or parent paths). Default: all.")
@click.option("--to", "dest", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Local directory to download into (created if needed; re-running resumes).")
@click.option("--mirror", "mirrors", multiple=True, metavar="URL",
              help="A fallback copy (s3:// or hf:// URL, or local path), tried when SOURCE fails a file. "
                   "Repeatable.")
@click.option("--manifest-sha256", metavar="HEX",
              help="Refuse any manifest.json but the one with this sha256 (the published root of trust).")
@click.option("--workers", type=click.IntRange(min=1), default=8, show_default=True,
              help="Files (or byte ranges of big files, see --part-mb) fetched in parallel.")
@click.option("--part-mb", type=click.IntRange(min=0), default=PART_BYTES >> 20, show_default=True,
              help="With fewer large files left than --workers (a subset of a few big shards), fetch each file "
                   "of at least twice this many MiB as parallel byte ranges of at least this size. 0: one GET "
                   "per file always (for servers that serve ranges slowly).")
@click.option("--dry-run", is_flag=True, help="Print the files, bytes and tokens it would fetch; fetch nothing.")
@store_options
@hf_options
def command(source: str, subsets: tuple[str, ...], dest: Path, mirrors: tuple[str, ...],
            manifest_sha256: str | None, workers: int, part_mb: int, dry_run: bool, endpoint_url: str | None,
            profile: str | None, anonymous: bool, requester_pays: bool, endpoint: str | None,
            token: str | None) -> None:
    """Download subsets of the corpus at SOURCE (s3://bucket/prefix, hf://datasets/org/name[@rev] or a
    local corpus) into --to DIR.

    Reads manifest.json first (checked against --manifest-sha256), resolves --subset from it, then fetches
    the metadata files (card, Croissant file, datasheet and figures among them, whatever subsets are
    chosen) and the chosen subsets' shards in parallel, checking each file's size and SHA-256
    before it gets its final name. Interrupted files resume where they stopped, also after a crash;
    files already there and verified are not fetched again. A subset of a few big shards is fetched in
    parallel byte ranges (--part-mb). Transient failures are retried with backoff,
    then the next --mirror is tried. DIR keeps manifest.json verbatim and records the fetched subsets in
    DIR/.marin-download.json, so `marin-data verify DIR` checks exactly what was fetched.
    A Levanter cache or store that nothing pins (no manifest.json) is fetched cell by cell, each file
    checked against every digest the store keeps (S3 checksums and MD5 ETags, GCS x-goog-hash, Hub LFS
    sha256), else by its size (those are named), recorded in DIR/.marin-checked.json for verify; then the
    copy's structure is checked; `marin-data adopt DIR` pins it.
    Exit status: 0 all fetched, 1 some files failed (each is listed) or a copied cache is damaged, 2 an
    untrusted manifest.

    \b
    EXAMPLES
      marin-data download s3://my-bucket/marin/sample --subset 'prose/*' --to data/sample
      marin-data download s3://open-data/marin --anonymous --subset pretrain/code --to d --dry-run
      marin-data download s3://bkt/c --manifest-sha256 3f5a...e9 --mirror /mnt/copy --to d --workers 16
      marin-data download s3://bkt/c --subset midtrain/math --to d --workers 16 --part-mb 128  # few big shards
      marin-data download hf://datasets/my-org/corpus --subset pretrain/code --to d --mirror s3://bkt/c
      marin-data download hf://datasets/team/c@main --endpoint http://127.0.0.1:8080 --subset a --to d
      marin-data download s3://bkt/levanter-store --subset 'cluster=*/quality=4' --to cells   # not pinned
      marin-data download ./pin --subset 'cluster=3/*' --to cells --endpoint-url URL  # a pin kept apart: data from
                                                                      # where its manifest says, checked against it
    """
    check_sha256(manifest_sha256)
    urls = [source, *mirrors, *data_of(source)]
    if not any(u.startswith("hf://") for u in urls):
        check_hf_flags(source, endpoint, token)  # --endpoint/--token without any hf:// URL do nothing
    check_s3_flags(urls, endpoint_url, profile, anonymous, requester_pays)
    show_retries()
    hf = {k: v for k, v in {"endpoint": endpoint, "token": token}.items() if v}
    options = {**store_kwargs(endpoint_url, profile, anonymous, requester_pays), **hf}
    from marin_data.formats import open_for_download

    with usage_errors():
        done = open_for_download(source, **options).download(
            subsets=subsets, dest=dest, mirrors=mirrors, manifest_sha256=manifest_sha256, workers=workers,
            part_bytes=part_mb << 20, dry_run=dry_run)
    for line, to_stderr in done.lines:
        echo(line, err=to_stderr)
    if done.error is not None:
        raise done.error
