"""``marin-data datasheet``: document a corpus from its data (library: `marin_data.docs.write`)."""

from __future__ import annotations

from pathlib import Path

import click

from marin_data.docs.stats import SCAN_TOKENS
from marin_data.docs.write import write_datasheet
from marin_data.ui import echo

__all__ = ["command"]


@click.command("datasheet")
@click.argument("corpus", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--meta", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="META.yaml",
              help="Curated answers (sources, collection, filtering, uses, maintainers...). Without it every "
                   "question is marked 'Not answered.' (a `marin-data sample` corpus uses the answers shipped "
                   "for it).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Write the outputs under DIR (same layout) and leave the corpus untouched.")
@click.option("--strict", is_flag=True,
              help="Fail (exit 11, nothing written) while any question is unanswered, listing them.")
@click.option("--scan-tokens", type=click.IntRange(min=0), default=SCAN_TOKENS, show_default=True, metavar="N",
              help="Per-subset budget of tokens decoded for document-length percentiles; larger subsets are "
                   "measured on evenly spread shards and labelled so. 0 scans everything.")
def command(corpus: Path, meta: Path | None, out: Path | None, strict: bool, scan_tokens: int) -> None:
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
      marin-data datasheet corpus/ --meta meta.yaml --strict      # refuse while answers are missing
    """
    result = write_datasheet(corpus, meta=meta, out=out, strict=strict, scan_tokens=scan_tokens)
    for rel in result.written:
        echo(f"wrote      {result.dest / rel}")
    for rel in result.unchanged:
        echo(f"unchanged  {result.dest / rel}")
    where = "listed in the corpus manifest" if result.in_corpus else "outside the corpus (--out)"
    echo(f"card, croissant.json and figures: {where}")
    echo(f"manifest sha256 (stated in the datasheet): {result.manifest_sha256}")
    if result.unanswered:
        echo(f"{len(result.unanswered)} question(s) not answered (marked in the datasheet): "
             f"{', '.join(result.unanswered)}", err=True)
    echo(f"datasheet: {result.datasheet}")
