"""``marin-data show``: documents of a subset decoded back to text (library: the source
`marin_data.formats.open_source` opens, its ``show``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from marin_data.cli._hf_options import hf_options
from marin_data.cli._store_options import check_sha256, is_url, source_options, store_options, usage_errors
from marin_data.ui import echo, plural, printable

__all__ = ["command", "TERMINAL_MAX_CHARS"]

# What a terminal shows of each document unless --max-chars says otherwise: a screenful or two. Piped
# output (and --json) is whole by default, as a script or `less` wants it.
TERMINAL_MAX_CHARS = 2_000


@click.command("show")
@click.argument("corpus", metavar="CORPUS|URL")
@click.option("--subset", metavar="NAME", help="The subset (a name, or a pattern matching one); a single Levanter "
                                             "cache has none.")
@click.option("--tokenizer", metavar="TOK", help="A Levanter cache not pinned yet: the tokenizer to decode with "
                                                 "(a tokenizer.json path or a Hub repo id). Default: the one its "
                                                 "ledgers name, when it is on this machine (a path, or in the Hugging "
                                                 "Face cache).")
@click.option("--row", type=click.IntRange(min=0), metavar="N", help="A Levanter cache: show row N instead.")
@click.option("-n", "n", type=click.IntRange(min=1), default=5, show_default=True,
              help="How many documents, from the start of the subset's first shard.")
@click.option("--id", "doc_id", metavar="ID", help="Show the document with this id instead.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per document on stdout.")
@click.option("--max-chars", type=click.IntRange(min=0), metavar="N",
              help=f"Cut each document's text after N characters, marked '… (M more characters)' (with --json: "
                   f"a \"more_chars\" field); 0 shows it whole. Default: {TERMINAL_MAX_CHARS:,} when stdout is a "
                   "terminal, whole when piped or with --json.")
@click.option("--manifest-sha256", metavar="HEX", help="URL only: refuse a manifest with another sha256.")
@store_options
@hf_options
def command(corpus: str, subset: str | None, tokenizer: str | None, row: int | None, n: int, doc_id: str | None,
            as_json: bool, max_chars: int | None, manifest_sha256: str | None, endpoint_url: str | None,
            profile: str | None, anonymous: bool, requester_pays: bool, endpoint: str | None,
            token: str | None) -> None:
    """Decode documents of a subset of CORPUS (a local folder, s3://bucket/prefix or hf://datasets/org/name)
    back to text with the corpus's own tokenizer, as a dataset viewer shows rows.

    A published corpus is not downloaded: its manifest, shard index and tokenizer are read and checked,
    then one shard is read in byte ranges, only the row groups shown (--id searches the subset's shards by
    their id column). Shown bytes are not checked against their SHA-256 (`verify` does that). On a
    terminal each document is cut after 2,000 characters, and says how many more it has (--max-chars).

    \b
    EXAMPLES
      marin-data show out/sample --subset prose/docstrings -n 2
      marin-data show out/sample --subset code/python-stdlib --id 'json/decoder.py' --max-chars 0 | less
      marin-data show s3://open-data/marin --anonymous --subset pretrain/code -n 1 --json
      marin-data show hf://datasets/my-org/corpus --endpoint http://127.0.0.1:8080 --subset a
      marin-data show /data/store --subset cluster=3/quality=4 --tokenizer meta-llama/Llama-3.1-8B -n 2
    """
    from marin_data.formats import open_source

    check_sha256(manifest_sha256)
    options = source_options(corpus, endpoint_url, profile, anonymous, requester_pays, endpoint, token)
    if not is_url(corpus) and not Path(corpus).is_dir():
        raise click.UsageError(f"{corpus!r} is no folder (a published corpus is named s3://... or hf://...)")
    with usage_errors():
        source = open_source(corpus, **options)
        tokenizer, said = source.tokenizer_for(tokenizer)
        if said:
            echo(said, err=True)
        docs = source.show(subset=subset, n=n, doc_id=doc_id, row=row, tokenizer=tokenizer,
                           manifest_sha256=manifest_sha256)
    if max_chars is None:
        max_chars = 0 if as_json or not sys.stdout.isatty() else TERMINAL_MAX_CHARS
    for d in docs:
        more = max(0, len(d.text) - max_chars) if max_chars else 0
        text = d.text[:len(d.text) - more]
        if as_json:
            echo(json.dumps({"id": d.id, "shard": d.shard, "tokens": d.tokens, "text": text,
                             **({"more_chars": more} if more else {})}))
        else:
            cut = f"… ({plural(more, 'more character')}; --max-chars 0 shows them)" if more else ""
            echo(f"== {printable(d.id)}  ({d.tokens:,} tokens, {printable(d.shard)})\n{text}{cut}\n")
