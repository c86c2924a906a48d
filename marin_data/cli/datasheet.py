"""``marin-data datasheet``: document a corpus from its data (library: `marin_data.docs.write`)."""

from __future__ import annotations

from pathlib import Path

import click

from marin_data.docs.stats import SCAN_TOKENS
from marin_data.docs.write import write_datasheet
from marin_data.ui import echo, plural

__all__ = ["command"]


@click.command("datasheet")
@click.argument("corpus", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--meta", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="META.yaml",
              help="Curated answers (sources, collection, filtering, uses, maintainers...): a YAML file whose "
                   "keys are the question ids (motivation: {purpose: ...}, subsets: {NAME: {sources: ...}}); "
                   "--meta-template prints one to fill in. Without it every question is marked 'Not "
                   "answered.' (a `marin-data sample` corpus uses the answers shipped for it).")
@click.option("--meta-template", is_flag=True,
              help="Print a --meta file to fill in on stdout and write nothing: every question as a commented "
                   "key (its id, kind of answer and text), with CORPUS's subsets filled in.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Write the outputs under DIR (same layout) and leave the corpus untouched.")
@click.option("--strict", is_flag=True,
              help="Fail (exit 11, nothing written) while any question is unanswered, listing them.")
@click.option("--scan-tokens", type=click.IntRange(min=0), default=SCAN_TOKENS, show_default=True, metavar="N",
              help="Per-subset budget of tokens decoded for document-length percentiles; larger subsets are "
                   "measured on evenly spread shards and labelled so. 0 scans everything.")
def command(corpus: Path, meta: Path | None, meta_template: bool, out: Path | None, strict: bool,
            scan_tokens: int) -> None:
    """Write CORPUS's datasheet, dataset card, Croissant file and figures, computed from its data.

    Outputs: README.md (Hugging Face dataset card), croissant.json (MLCommons Croissant 1.1),
    datasheets/datasheet.md (the seven sections of Datasheets for Datasets) and datasheets/*.png.
    Every number is computed from manifest.json, shards.parquet and the shards; prose answers come from
    --meta. By default they go into the corpus, and the manifest then lists the card, Croissant file and
    figures (its sha256 changes once); the datasheet states that final sha256 and is the one file the
    manifest does not list. Re-running on an unchanged corpus changes nothing.

    \b
    EXAMPLES
      marin-data datasheet out/sample --strict           # the sample's answers ship with marin
      marin-data datasheet out/sample --out datasheets/sample
      marin-data datasheet corpus/ --meta-template > meta.yaml    # every question, to answer in meta.yaml
      marin-data datasheet corpus/ --meta meta.yaml --strict      # refuse while answers are missing
    """
    if meta_template:
        if meta or out or strict:
            raise click.UsageError("--meta-template prints a file to start from: it takes no --meta, --out or "
                                   "--strict")
        from marin_data.corpus.manifest import load_corpus
        from marin_data.docs.questions import meta_template as template

        click.echo(template(load_corpus(corpus).manifest.subsets, corpus=str(corpus)), nl=False)  # names checked
        return
    result = write_datasheet(corpus, meta=meta, out=out, strict=strict, scan_tokens=scan_tokens)
    for rel in result.written:
        echo(f"wrote      {result.dest / rel}")
    for rel in result.unchanged:
        echo(f"unchanged  {result.dest / rel}")
    where = "listed in the corpus manifest" if result.in_corpus else "outside the corpus (--out)"
    echo(f"card, croissant.json and figures: {where}")
    echo(f"manifest sha256 (stated in the datasheet): {result.manifest_sha256}")
    if result.unanswered:
        echo(f"{plural(len(result.unanswered), 'question')} not answered (marked in the datasheet): "
             f"{', '.join(result.unanswered)}", err=True)
    echo(f"datasheet: {result.datasheet}")
