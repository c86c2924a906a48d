"""``marin-data show``: documents of a subset decoded back to text (library: `marin_data.corpus.show`,
`marin_data.transfer.remote_corpus` for a published corpus)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from marin_data.cli._hf_options import hf_options
from marin_data.cli._store_options import check_sha256, is_url, store_options
from marin_data.ui import echo, printable

__all__ = ["command"]


@click.command("show")
@click.argument("corpus", metavar="CORPUS|URL")
@click.option("--subset", required=True, metavar="NAME", help="The subset (a name, or a pattern matching one).")
@click.option("-n", "n", type=click.IntRange(min=1), default=5, show_default=True,
              help="How many documents, from the start of the subset's first shard.")
@click.option("--id", "doc_id", metavar="ID", help="Show the document with this id instead.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per document on stdout.")
@click.option("--manifest-sha256", metavar="HEX", help="URL only: refuse a manifest with another sha256.")
@store_options
@hf_options
def command(corpus: str, subset: str, n: int, doc_id: str | None, as_json: bool, manifest_sha256: str | None,
            endpoint_url: str | None, profile: str | None, anonymous: bool, requester_pays: bool,
            endpoint: str | None, token: str | None) -> None:
    """Decode documents of a subset of CORPUS (a local folder, s3://bucket/prefix or hf://datasets/org/name)
    back to text with the corpus's own tokenizer, as a dataset viewer shows rows.

    A published corpus is not downloaded: its manifest, shard index and tokenizer are read and checked,
    then one shard is read in byte ranges, only the row groups shown (--id searches the subset's shards by
    their id column). Shown bytes are not checked against their SHA-256 (`verify` does that).

    \b
    EXAMPLES
      marin-data show out/sample --subset prose/docstrings -n 2
      marin-data show out/sample --subset code/python-stdlib --id 'json/decoder.py'
      marin-data show s3://open-data/marin --anonymous --subset pretrain/code -n 1 --json
      marin-data show hf://datasets/my-org/corpus --endpoint http://127.0.0.1:8080 --subset a
    """
    check_sha256(manifest_sha256)
    if is_url(corpus):
        from marin_data.cli.info import remote_options
        from marin_data.transfer.remote_corpus import remote_show

        options = remote_options(corpus, endpoint_url, profile, anonymous, requester_pays, endpoint, token)
        docs = remote_show(corpus, subset=subset, n=n, doc_id=doc_id, manifest_sha256=manifest_sha256, **options)
    else:
        if manifest_sha256 or endpoint_url or profile or anonymous or requester_pays or endpoint or token:
            raise click.UsageError("--manifest-sha256 and the store options apply to s3:// and hf:// URLs only")
        if not Path(corpus).is_dir():
            raise click.UsageError(f"{corpus!r} is no folder (a published corpus is named s3://... or hf://...)")
        from marin_data.corpus.show import show_documents

        docs = show_documents(corpus, subset=subset, n=n, doc_id=doc_id)
    for d in docs:
        if as_json:
            echo(json.dumps({"id": d.id, "shard": d.shard, "tokens": d.tokens, "text": d.text}))
        else:
            echo(f"== {printable(d.id)}  ({d.tokens:,} tokens, {printable(d.shard)})\n{d.text}\n")
