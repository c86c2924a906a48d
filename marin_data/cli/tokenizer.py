"""``marin-data tokenizer train``: a byte-level BPE from your own text (library: `marin_data.raw.bpe`)."""

from __future__ import annotations

from pathlib import Path

import click

from marin_data.cli.shard import TokenCount
from marin_data.raw.bpe import SPECIAL_TOKENS, train_tokenizer_file
from marin_data.raw.documents import DEFAULT_MAX_DOC_BYTES
from marin_data.ui import echo, plural

__all__ = ["command"]


@click.group("tokenizer")
def command() -> None:
    """Make a tokenizer for `marin-data shard`.

    \b
    EXAMPLES
      marin-data tokenizer train docs/*.jsonl.zst --vocab-size 32000 --out tokenizer.json
    """


@command.command("train")
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("--vocab-size", required=True, type=click.IntRange(min=len(SPECIAL_TOKENS) + 256), metavar="N",
              help="Tokens in the vocabulary, the 256 byte tokens and the special tokens included.")
@click.option("--out", required=True, type=click.Path(path_type=Path), metavar="tokenizer.json",
              help="Where to write it (an existing folder gets FOLDER/tokenizer.json); refused if it exists, "
                   "unless --force.")
@click.option("--text-field", default="text", show_default=True, help="Field (Parquet: column) holding the text.")
@click.option("--skip-bad", is_flag=True, help="Skip malformed records and count them, instead of stopping.")
@click.option("--max-doc-bytes", type=TokenCount(), default=DEFAULT_MAX_DOC_BYTES, show_default=True,
              help="The longest document, in bytes (a suffix such as 8Mi works); a longer one is a bad record.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def train(inputs: tuple[str, ...], vocab_size: int, out: Path, text_field: str, skip_bad: bool,
          max_doc_bytes: int, force: bool) -> None:
    """Train a byte-level BPE tokenizer on the documents of INPUT... and write its tokenizer.json.

    The inputs are what `marin-data shard` reads: .jsonl/.ndjson/.json files, plain or .gz/.zst, .parquet,
    folders and globs. The tokenizer is the kind `marin-data sample` trains: byte-level (any text encodes),
    with <|end_of_text|> (id 0, the EOS shard appends) and <|begin_of_text|> (id 1, for shard --bos).
    Documents stream into the trainer one at a time; the same inputs and tokenizers version give the same
    bytes. The file is written atomically.

    \b
    EXAMPLES
      marin-data tokenizer train docs/*.jsonl.zst --vocab-size 32000 --out tokenizer.json
      marin-data tokenizer train raw/ --text-field content --vocab-size 8192 --out tok/ --force
      marin-data shard docs/*.jsonl.zst --subset docs --tokenizer tokenizer.json --out corpus
    """
    report = train_tokenizer_file(inputs, vocab_size=vocab_size, out=out, text_field=text_field, skip_bad=skip_bad,
                                  max_doc_bytes=max_doc_bytes, force=force)
    skipped = sum(report.skipped.values())
    echo(f"trained a byte-level BPE of {plural(report.vocab_size, 'token')} on "
         f"{plural(report.documents, 'document')} from {plural(report.inputs, 'file')} in {report.seconds:.1f}s"
         + (f" ({plural(skipped, 'bad record')} skipped: "
            f"{', '.join(f'{k} {v}' for k, v in report.skipped.items())})" if skipped else ""))
    echo(f"wrote {report.path} (sha256 {report.sha256})")
