"""``marin-data info``: a corpus's subsets, totals, tokenizer and manifest sha256, local or published
(library: `marin_data.corpus.info`, `marin_data.transfer.remote_corpus`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from marin_data.cli._hf_options import check_hf_flags, hf_options
from marin_data.cli._store_options import check_sha256, is_url, store_kwargs, store_options
from marin_data.ui import echo

__all__ = ["command", "remote_options"]


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
    check_sha256(manifest_sha256)
    from marin_data.levanter.detect import CORPUS, detect

    if is_url(corpus):
        options = remote_options(corpus, endpoint_url, profile, anonymous, requester_pays, endpoint, token)
    else:
        if manifest_sha256 or endpoint_url or profile or anonymous or requester_pays or endpoint or token:
            raise click.UsageError("--manifest-sha256 and the store options apply to s3:// and hf:// URLs only")
        if not Path(corpus).is_dir():
            raise click.UsageError(f"{corpus!r} is no folder (a published corpus is named s3://... or hf://...)")
        options = {}
    if detect(corpus, **options).kind != CORPUS:  # a Levanter cache or store, not pinned yet
        if manifest_sha256:
            raise click.UsageError("--manifest-sha256 pins a corpus; this Levanter cache has no manifest yet")
        from marin_data.levanter.summary import cache_info

        info = cache_info(corpus, **options)
    elif is_url(corpus):
        from marin_data.transfer.remote_corpus import remote_info

        info = remote_info(corpus, manifest_sha256=manifest_sha256, **options)
    else:
        from marin_data.corpus.info import corpus_info

        info = corpus_info(corpus)
    echo(json.dumps(info.to_json(), indent=2) if as_json else str(info))


def remote_options(url: str, endpoint_url: str | None, profile: str | None, anonymous: bool,
                   requester_pays: bool, endpoint: str | None, token: str | None) -> dict:
    """The store options for ``url``, refusing the flags its kind of store does not take."""
    s3 = {"--endpoint-url": endpoint_url, "--profile": profile, "--anonymous": anonymous,
          "--requester-pays": requester_pays}
    if check_hf_flags(url, endpoint, token, **s3):
        return {k: v for k, v in {"endpoint": endpoint, "token": token}.items() if v}
    return store_kwargs(endpoint_url, profile, anonymous, requester_pays)
