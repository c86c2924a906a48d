"""``marin-train trace RUN``: what a run of this trainer saw, from what the run recorded (docs/training.md,
"Our own runs"). The queries are `marin_data.loader.trace`'s; this module rebuilds the run's stream.

A checkpoint's ``config.json`` holds the run's `TrainConfig` (its data source, the manifest sha256 it read,
mixture or schedule, seed, ``seq_len``, planned steps), its global batch, and the stream's fingerprint; the
stream is rebuilt with the loader the trainer uses (`marin_train.data.training_loader`) and must have that
fingerprint, so a trace never answers for another corpus or order. ``--data`` reads another copy of the
corpus (a local download of a remote run's, say): same fingerprint, same answers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from marin_data.errors import InvalidCheckpointError, LoaderStateMismatchError
from marin_data.loader.stream import TokenStream
from marin_data.loader.trace import Exposure, Trace, exposure, never_served
from marin_data.ui import format_table, printable
from marin_train.checkpoint import checkpoint_config, resolve_checkpoint
from marin_train.config import DataConfig, TrainConfig
from marin_train.data import training_loader
from marin_train.schedule import Schedule, SchedulePhase

__all__ = ["open_run", "run_config", "open_stream", "format_exposure", "trace"]


def run_config(recorded: dict[str, Any]) -> TrainConfig:
    """The `TrainConfig` a checkpoint's ``config.json`` recorded (its ``train`` entry)."""
    try:
        train = dict(recorded["train"])
        data = dict(train.pop("data"))
        if data.get("schedule") is not None:
            schedule = dict(data["schedule"])
            schedule["phases"] = tuple(SchedulePhase(**p) for p in schedule["phases"])
            data["schedule"] = Schedule(**schedule)
        data["mixture_from"] = tuple((int(step), dict(w)) for step, w in data.get("mixture_from") or ())
        data["mirrors"] = tuple(data.get("mirrors") or ())
        train["betas"] = tuple(train["betas"])
        return TrainConfig(**train, data=DataConfig(**data))
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidCheckpointError(f"its config.json does not describe a run of this trainer ({e})") from None


@contextmanager
def open_stream(cfg: TrainConfig, global_batch: int) -> Iterator[TokenStream]:
    """The training stream of ``cfg`` at ``global_batch`` sequences a step, as the trainer builds it (a remote
    one is closed on exit)."""
    cfg = dataclasses.replace(cfg, batch_size=global_batch, accumulation=1)
    stream = training_loader(cfg, rank=0, world_size=1).dataset.stream
    try:
        yield stream
    finally:
        stream.close()  # a remote stream's cache threads and directory lock


@contextmanager
def open_run(run: str, *, source: str | None = None,
             cache_dir: str | None = None) -> Iterator[tuple[TrainConfig, Trace, dict[str, Any]]]:
    """``(config, trace, checkpoint config.json)`` of the run ``run`` (a run directory: its latest checkpoint;
    or a ``step-NNNNNNNN`` directory), its stream read from ``source`` when given.

    Raises:
        InvalidCheckpointError: ``run`` is neither, or its config is not this trainer's.
        LoaderStateMismatchError: the stream rebuilt is not the one the run recorded.
    """
    try:
        recorded = checkpoint_config(resolve_checkpoint(run))
    except ValueError as e:  # resolve_checkpoint says what the path is instead
        raise InvalidCheckpointError(str(e), path=run) from None
    cfg = run_config(recorded)
    data = cfg.data
    if source is not None:  # another copy: the fingerprint, not the manifest, says whether it is the same
        data = dataclasses.replace(data, source=source, manifest_sha256=None)
    if cache_dir is not None:
        data = dataclasses.replace(data, cache_dir=cache_dir)
    with open_stream(dataclasses.replace(cfg, data=data), int(recorded["global_batch"])) as stream:
        _check_stream(stream, recorded.get("stream"), run)
        yield cfg, Trace(stream, int(recorded["global_batch"])), recorded


def _check_stream(stream: TokenStream, recorded: dict[str, Any] | None, run: str) -> None:
    if recorded is None:  # checkpoints written before the stream was recorded in config.json
        click.echo(f"note: {run} records no stream fingerprint; this trace is not checked against it", err=True)
        return
    if recorded.get("fingerprint") != stream.fingerprint:
        theirs = recorded.get("components", {})
        ours = stream.components  # a key only one side names (packing, when not the default) differs too
        differ = sorted(k for k in ours.keys() | theirs.keys() if theirs.get(k) != ours.get(k)) or ["fingerprint"]
        raise LoaderStateMismatchError(f"the stream rebuilt from {run} differs from the one it trained on (in: "
                                       f"{', '.join(differ)}); trace it with --data naming the corpus it read",
                                       expected=recorded.get("fingerprint"), actual=stream.fingerprint)


def format_exposure(table: list[Exposure], never: list[str], until: int) -> str:
    """The exposure table (`marin_data.loader.trace.exposure`), then the subsets never served."""
    rows = [[e.subset, f"{e.sequences:,}", f"{e.tokens:,}", f"{e.epochs:.3f}", f"{e.fraction:.1%}",
             "-" if e.first_step is None else f"{e.first_step:,}"] for e in table]
    out = (f"steps 1-{until:,}\n" + format_table(["subset", "sequences", "tokens", "epochs", "seen", "first step"],
                                                 rows))
    return out + ("\nnever served: " + ", ".join(printable(n) for n in never) if never else
                  "\nevery subset is served")


def _step_text(trace: Trace, step: int) -> str:
    """A line per slot, then a line per document its window touches (its tokens inside the window)."""
    lines = [f"step {step:,}: {trace.global_batch:,} sequences, positions {(step - 1) * trace.global_batch:,}-"
             f"{step * trace.global_batch - 1:,} of the stream"]
    for s in trace.step(step):
        lines.append(f"{s.slot:>4}  {printable(s.subset)}  sequence {s.sequence:,} (epoch {s.epoch}), tokens "
                     f"{s.tokens[0]:,}-{s.tokens[1] - 1:,}  {printable(s.shard)}  {s.license}  sha256 {s.sha256[:16]}")
        lines += [f"        {printable(d.id)}  tokens {d.first:,}-{d.last:,}" for d in s.documents]
    return "\n".join(lines)


@click.command("trace", context_settings={"max_content_width": 100})
@click.argument("run", type=click.Path(exists=True, file_okay=False))
@click.option("--step", type=int, metavar="S", help="What step S trained on: every slot of its global batch.")
@click.option("--document", metavar="ID", help="Every step and slot at which a token of document ID was served.")
@click.option("--summary", is_flag=True, help="Per subset: sequences, tokens, epochs, fraction seen, first step.")
@click.option("--until", type=int, metavar="STEP", help="--document, --summary: up to this step (default: the "
                                                          "run's planned end).")
@click.option("--data", "source", metavar="CORPUS", help="Read the corpus here instead of where the run did (it "
                                                         "must give the run's stream).")
@click.option("--cache-dir", metavar="DIR", help="Shard cache (decoded shards, a remote corpus's fetched ones).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def trace(run, step, document, summary, until, source, cache_dir, as_json) -> None:
    """What the run RUN trained on, from what it recorded (RUN: its --checkpoint-dir, or one step-NNNNNNNN).

    Steps count as the run's log and checkpoints do: step 1 is the first, step-00000050 has seen steps
    1-50. A slot is a sequence's place in its step's global batch. --step lists, for each slot, the subset
    and its sequence number, the window's tokens in the subset's stream, the shard (path, sha256), the
    license and each document the window touches, with the first and last of its tokens inside it. The
    answers come from the loader's order alone, computed, never by replaying steps. A pinned Levanter
    cache's documents are SUBSET:ROW.

    \b
    EXAMPLES
      marin-train trace out/run --step 30
      marin-train trace out/run --document 'json/decoder.py' --json
      marin-train trace out/run --summary --until 20
      marin-train trace out/run --step 1 --data out/sample-copy
    """
    if sum(x is not None and x is not False for x in (step, document, summary)) != 1:
        raise click.UsageError("give one of --step, --document and --summary")
    if until is not None and step is not None:
        raise click.UsageError("--until goes with --document or --summary")
    with open_run(run, source=source, cache_dir=cache_dir) as (cfg, tr, _):
        last = cfg.steps if until is None else until
        for flag, value in (("--step", step), ("--until", last)):
            if value is not None and not 1 <= value <= cfg.steps:
                raise click.UsageError(f"{flag} {value}: this run's steps are 1-{cfg.steps:,}")
        if step is not None:
            click.echo(json.dumps({"step": step, "batch": [s.to_json() for s in tr.step(step)]}, indent=1)
                       if as_json else _step_text(tr, step))
        elif document is not None:
            _echo_document(tr, document, last, as_json)
        else:
            table = exposure(tr.stream, tr.global_batch, last)
            never = never_served(tr.stream, table)
            click.echo(json.dumps({"until": last, "subsets": [dataclasses.asdict(e) for e in table],
                                   "never_served": never}, indent=1) if as_json else
                       format_exposure(table, never, last))


def _echo_document(tr: Trace, document: str, until: int, as_json: bool) -> None:
    positions = tr.document(document, until)
    steps, slots = (positions // tr.global_batch + 1).tolist(), (positions % tr.global_batch).tolist()
    if as_json:
        click.echo(json.dumps({"document": document, "until": until, "steps": steps, "slots": slots}))
        return
    click.echo(f"{printable(document)}: served {len(steps):,} times in steps 1-{until:,}")
    if steps:
        click.echo(format_table(["step", "slot"], list(zip(steps, slots))))
