"""``marin-data publish``: upload a corpus to S3 with full-object SHA-256s, or to a Hugging Face repo (library:
`marin_data.transfer.publish_s3`, `marin_data.transfer.publish_hf`)."""

from __future__ import annotations

from pathlib import Path

import click

from marin_data.cli._hf_options import check_hf_flags, hf_options
from marin_data.cli._store_options import show_retries, store_kwargs, store_options
from marin_data.layout import MANIFEST
from marin_data.formats import refuse_unpinned
from marin_data.transfer.publish_s3 import publish
from marin_data.ui import echo, human_bytes, plural

__all__ = ["command"]


@click.command("publish")
@click.argument("corpus", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--to", "to", required=True, metavar="URL",
              help="Where to publish: s3://bucket/prefix or hf://datasets/org/name.")
@store_options
@hf_options
@click.option("--s3-compat", is_flag=True,
              help="For S3-compatible stores that reject the newer checksum headers: send none and keep "
                   "each file's SHA-256 in its 'sha256' user metadata only.")
@click.option("--workers", type=click.IntRange(min=1), default=8, show_default=True,
              help="Files uploaded in parallel.")
def command(corpus: Path, to: str, endpoint_url: str | None, profile: str | None, anonymous: bool,
            requester_pays: bool, endpoint: str | None, token: str | None, s3_compat: bool, workers: int) -> None:
    """Upload CORPUS to a bucket, each file in one PUT carrying its SHA-256, manifest.json last.

    The store then keeps a full-object SHA-256 of every file, so `marin-data verify --remote` and
    downloads can check it without trusting anyone's word. Files already there with the same size and
    SHA-256 are skipped (re-running resumes). Files over 5 GiB are refused before anything is sent.
    Once the store's own checksums match, the place is recorded in CORPUS/mirrors.json (the datasheet
    lists it); manifest.json never changes, so its sha256, printed at the end, is the root of trust users
    pin with --manifest-sha256 on every mirror. A corpus too big for one Hub repo goes to org/name,
    org/name-part2... as its manifest assigns the subsets. A pin kept apart from its data (`adopt
    --pin-to`) is refused (exit 2): its shards are elsewhere; copy its files to move the pin.

    \b
    EXAMPLES
      marin-data publish out/sample --to s3://my-bucket/marin/sample
      marin-data publish corpus/ --to s3://bkt/c --endpoint-url http://127.0.0.1:9000 --s3-compat
      marin-data publish corpus/ --to s3://bkt/c --profile prod --workers 32
      marin-data publish corpus/ --to hf://datasets/my-org/corpus            # HF: LFS sha256 per file
      marin-data publish corpus/ --to hf://datasets/team/c --endpoint http://mirror:8080 --token T
    """
    if not (corpus / MANIFEST).exists():  # a Levanter cache is published once pinned; anything else: as before
        refuse_unpinned(corpus, "publish uploads each file with its SHA-256")
    if check_hf_flags(to, endpoint, token, **{"--endpoint-url": endpoint_url, "--profile": profile,
                                               "--anonymous": anonymous, "--requester-pays": requester_pays,
                                               "--s3-compat": s3_compat}):
        from marin_data.transfer.publish_hf import publish_hf

        report = publish_hf(corpus, to=to, endpoint=endpoint, token=token, workers=workers)
        echo(f"Published {corpus} to {', '.join(report.repos)}: {plural(len(report.uploaded), 'file')} "
             f"uploaded ({human_bytes(report.bytes_uploaded)} in {report.seconds:.1f}s, "
             f"{plural(report.commits, 'commit')}), {len(report.skipped)} already there.")
        echo(f"manifest sha256: {report.manifest_sha256}")
        return
    if anonymous:
        raise click.UsageError("--anonymous cannot publish: uploads need credentials")
    show_retries()
    report = publish(corpus, to=to, workers=workers, s3_compat=s3_compat,
                     **store_kwargs(endpoint_url, profile, anonymous, requester_pays))
    rate = report.bytes_uploaded / report.seconds if report.seconds else 0.0
    echo(f"Published {corpus} to {report.url}: {plural(len(report.uploaded), 'file')} uploaded "
         f"({human_bytes(report.bytes_uploaded)} in {report.seconds:.1f}s, {human_bytes(rate)}/s), "
         f"{len(report.skipped)} already there.")
    echo(f"manifest sha256: {report.manifest_sha256}")
