"""``marin-data datasheet``: document a corpus, or a Levanter cache or store, from its data (library:
`marin_data.formats.datasheet`)."""

from __future__ import annotations

from pathlib import Path

import click

from marin_data.cli._hf_options import hf_options
from marin_data.cli._store_options import is_url, local_options, source_options, store_options, usage_errors
from marin_data.docs.stats import SCAN_TOKENS
from marin_data.formats import open_source
from marin_data.ui import echo, plural

__all__ = ["command"]


@click.command("datasheet")
@click.argument("source", metavar="CORPUS|CACHE|URL")
@click.option("--meta", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="META.yaml",
              help="Curated answers (sources, collection, filtering, uses, maintainers...): a YAML file whose "
                   "keys are the question ids (motivation: {purpose: ...}, subsets: {NAME: {sources: ...}}); "
                   "--meta-template prints one to fill in. Without it every question is marked 'Not "
                   "answered.' (a `marin-data sample` corpus uses the answers shipped for it).")
@click.option("--meta-template", is_flag=True,
              help="Print a --meta file to fill in on stdout and write nothing: every question as a commented "
                   "key (its id, kind of answer and text), with the subsets (a store's cells) filled in.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Write the outputs under DIR (same layout) and leave the source untouched; required for a "
                   "Levanter cache not pinned yet.")
@click.option("--strict", is_flag=True,
              help="Fail (exit 11, nothing written) while any question is unanswered, listing them.")
@click.option("--scan-tokens", type=click.IntRange(min=0), default=SCAN_TOKENS, show_default=True, metavar="N",
              help="Per-subset budget of tokens decoded: for document-length percentiles and duplicates (a "
                   "Levanter cache: for duplicates and each cell's first document; its lengths come from its "
                   "offsets, all of them); larger subsets are read on evenly spread files and labelled so. "
                   "0 reads everything.")
@click.option("--tokenizer", metavar="TOK",
              help="A Levanter cache not pinned yet: the tokenizer it was built with (a tokenizer.json path or a "
                   "Hub repo id). Default: the one its ledgers name, when it is on this machine (a path, or in "
                   "the Hugging Face cache).")
@store_options
@hf_options
def command(source: str, meta: Path | None, meta_template: bool, out: Path | None, strict: bool, scan_tokens: int,
            tokenizer: str | None, endpoint_url: str | None, profile: str | None, anonymous: bool,
            requester_pays: bool, endpoint: str | None, token: str | None) -> None:
    """Write the datasheet, dataset card, Croissant file and figures of a corpus, computed from its data.

    Outputs: README.md (Hugging Face dataset card), croissant.json (MLCommons Croissant 1.1),
    datasheets/datasheet.md (the seven sections of Datasheets for Datasets) and datasheets/*.png.
    Every number is computed from manifest.json, shards.parquet and the shards; prose answers come from
    --meta. By default they go into the corpus, and the manifest then lists the card, Croissant file and
    figures (its sha256 changes once, and the command warns that pins of the old digest no longer match); the
    datasheet states that final sha256 and is the one file the manifest does not list. Re-running on an
    unchanged corpus changes nothing.

    A Levanter cache or store pinned with `marin-data adopt` is documented the same way (its card and
    Croissant file are adopt's): its cells as a table (and a cluster x quality heat map of tokens),
    document lengths from its offsets. One not pinned yet (a folder, s3://bucket/prefix or
    hf://datasets/org/name) takes --tokenizer and --out, gets the datasheet and figures, and the
    datasheet says that nothing pins it.

    \b
    EXAMPLES
      marin-data datasheet out/sample --strict           # the sample's answers ship with marin
      marin-data datasheet out/sample --out datasheets/sample
      marin-data datasheet corpus/ --meta-template > meta.yaml    # every question, to answer in meta.yaml
      marin-data datasheet corpus/ --meta meta.yaml --strict      # refuse while answers are missing
      marin-data datasheet /data/store                   # a store pinned with `marin-data adopt`
      marin-data datasheet s3://bucket/store --endpoint-url http://127.0.0.1:9000 \\
          --tokenizer meta-llama/Llama-3.1-8B --out sheets/store
    """
    options = source_options(source, endpoint_url, profile, anonymous, requester_pays, endpoint, token)
    local_options(source, options, "the store options")
    if not is_url(source) and not Path(source).is_dir():
        raise click.UsageError(f"{source!r} is no folder (a store is named s3://... or hf://datasets/...)")
    if meta_template:
        if meta or out or strict or tokenizer:
            raise click.UsageError("--meta-template prints a file to start from: it takes no --meta, --out, "
                                   "--strict or --tokenizer")
        from marin_data.docs.questions import meta_template as template

        click.echo(template(open_source(source, **options).datasheet(source).subsets, corpus=source),
                   nl=False)  # names checked
        return
    found = open_source(source, **options)
    sheet = found.datasheet(source)
    with usage_errors():
        tokenizer, said = found.tokenizer_for(tokenizer)
        if said:
            echo(said, err=True)
        sheet.check_options(tokenizer=tokenizer, out=out)
    result = sheet.write(meta=meta, out=out, strict=strict, scan_tokens=scan_tokens, tokenizer=tokenizer)
    for rel in result.written:
        echo(f"wrote      {result.dest / rel}")
    for rel in result.unchanged:
        echo(f"unchanged  {result.dest / rel}")
    if result.manifest_sha256 is None:
        echo("not pinned: no manifest vouches for these bytes, and the datasheet states no sha256; "
             "`marin-data adopt PATH --tokenizer TOK` pins it in place (the card and croissant.json come with it)")
    else:
        where = "listed in the corpus manifest" if result.in_corpus else "outside the corpus (--out)"
        echo(f"card, croissant.json and figures: {where}")
        echo(f"manifest sha256 (stated in the datasheet): {result.manifest_sha256}")
        if result.previous_sha256:
            echo(f"warning: the manifest now lists these files, so its sha256 changed from {result.previous_sha256}; "
                 "a download or verify pinned to that digest refuses this copy: pin the new one", err=True)
    if result.unanswered:
        echo(f"{plural(len(result.unanswered), 'question')} not answered (marked in the datasheet): "
             f"{', '.join(result.unanswered)}", err=True)
    echo(f"datasheet: {result.datasheet}")
