"""``marin-data shard``: tokenize raw documents into a subset of a corpus (library: `marin_data.corpus.build`)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from marin_data.cli._engine_options import engine_kwargs, engine_options
from marin_data.corpus.build import DEFAULT_SHARD_TOKENS, ShardReport, shard_subset
from marin_data.corpus.names import check_subset_name
from marin_data.errors import InvalidManifestError
from marin_data.raw.documents import DEFAULT_MAX_DOC_BYTES
from marin_data.ui import echo, format_table, human_bytes, plural

__all__ = ["command"]

_SCALE = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "KI": 2**10, "MI": 2**20, "GI": 2**30}


class TokenCount(click.ParamType):
    """A positive count with an optional suffix: 500000, 250K, 256Mi, 1G."""

    name = "N"

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        if isinstance(value, int):
            return value
        m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?)?\s*", str(value), re.IGNORECASE)
        if not m or int(m.group(1)) == 0:
            self.fail(f"{value!r} is not a positive count such as 500000, 250K, 256Mi or 1G", param, ctx)
        return int(m.group(1)) * _SCALE[(m.group(2) or "").upper()]


def _subset_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        check_subset_name(value, "--subset")
    except InvalidManifestError as e:
        raise click.BadParameter(f"{value!r}: use letters, digits, '.', '_', '-', with '/' between parts") from e
    return value


@click.command("shard")
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("--subset", required=True, callback=_subset_name, help="The subset to create, e.g. pretrain/dclm.")
@click.option("--tokenizer", required=True, metavar="TOK",
              help="A tokenizer.json path (or its directory), or a Hugging Face repo id (uses HF_ENDPOINT).")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), metavar="CORPUS",
              help="The corpus directory (created if needed).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes (with --engine ray: Ray tasks at once). Default: one per available core "
                   "(a Ray cluster: all its CPUs).")
@engine_options
@click.option("--text-field", default="text", show_default=True, help="Field (Parquet: column) holding the text.")
@click.option("--id-field", default="id", show_default=True,
              help="Field holding the document id; records without one get FILE:LINE.")
@click.option("--tokenizer-name", metavar="NAME",
              help="The tokenizer's name in a new corpus's manifest and datasheet (default: the repo id, or the "
                   "folder holding tokenizer.json; a file in the Hugging Face cache gets its repo id).")
@click.option("--bos", "add_bos", is_flag=True, help="Prepend BOS to every document (EOS is always appended).")
@click.option("--eos-token", metavar="TEXT", help="The EOS token, if the tokenizer marks none special.")
@click.option("--bos-token", metavar="TEXT", help="The BOS token for --bos, if the tokenizer marks none special.")
@click.option("--skip-bad", is_flag=True,
              help="Skip malformed records (bad JSON, no text, not UTF-8, over --max-doc-bytes) and report counts, "
                   "instead of stopping.")
@click.option("--max-doc-bytes", type=TokenCount(), default=DEFAULT_MAX_DOC_BYTES, show_default=True,
              help="Longest document in bytes (its JSON line or Parquet text; suffixes K, M, Ki, Mi); a longer one "
                   "is a bad record. Tokenizing a document takes many times its size: this bounds a worker's "
                   "memory (docs/security.md).")
@click.option("--license", "license_", default="unknown", show_default=True, metavar="SPDX",
              help="The subset's license, an SPDX id such as CC-BY-4.0.")
@click.option("--shard-tokens", type=TokenCount(), default=DEFAULT_SHARD_TOKENS, show_default=True,
              help="Most tokens per shard (suffixes K, M, G, Ki, Mi, Gi). The default gives ~350 MB shards.")
@click.option("--corpus-name", help="Name of a new corpus (default: the directory's name).")
@click.option("--corpus-version", help="Version of a new corpus (default: 0.1.0).")
def command(inputs: tuple[str, ...], subset: str, tokenizer: str, out: Path, workers: int | None, engine: str,
            ray_address: str | None, text_field: str, id_field: str, tokenizer_name: str | None, add_bos: bool, eos_token: str | None,
            bos_token: str | None, skip_bad: bool, max_doc_bytes: int, license_: str, shard_tokens: int,
            corpus_name: str | None, corpus_version: str | None) -> None:
    """Tokenize INPUT files into subset --subset of the corpus --out.

    INPUT is a file, a directory or a glob of .jsonl / .ndjson / .json (JSON Lines, optionally .gz,
    .zst or .zstd compressed) or .parquet files. Each document is encoded without the tokenizer's own
    special tokens, EOS is appended (BOS prepended with --bos), and the shards, shards.parquet,
    SHA256SUMS and manifest.json are written; empty documents are skipped and counted.

    Run once per subset to fill a corpus. The output is byte-identical whatever --workers is. An
    interrupted run resumes where it stopped when run again; a subset that is already complete is
    left alone if the inputs are the same, and refused if they differ (shard new data into a child
    subset such as NAME/2025, which --subset NAME still selects).

    \b
    EXAMPLES
      marin-data shard 'raw/dclm/*.jsonl.zst' --subset pretrain/dclm --tokenizer meta-llama/Llama-3.1-8B \\
          --out corpus --license CC-BY-4.0
      marin-data shard raw/math.parquet --subset midtrain/math --tokenizer tok/tokenizer.json --out corpus \\
          --text-field content --skip-bad --workers 8
      marin-data shard /shared/raw/web --subset pretrain/web --tokenizer meta-llama/Llama-3.1-8B \\
          --out /shared/corpus --engine ray --ray-address auto     # on a node of a Ray cluster
    """
    report = shard_subset(inputs, subset=subset, tokenizer=tokenizer, out=out, workers=workers,
                          text_field=text_field, id_field=id_field, add_bos=add_bos, eos_token=eos_token,
                          bos_token=bos_token, tokenizer_name=tokenizer_name, skip_bad=skip_bad, max_doc_bytes=max_doc_bytes, license=license_,
                          shard_tokens=shard_tokens, name=corpus_name, version=corpus_version,
                          **engine_kwargs(engine, ray_address))
    echo(summary(report))


def summary(report: ShardReport) -> str:
    """The end-of-run summary: a table of what was written, skips by reason, the manifest sha256."""
    if report.unchanged:
        head = f"subset {report.subset} is already complete from these inputs: nothing to do"
    else:
        reused = f", {report.units_reused} finished by an earlier run" if report.units_reused else ""
        head = f"sharded {plural(report.units, 'input file')}{reused} into {report.corpus}"
    table = format_table(
        ["subset", "documents", "tokens", "shards", "bytes", "skipped"],
        [[report.subset, f"{report.docs:,}", f"{report.tokens:,}", f"{report.shards:,}", human_bytes(report.bytes),
          f"{sum(report.skipped.values()):,}"]],
    )
    skips = [f"  skipped {n:,} {reason}" + (f" (first: {report.examples[reason]})" if reason in report.examples else "")
             for reason, n in report.skipped.items()]
    return "\n".join([head, "", table, *skips, "", f"manifest sha256  {report.manifest_sha256}"])
