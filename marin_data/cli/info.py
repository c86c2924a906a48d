"""``marin-data info``: a corpus's subsets, totals, tokenizer and manifest sha256 (library:
`marin_data.corpus.info`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from marin_data.corpus.info import corpus_info

__all__ = ["command"]


@click.command("info")
@click.argument("corpus", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
def command(corpus: Path, as_json: bool) -> None:
    """Show what CORPUS holds: per subset its documents, tokens, shards, bytes and license, the totals,
    the tokenizer, and the sha256 of manifest.json (the value to pin with --manifest-sha256).

    It reads only manifest.json and shards.parquet, checking that they agree; `marin-data verify`
    checks the shards' bytes.

    \b
    EXAMPLES
      marin-data info out/sample
      marin-data info out/sample --json | jq .total.tokens
    """
    info = corpus_info(corpus)
    click.echo(json.dumps(info.to_json(), indent=2) if as_json else str(info))
