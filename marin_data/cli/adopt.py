"""``marin-data adopt``: pin a Levanter cache or store in place (library: the source
`marin_data.formats.open_source` opens, its ``adopt``)."""

from __future__ import annotations

from pathlib import Path

import click

from marin_data.cli._store_options import usage_errors
from marin_data.corpus.foreign import skipped_note
from marin_data.ui import echo, human_bytes, plural, printable

__all__ = ["command"]

SHOWN = 10  # files first seen locally named in the summary


@click.command("adopt")
@click.argument("path", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--tokenizer", required=True, metavar="TOK",
              help="The tokenizer the cache was built with: a tokenizer.json path or a Hugging Face repo id.")
@click.option("--name", metavar="NAME", help="The corpus's name (default: the folder's); for one cache, its subset's.")
@click.option("--tokenizer-name", metavar="NAME",
              help="The tokenizer's name in the manifest (default: the one the caches' ledgers all record, else "
                   "the --tokenizer folder's or repo id).")
@click.option("--license", "license_", default="unknown", show_default=True, metavar="SPDX",
              help="The license recorded for every subset the --meta file gives none.")
@click.option("--meta", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="META.yaml",
              help="A datasheet metadata file (as `marin-data datasheet --meta` takes); under subsets, each "
                   "cell's license (an SPDX id) and description, recorded in the manifest, card and croissant.json.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Hashing threads (default: one per core).")
def command(path: Path, tokenizer: str, tokenizer_name: str | None, name: str | None, license_: str,
            meta: Path | None, workers: int | None) -> None:
    """Pin the Levanter cache or store of caches at PATH in place, so that it becomes a marin corpus.

    After the structural checks (as `marin-data verify PATH` runs them), every file is hashed and listed in
    shards.parquet and SHA256SUMS, and manifest.json, tokenizer.json, the card (README.md) and croissant.json
    are written beside the cache's files. No Levanter file is changed: Levanter still loads it. A store's
    subsets are its cache folders (cluster=3/quality=4); one cache is one subset. Then verify, publish,
    download --subset and serve work on it as on any corpus. The tokenizer's name is the one the caches'
    ledgers record (Levanter's preprocessor_metadata), unless --tokenizer-name says otherwise; the output
    says which name was taken and from where. Other tools' bookkeeping (the .cache/huggingface/ folder of
    `hf download --local-dir`, Marin's executor's .executor_info and .executor_status) is left in place,
    not pinned, and said so on stderr. A copy `marin-data download` made unpinned is checked against its
    record (.marin-checked.json): a file changed since refuses the pin, and vouched.json says per file
    whether its digest was checked against the source or first seen locally.

    \b
    EXAMPLES
      marin-data adopt /data/marin-store --tokenizer meta-llama/Llama-3.1-8B --name marin-store
      marin-data adopt ./fineweb-edu-10B/train --tokenizer ./llama3/tokenizer.json --license odc-by
      marin-data adopt /data/marin-store --tokenizer ./llama3 --tokenizer-name meta-llama/Llama-3.1-8B --meta meta.yaml
      marin-data verify /data/marin-store && marin-data publish /data/marin-store --to s3://bucket/store
    """
    from marin_data.formats import open_source

    with usage_errors():
        report = open_source(path).adopt(tokenizer=tokenizer, name=name, license=license_, workers=workers,
                                         tokenizer_name=tokenizer_name, meta=meta)
    echo(f"tokenizer name: {report.tokenizer} ({report.tokenizer_from})")
    how = f"hashed in {report.seconds:.2f}s" if report.seconds is not None else "hashed by the run that was stopped"
    note = skipped_note(report.skipped, "left in place, not pinned")
    if note:
        echo(note, err=True)
    echo(f"pinned {plural(len(report.subsets), 'subset')}, {plural(report.files, 'file')}, "
         f"{human_bytes(report.bytes)} {how}; manifest sha256 {report.manifest_sha256}")
    if report.seconds is None:
        return
    by = "".join(f", {n} by {a}" for a, n in sorted(report.checked.items()))
    echo(f"digests: {sum(report.checked.values())} checked against the source{by}; "
         f"{len(report.first_seen)} first seen locally")
    for p in report.first_seen[:SHOWN]:
        echo(f"  first seen locally: {printable(p)}")
    if len(report.first_seen) > SHOWN:
        echo(f"  ... and {len(report.first_seen) - SHOWN} more first seen locally")
