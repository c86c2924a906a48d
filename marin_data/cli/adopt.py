"""``marin-data adopt``: pin a Levanter cache or store in place, or where it lives with the pin elsewhere
(library: the source `marin_data.formats.open_source` opens, its ``adopt``)."""

from __future__ import annotations

from pathlib import Path

import click

from marin_data.cli._engine_options import engine_kwargs, engine_options
from marin_data.cli._hf_options import hf_options
from marin_data.cli._store_options import check_s3_flags, is_url, show_retries, store_kwargs, store_options, \
    usage_errors
from marin_data.corpus.foreign import skipped_note
from marin_data.ui import echo, human_bytes, plural, printable

__all__ = ["command"]

SHOWN = 10  # files first seen locally named in the summary


def _source(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An ``s3://`` or ``hf://`` URL as it is; else an existing folder, as click.Path checks one."""
    if is_url(value):
        return value
    return str(click.Path(file_okay=False, exists=True, path_type=Path).convert(value, param, ctx))


@click.command("adopt")
@click.argument("source", metavar="PATH|URL", callback=_source)
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
@click.option("--pin-to", metavar="DEST",
              help="Write the pin here instead of beside the data: a local folder, s3://bucket/prefix or "
                   "hf://datasets/org/name. It names where the data is; nothing is written under the data's prefix.")
@click.option("--subset", "subsets", multiple=True, metavar="NAME_OR_GLOB",
              help="Pin only these cells (repeatable; names, globs such as 'cluster=*/quality=4', or parent paths). "
                   "A later run with other cells adds them to the pin.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Where a pin bound for s3:// or hf:// is built and its progress kept (default: a folder under "
                   "~/.cache/marin/adopt named after the destination).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Hashing threads (with --engine ray: Ray tasks at once). Default: one per core (16 for a remote "
                   "store: its files are read over the network).")
@engine_options
@store_options
@hf_options
def command(source: str, tokenizer: str, tokenizer_name: str | None, name: str | None, license_: str,
            meta: Path | None, pin_to: str | None, subsets: tuple[str, ...], work_dir: Path | None,
            workers: int | None, engine: str, ray_address: str | None, endpoint_url: str | None,
            profile: str | None, anonymous: bool, requester_pays: bool, endpoint: str | None,
            token: str | None) -> None:
    """Pin the Levanter cache or store of caches at PATH or URL, so that it becomes a marin corpus.

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

    A store on s3:// or hf:// is pinned where it lives: listed once, its cells' structure checked in byte
    ranges, then every file of the chosen cells (--subset) streamed once and hashed (--engine ray: as Ray
    tasks), each checked against every digest the store keeps (S3 ChecksumSHA256/CRC32C and MD5 ETags, GCS
    x-goog-hash, Hub LFS sha256): a file that contradicts one refuses the run and nothing is pinned. The pin
    goes beside the data, or to --pin-to DEST, which records where the data is: `marin-data download DEST`
    fetches the data from there and checks it against the pin, and info, show, datasheet, trace --store, the
    loader and marin-train --data read its cells from there (the store options open the data's store;
    publish refuses such a pin: copy its files to move it). A killed run, run again, hashes only the
    files it had not finished (its progress is kept where the pin is built); a later run with other
    --subset cells adds them to the pin. Exit status: 0 pinned, 2 bad usage or an unsafe listing, 4 another
    pin at DEST, 6 a file contradicts its store's digest or changed since it was pinned, 19-21 a cache
    defect (unreadable, unfinished, inconsistent; also a file whose bytes are not the size the listing gave,
    where download says 1), 7, 8 or 23 the store failed (as download's: keys outside the prefix, a listing
    without end), 13-14 Ray missing or failing.

    \b
    EXAMPLES
      marin-data adopt /data/marin-store --tokenizer meta-llama/Llama-3.1-8B --name marin-store
      marin-data adopt ./fineweb-edu-10B/train --tokenizer ./llama3/tokenizer.json --license odc-by
      marin-data adopt /data/marin-store --tokenizer ./llama3 --tokenizer-name meta-llama/Llama-3.1-8B --meta meta.yaml
      marin-data verify /data/marin-store && marin-data publish /data/marin-store --to s3://bucket/store
      marin-data adopt s3://marin-data/store --tokenizer ./llama3 --pin-to s3://pins/m --subset 'cluster=*/quality=4'
      marin-data adopt s3://marin-data/store --tokenizer ./llama3 --pin-to ./marin-pin --engine ray --ray-address auto
      marin-data adopt hf://datasets/team/store --tokenizer ./llama3 --pin-to ./pin --endpoint http://127.0.0.1:8080
      marin-data download ./marin-pin --subset 'cluster=3/*' --to cells   # fetched from s3://marin-data/store
    """
    from marin_data.formats import open_source

    urls = [source, *([pin_to] if pin_to else [])]
    check_s3_flags(urls, endpoint_url, profile, anonymous, requester_pays)
    if (endpoint or token) and not any(u.startswith("hf://") for u in urls):
        raise click.UsageError("--endpoint and --token apply to hf:// URLs only (S3 takes --endpoint-url, --profile)")
    hf = {k: v for k, v in {"endpoint": endpoint, "token": token}.items() if v}
    options = {**store_kwargs(endpoint_url, profile, anonymous, requester_pays), **hf}
    show_retries()
    with usage_errors():
        report = open_source(source, **options).adopt(
            tokenizer=tokenizer, name=name, license=license_, workers=workers, tokenizer_name=tokenizer_name,
            meta=meta, pin_to=pin_to, subsets=subsets, work_dir=work_dir, **engine_kwargs(engine, ray_address))
    echo(f"tokenizer name: {report.tokenizer} ({report.tokenizer_from})")
    how = f"hashed in {report.seconds:.2f}s" if report.seconds is not None else "hashed by the run that was stopped"
    note = skipped_note(report.skipped, "left in place, not pinned")
    if note:
        echo(note, err=True)
    echo(f"pinned {plural(len(report.subsets), 'subset')}, {plural(report.files, 'file')}, "
         f"{human_bytes(report.bytes)} {how}; manifest sha256 {report.manifest_sha256}")
    if report.data:
        echo(f"pin: {printable(report.root)}; its data: {printable(report.data)} (named in its manifest)")
    if report.read_at:
        echo(f"read at: {printable(report.read_at)} (the commit its listing was taken at; in vouched.json)")
    if report.reused:
        echo(f"{plural(report.reused, 'file')} not hashed again: an earlier run's, or already in the pin")
    if report.seconds is None:
        return
    by = "".join(f", {n} by {a}" for a, n in sorted(report.checked.items()))
    echo(f"digests: {sum(report.checked.values())} checked against the source{by}; "
         f"{len(report.first_seen)} first seen locally")
    for p in report.first_seen[:SHOWN]:
        echo(f"  first seen locally: {printable(p)}")
    if len(report.first_seen) > SHOWN:
        echo(f"  ... and {len(report.first_seen) - SHOWN} more first seen locally")
