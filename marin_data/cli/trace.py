"""``marin-data trace``: which documents a Levanter ``train_lm`` run read at a step, where a document was
read, and how much of each component a run reads before a step (library: the run's order as
`marin_data.formats.open_run` opens it; a Levanter run's: `marin_data.levanter.order.trace`)."""

from __future__ import annotations

import json

import click

from marin_data.cli._hf_options import hf_options
from marin_data.cli._store_options import data_of, is_url, source_options, store_options
from marin_data.ui import echo, format_table, printable

__all__ = ["command"]

_DOCS_SHOWN = 4  # documents listed per slot in the table (--json lists all)


def _documents(slot: dict) -> str:
    docs = [f"{d['row']}[{d['first']}:{d['last']}]" for d in slot["documents"]]
    more = len(docs) - _DOCS_SHOWN
    return " ".join(docs[:_DOCS_SHOWN]) + (f" +{more}" if more > 0 else "")


def _print_step(out: dict) -> None:
    pinned = any("cell" in s for s in out["batch"])
    documents = all("documents" in s for s in out["batch"])  # not asked for with --no-documents
    headers = ["slot", "component", "sequence", "tokens"] + (["documents (row[first:last])"] if documents else [])
    rows = [[n, s["component"], f"{s['sequence']:,}", f"{s['tokens'][0]:,}-{s['tokens'][1]:,}"]
            + ([_documents(s)] if documents else []) for n, s in enumerate(out["batch"])]
    if pinned:
        headers += ["shard", "sha256", "license"]
        for row, s in zip(rows, out["batch"]):
            row += [s["shards"][0]["path"], (s["shards"][0]["sha256"] or "")[:12], s["license"]]
    echo(f"step {out['step']:,}: {len(out['batch']):,} sequences (Levanter {out['levanter']})")
    echo(format_table(headers, rows))
    for n, s in enumerate(out["batch"]):
        if "text" in s:
            echo(f"\n== slot {n}: {printable(s['component'])} sequence {s['sequence']:,}\n{s['text']}")


def _print_document(out: dict) -> None:
    echo(f"{printable(out['document'])}: component {printable(out['component'])}, row {out['row']:,}, tokens "
         f"{out['tokens'][0]:,}-{out['tokens'][1]:,} (sequences {', '.join(map(str, out['sequences'])) or 'none'})")
    echo(f"served {len(out['steps']):,} times before step {out['until']:,}")
    if out["steps"]:
        echo(format_table(["step", "slot"], [[f"{s:,}", f"{n:,}"] for s, n in zip(out["steps"], out["slots"])]))


def _print_summary(out: dict) -> None:
    rows = [[r["component"], f"{r['tokens_served']:,}", f"{r['epochs']:.3f}", f"{r['fraction_seen']:.1%}",
             "never" if r["first_step"] is None else f"{r['first_step']:,}"] for r in out["components"]]
    echo(f"before step {out['until']:,} (Levanter {out['levanter']})")
    echo(format_table(["component", "tokens served", "epochs", "seen", "first step"], rows))
    if out["never_served"]:
        echo(f"never served: {', '.join(out['never_served'])}")
    if out["zero_weight"]:
        echo(f"weight 0 throughout (not in the mixture): {', '.join(out['zero_weight'])}")


@click.command("trace")
@click.option("--levanter-config", "config", required=True, metavar="RUN.yaml",
              type=click.Path(dir_okay=False), help="The YAML the train_lm run read.")
@click.option("--step", type=click.IntRange(min=0), metavar="S", help="Describe the global batch of step S.")
@click.option("--document", metavar="ID", help="COMPONENT:ROW or CELL:ROW: every step and slot that served any "
                                               "of its tokens.")
@click.option("--summary", is_flag=True, help="Per component: tokens served, epochs, fraction seen, first step.")
@click.option("--until", type=click.IntRange(min=0), metavar="STEP",
              help="--document, --summary: steps before STEP (default: trainer.num_train_steps).")
@click.option("--store", metavar="ROOT", help="Find each component's cache under ROOT (a folder, s3://, hf://) by "
                                               "its path below the store (cluster=3/quality=4).")
@click.option("--levanter-version", "version", type=click.Choice(["0.2.20", "0.2.227"]), default="0.2.227",
              show_default=True, help="The Levanter the run used.")
@click.option("--no-documents", is_flag=True, help="--step: components and sequences only (reads no offsets).")
@click.option("--with-text", is_flag=True, help="--step: each window's tokens decoded (reads the data chunk files' "
                                                "inner chunks it needs).")
@click.option("--tokenizer", metavar="TOK", help="--with-text: the tokenizer the caches were built with (a "
                                                 "tokenizer.json or a Hub id); a pinned --store carries its own.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@store_options
@hf_options
def command(config: str, step: int | None, document: str | None, summary: bool, until: int | None,
            store: str | None, version: str, no_documents: bool, with_text: bool, tokenizer: str | None,
            as_json: bool, endpoint_url: str | None,
            profile: str | None, anonymous: bool, requester_pays: bool, endpoint: str | None,
            token: str | None) -> None:
    """Which documents a Levanter train_lm run read at a step, and at which steps it read a document,
    computed from the run's YAML and the caches' ledgers and offsets (no token data, no JAX).

    Levanter's order is reproduced exactly (threefry keys, mixture blocks, Feistel, linear and block shuffles,
    validation splits, budgets); a YAML key that changes the order in another way is refused by name.

    \b
    EXAMPLES
      marin-data trace --levanter-config run.yaml --step 1000
      marin-data trace --levanter-config run.yaml --step 1000 --json --store /data/store
      marin-data trace --levanter-config run.yaml --step 1000 --with-text --tokenizer meta-llama/Llama-3.1-8B
      marin-data trace --levanter-config run.yaml --document c3q4:81234 --until 108000
      marin-data trace --levanter-config run.yaml --document cluster=3/quality=4:81234 --store s3://b/store
      marin-data trace --levanter-config run.yaml --summary --until 108000
      marin-data trace --levanter-config run.yaml --step 0 --no-documents --levanter-version 0.2.20
    """
    from marin_data.formats import open_run

    if sum([step is not None, document is not None, summary]) != 1:
        raise click.UsageError("pass exactly one of --step S, --document ID and --summary")
    if until is not None and step is not None:
        raise click.UsageError("--until applies to --document and --summary")
    if (no_documents or with_text) and step is None:
        raise click.UsageError("--no-documents and --with-text apply to --step")
    if tokenizer and not with_text:
        raise click.UsageError("--tokenizer applies to --with-text")
    options = source_options(store, endpoint_url, profile, anonymous, requester_pays, endpoint, token) \
        if store and (is_url(store) or data_of(store)) else {}
    trace = open_run(config, store=store, version=version, **options)
    if step is not None:
        text = trace.text_tokenizer(tokenizer, store) if with_text else None
        out, show = trace.step(step, documents=not no_documents, text=text), _print_step
    elif document is not None:
        out, show = trace.document(document, until=until), _print_document
    else:
        out, show = trace.summary(until), _print_summary
    if as_json:
        echo(json.dumps(out))
    else:
        show(out)
