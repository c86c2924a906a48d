"""``marin-data convert``: a Levanter cache or store into a Parquet corpus, or a corpus into a store of caches
(library: the source `marin_data.formats.open_source` opens, its ``convert``)."""

from __future__ import annotations

from pathlib import Path

import click

from marin_data.cli._engine_options import engine_kwargs, engine_options
from marin_data.cli._hf_options import hf_options
from marin_data.cli._store_options import check_sha256, is_url, source_options, store_options, usage_errors
from marin_data.cli.shard import TokenCount
from marin_data.corpus.build import DEFAULT_SHARD_TOKENS
from marin_data.formats.base import LEVANTER, MARIN, TARGETS
from marin_data.ui import echo, format_table, human_bytes, plural

__all__ = ["command"]


@click.command("convert")
@click.argument("source", metavar="SOURCE")
@click.option("--to", "dest", required=True, type=click.Path(file_okay=False, path_type=Path), metavar="DEST",
              help="Where to write: a corpus (created, or an existing one of the same tokenizer gaining the "
                   "subsets) for --format marin; a store of caches, DEST/<subset>/, for --format levanter.")
@click.option("--format", "format_", required=True, type=click.Choice(TARGETS),
              help="What to write: marin (a Parquet corpus, from a Levanter cache or store) or levanter (a store "
                   "of Levanter caches, from a corpus).")
@click.option("--subset", "subsets", multiple=True, metavar="NAME",
              help="Cells of a store, or subsets of a corpus: names, globs ('cluster=*/quality=4') or parents; "
                   "repeatable. Default: all.")
@click.option("--tokenizer", metavar="TOK",
              help="marin, from a cache not pinned: the tokenizer it was built with (a tokenizer.json path or a "
                   "Hugging Face repo id; default: the one its ledgers name, when it is on this machine); a pinned "
                   "cache has its own.")
@click.option("--name", metavar="NAME", help="marin, from a single cache: its subset (default: its folder's name).")
@click.option("--license", "license_", metavar="SPDX",
              help="marin: the license of each new subset (default: a pinned source's own, else unknown).")
@click.option("--shard-tokens", type=TokenCount(), metavar="N",
              help=f"marin: most tokens per shard (suffixes K, M, G, Ki, Mi, Gi; default {DEFAULT_SHARD_TOKENS:,}).")
@click.option("--token-dtype", type=click.Choice(["int32", "int64"]),
              help="levanter: the token values' type (default int32).")
@click.option("--codec", type=click.Choice(["lz4", "zstd"]),
              help="levanter: blosc lz4 clevel 5 (the default: every Levanter reads it) or zstd clevel 1 (what "
                   "Levanter 0.2.227 and later write; older ones cannot open it).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Cells or subsets converted at once, one thread each, each holding a chunk file's tokens "
                   "(at Levanter's grid 0.5 GiB of int32, 1.5 GiB of int64 to marin). Default: one per available "
                   "core.")
@click.option("--manifest-sha256", metavar="HEX", help="A corpus or a pinned cache: refuse a manifest with another "
                                                        "sha256.")
@engine_options
@store_options
@hf_options
def command(source: str, dest: Path, format_: str, subsets: tuple[str, ...], tokenizer: str | None, name: str | None,
            license_: str | None, shard_tokens: int | None, token_dtype: str | None, codec: str | None,
            workers: int | None, manifest_sha256: str | None, engine: str, ray_address: str | None,
            endpoint_url: str | None, profile: str | None, anonymous: bool, requester_pays: bool,
            endpoint: str | None, token: str | None) -> None:
    """Convert SOURCE to the other format, every document the same tokens in the same order.

    --format marin: SOURCE is a Levanter cache or a store of them (cluster=3/quality=4 folders; either
    layout, int32 or int64, lz4 or zstd), a local folder, s3://bucket/prefix or hf://datasets/org/name, or a
    pinned one on local disk. Each cell becomes a subset of the corpus DEST: its rows in order, id
    <subset>:<row>, in shards of the usual size, with manifest, shards.parquet and SHA256SUMS that
    `marin-data verify` checks. The structural checks (as `verify` runs them) come first, and every token
    id must lie inside the tokenizer's vocabulary: a cache that fails is refused, the corpus left as it was.

    --format levanter: SOURCE is a local corpus (download a published one first). Each subset becomes the
    consolidated cache DEST/<subset>/ that Levanter's TreeCache.load opens, its ledger naming the tokenizer
    and vocabulary in preprocessor_metadata; every shard is checked against its SHA-256 first.

    --engine ray (marin, from a cache or store nobody pinned, local or s3:// or hf://): each cell is a Ray
    task on a local Ray instance or the cluster --ray-address names, --workers at once, retried when its
    worker dies; every task opens the source itself and writes under DEST, which every node must see at the
    same path. The corpus is byte for byte the one --engine local writes.

    A killed run, run again, keeps what it finished (the cells' shards, the whole caches) and redoes the
    rest; nothing unfinished ever lies under a final name, and a subset already converted is left alone.

    \b
    EXAMPLES
      marin-data convert /data/marin-store --to corpus --format marin --tokenizer meta-llama/Llama-3.1-8B
      marin-data convert s3://bucket/store --endpoint-url http://127.0.0.1:9000 --subset 'cluster=*/quality=4' \\
          --to q4 --format marin --tokenizer ./llama3/tokenizer.json --workers 8
      marin-data convert s3://bucket/store --subset 'cluster=*/quality=4' --to /shared/q4 --format marin \\
          --tokenizer ./llama3/tokenizer.json --engine ray --ray-address auto --workers 64
      marin-data convert ./fineweb-edu/train --to corpus --format marin --tokenizer gpt2 --name fineweb-edu
      marin-data convert out/sample --to out/sample-caches --format levanter
      marin-data convert corpus --subset pretrain --to caches --format levanter --token-dtype int64 --codec zstd
      marin-data adopt out/sample-caches --tokenizer out/sample/tokenizer.json   # pin the caches in place
    """
    from marin_data.formats import open_source

    check_sha256(manifest_sha256)
    if is_url(source) and format_ == LEVANTER:
        raise click.UsageError("a published corpus is converted from local disk: `marin-data download` the "
                               "subsets you want first (every shard checked), then convert the copy")
    options = source_options(source, endpoint_url, profile, anonymous, requester_pays, endpoint, token)
    if not is_url(source):
        if options:
            raise click.UsageError("the store options apply to s3:// and hf:// sources only")
        if not Path(source).is_dir():
            raise click.UsageError(f"{source!r} is no folder (a remote source is named s3://... or hf://...)")
    given = {"--tokenizer": tokenizer, "--name": name, "--license": license_, "--shard-tokens": shard_tokens,
             "--token-dtype": token_dtype, "--codec": codec}
    other = ("--token-dtype", "--codec") if format_ == MARIN else ("--tokenizer", "--name", "--license",
                                                                    "--shard-tokens")
    wrong = [flag for flag in other if given[flag] is not None]
    if engine != "local" and format_ == LEVANTER:
        wrong.append("--engine ray")
    if wrong:
        raise click.UsageError(f"{', '.join(wrong)} {'applies' if len(wrong) == 1 else 'apply'} to the other "
                               f"direction, not --format {format_}")
    with usage_errors():
        found = open_source(source, **options)
        if format_ == MARIN:
            tokenizer, said = found.tokenizer_for(tokenizer)
            if said:
                echo(said, err=True)
        report = found.convert(
            to=format_, dest=dest, subsets=subsets, tokenizer=tokenizer, name=name, license=license_,
            shard_tokens=shard_tokens or DEFAULT_SHARD_TOKENS, dtype=token_dtype or "int32", codec=codec,
            workers=workers, manifest_sha256=manifest_sha256, **engine_kwargs(engine, ray_address))
    echo(summary(report))


def summary(report) -> str:
    """What was converted, what was already there, and the corpus's new manifest sha256."""
    unit = "shard" if report.format == MARIN else "chunk file"
    lines = [f"converted {plural(len(report.subsets), 'subset')} of {report.source} into {report.dest} "
             f"({report.format}) in {report.seconds:.1f}s"]
    if report.subsets:
        rate = report.tokens / report.seconds if report.seconds else 0
        lines += ["", format_table(["documents", "tokens", f"{unit}s", "bytes", "tokens/s"],
                                   [[f"{report.docs:,}", f"{report.tokens:,}", f"{report.files:,}",
                                     human_bytes(report.bytes), f"{rate:,.0f}"]])]
    if report.reused:
        lines.append(f"already converted, left as they are: {', '.join(report.reused)}")
    if report.empty:
        lines.append(f"cells without documents, not converted (a subset holds at least one shard): "
                     f"{', '.join(report.empty)}")
    if report.manifest_sha256:
        lines += ["", f"manifest sha256  {report.manifest_sha256}"]
    return "\n".join(lines)
