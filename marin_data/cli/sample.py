"""``marin-data sample``: build the embedded sample corpus offline (library: `marin_data.corpus.sample`)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from marin_data.corpus.sample import DEFAULT_VOCAB_SIZE, build_sample
from marin_data.ui import echo, plural

__all__ = ["command"]


@click.command("sample")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--tokenizer", metavar="TOK",
              help="Use this tokenizer (a tokenizer.json path or a Hugging Face repo id) instead of training one.")
@click.option("--vocab-size", type=click.IntRange(min=300), default=DEFAULT_VOCAB_SIZE, show_default=True,
              help="Vocabulary of the byte-level BPE trained on the sample.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes for sharding. Default: one per available core.")
def command(out: Path, tokenizer: str | None, vocab_size: int, workers: int | None) -> None:
    """Build a real corpus into OUT, offline, from text every Python installation carries.

    Four subsets (~6M tokens): the standard library's modules (code/python-stdlib), their docstrings
    (prose/docstrings), the help() topics (prose/pydoc-topics) and the Unicode character names
    (reference/unicode-names). A byte-level BPE is trained on it unless --tokenizer is given. The same
    Python and tokenizers versions give the same bytes; OUT/sample.json records what it was made from.
    Running it again on OUT finishes an interrupted build, or does nothing.

    \b
    EXAMPLES
      marin-data sample out/sample
      marin-data sample out/sample-llama3 --tokenizer meta-llama/Llama-3.1-8B
    """
    if tokenizer is not None and vocab_size != DEFAULT_VOCAB_SIZE:
        raise click.UsageError("--vocab-size applies to the trained tokenizer; it cannot be used with --tokenizer")
    start = time.perf_counter()
    report = build_sample(out, tokenizer=tokenizer, vocab_size=vocab_size, workers=workers)
    echo(str(report.info))
    done = sum(not r.unchanged for r in report.subsets)
    echo(f"\nbuilt {done} of {plural(len(report.subsets), 'subset')} in {time.perf_counter() - start:.1f}s"
         + (" (tokenizer trained)" if report.trained_tokenizer else ""))
