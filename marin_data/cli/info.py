"""``marin-data info``: a corpus's subsets, totals, tokenizer and manifest sha256, local or published, or a
Levanter cache's cells (library: the source `marin_data.formats.open_source` opens, its ``info``)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from marin_data.cli._hf_options import hf_options
from marin_data.cli._store_options import check_sha256, is_url, local_options, source_options, store_options, \
    usage_errors
from marin_data.ui import echo

__all__ = ["command"]


@click.command("info")
@click.argument("corpus", metavar="CORPUS|URL")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
@click.option("--manifest-sha256", metavar="HEX", help="URL only: refuse a manifest with another sha256.")
@store_options
@hf_options
def command(corpus: str, as_json: bool, manifest_sha256: str | None, endpoint_url: str | None,
            profile: str | None, anonymous: bool, requester_pays: bool, endpoint: str | None,
            token: str | None) -> None:
    """Show what CORPUS (a local folder, or a published copy: s3://bucket/prefix, hf://datasets/org/name)
    holds: per subset its documents, tokens, shards, bytes and license, the totals, the tokenizer, and the
    sha256 of manifest.json (the value to pin with --manifest-sha256). A Levanter cache or store of caches
    not pinned yet shows its cells from their ledgers (chunk files counted as shards).

    It reads only manifest.json and shards.parquet, checking that they agree; `marin-data verify`
    checks the shards' bytes.

    \b
    EXAMPLES
      marin-data info out/sample
      marin-data info out/sample --json | jq .total.tokens
      marin-data info s3://open-data/marin --anonymous
      marin-data info hf://datasets/my-org/corpus --endpoint http://127.0.0.1:8080
      marin-data info s3://bucket/levanter-store --endpoint-url http://127.0.0.1:9000
    """
    from marin_data.formats import open_source

    check_sha256(manifest_sha256)
    options = source_options(corpus, endpoint_url, profile, anonymous, requester_pays, endpoint, token)
    if not is_url(corpus):
        if manifest_sha256:
            raise click.UsageError("--manifest-sha256 applies to s3:// and hf:// URLs only")
        local_options(corpus, options, "the store options")
        if not Path(corpus).is_dir():
            raise click.UsageError(f"{corpus!r} is no folder (a published corpus is named s3://... or hf://...)")
    with usage_errors():
        info = open_source(corpus, **options).info(manifest_sha256=manifest_sha256)
    echo(json.dumps(info.to_json(), indent=2) if as_json else str(info))
