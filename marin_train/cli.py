"""``marin-train`` (also ``python -m marin_train``): a command group whose default command is ``train``, so
``marin-train --data DIR`` trains; ``marin-train eval`` reports a model's held-out loss and bits per byte,
``marin-train generate`` samples text from it, ``marin-train export`` writes a checkpoint as one safetensors
model, ``marin-train plot`` a run's metrics as a PNG and ``marin-train trace`` says what a run trained on.
``marin-data train`` is the same ``train`` command (an entry point of the ``marin_data.commands`` group)."""

from __future__ import annotations

import dataclasses
import json
import signal
import sys

import click
import torch.distributed as dist

from marin_data.cli._errors import describe
from marin_data.loader.packing import PACKINGS
from marin_data.ui import format_table
from marin_train.checkpoint import resolve_checkpoint
from marin_train.cli_options import corpus_options, data_config, threads_option
from marin_train.config import TRAIN_PRESETS
from marin_train.run import run_training
from marin_train.distributed import shutdown_distributed
from marin_train.evaluate import EvalResult
from marin_train.help_sections import SectionedCommand
from marin_train.loop import TrainResult
from marin_train.schedule import Schedule, load_schedule
from marin_train.signals import StopSignals, exit_code
from marin_train.threads import set_threads
from marin_train.trace import trace

__all__ = ["command", "evaluate", "export", "format_eval", "generate", "group", "main", "plot", "summary"]


def _mixture(values: tuple[str, ...] | list[str], flag: str = "--mixture") -> dict[str, float] | None:
    out = {}
    for value in values:
        name, sep, weight = value.rpartition("=")
        try:
            out[name] = float(weight)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise click.UsageError(f"{flag} takes NAME_OR_GLOB=WEIGHT, got {value!r}")
    return out or None


def _mixture_from(values: tuple[str, ...]) -> tuple[tuple[int, dict[str, float]], ...]:
    changes = []
    for value in values:
        step, sep, weights = value.partition(":")
        if not sep or not step.isdigit() or int(step) < 1:
            raise click.UsageError(f"--mixture-from takes STEP:SUBSET=W,SUBSET=W,..., got {value!r}")
        changes.append((int(step), _mixture(weights.split(","), "--mixture-from")))
    return tuple(changes)


def summary(result: TrainResult, window: int = 10) -> str:
    """The run's last line: the step reached, the steps this invocation trained, and its loss as the mean over
    its first and last ``window`` steps (fewer in a short run): one step's loss is noisy, and a resumed run's
    first step is no baseline, so single steps compared side by side can read as training gone wrong."""
    records = result.records
    k = max(1, min(window, len(records) // 2))
    rest = records[1:] or records  # the first step also sets the stream up
    wait = sum(r["data_wait"] for r in rest) / sum(r["seconds"] for r in rest)

    def steps(rs: list[dict]) -> str:
        a, b = rs[0]["step"], rs[-1]["step"]
        return f"step {a}" if a == b else f"steps {a}-{b}"

    def mean(rs: list[dict]) -> float:
        return sum(r["loss"] for r in rs) / len(rs)

    loss = (f"loss {mean(records):.4f}" if len(records) == 1 else
            f"mean loss {mean(records[:k]):.4f} ({steps(records[:k])}) -> {mean(records[-k:]):.4f} "
            f"({steps(records[-k:])})")
    return (f"{'stopped' if result.stopped else 'done'}: step {result.steps}; this run trained {steps(records)}, {loss}, data wait {wait:.2%} of step "
            f"time after the first step" + (f", checkpoint {result.checkpoint}" if result.checkpoint else ""))


def _check_against(schedule: Schedule, given: dict[str, object]) -> None:
    """Refuse a flag that contradicts what the schedule file sets (the file is the run's description)."""
    scheduled = {"--steps": schedule.steps, "--seq-len": schedule.seq_len, "--packing": schedule.packing,
                 "--val-fraction": schedule.val_fraction}
    for flag, value in given.items():
        if value is not None and scheduled[flag] is not None and value != scheduled[flag]:
            raise click.UsageError(f"{flag} {value} contradicts the schedule's {scheduled[flag]} ({schedule.source})"
                                   + ("; use --until STEP to stop early" if flag in ("--steps", "--seq-len") else ""))


# `train --help` under headings, each with its options in the order they print.
TRAIN_SECTIONS = (
    ("Data", ("source", "mixture", "mixture_from", "schedule_file", "packing", "val_fraction")),
    ("Remote corpus and shard cache", ("mirrors", "manifest_sha256", "endpoint", "endpoint_url", "profile",
                                       "anonymous", "requester_pays", "cache_dir", "cache_gb")),
    ("Model and schedule", ("preset", "steps", "batch_size", "accumulation", "seq_len", "lr", "seed", "ep",
                            "recompute")),
    ("Checkpoints and resume", ("checkpoint_dir", "checkpoint_every", "keep_checkpoints", "until", "no_resume",
                                "reschedule", "checkpoint_on_signal")),
    ("Run", ("threads", "log_every", "eval_every", "eval_tokens", "tensorboard_dir", "wandb_project")),
)


@click.command("train", cls=SectionedCommand, sections=TRAIN_SECTIONS, context_settings={"max_content_width": 100})
@click.option("--data", "source", required=True, metavar="CORPUS",
              help="A corpus or a pinned Levanter cache/store: a local directory, s3://bucket/prefix or "
                   "hf://datasets/org/name.")
@click.option("--preset", default="tiny", show_default=True, help="Training preset (model shape and defaults).")
@click.option("--mixture", multiple=True, metavar="SUBSET=W", help="Mixture weight of a subset or glob (repeat).")
@click.option("--mixture-from", multiple=True, metavar="STEP:SUBSET=W,...",
              help="The mixture from optimizer step STEP on (repeat for more phases); also on resume.")
@click.option("--schedule", "schedule_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="The run's data schedule (YAML/JSON): steps, global batch, seq_len, mixture block and the "
                   "mixture's phases by step (docs/training.md; examples/schedules/).")
@click.option("--packing", type=click.Choice(list(PACKINGS)),
              help="How tokens become sequences: overlap (seq_len + 1 tokens within a shard, attention masked at "
                   "document ends; the default) or levanter (Levanter's windows: a subset's tokens [i*seq_len, "
                   "(i+1)*seq_len), attention causal across documents). A resume keeps the checkpoint's.")
@click.option("--val-fraction", type=click.FloatRange(0, 0.5), metavar="F",
              help="Fraction of each subset's sequences held out from training: the split --eval-every and "
                   "`marin-train eval` read (default 0.001). A resume keeps the checkpoint's.")
@click.option("--ep", type=int, help="Expert-parallel degree: divides the ranks and the routed experts (default 1).")
@click.option("--recompute", is_flag=True, default=None, help="Recompute each block in the backward pass.")
@click.option("--steps", type=int, help="Optimizer steps (default: the preset's).")
@click.option("--until", type=int, metavar="STEP", help="Stop after this step, checkpointed; a later run resumes.")
@click.option("--batch-size", type=int, help="Sequences per rank per micro-batch.")
@click.option("--accumulation", type=int, help="Micro-batches per optimizer step.")
@click.option("--seq-len", type=int, help="Tokens per sequence.")
@click.option("--lr", type=float, help="Peak learning rate.")
@click.option("--checkpoint-dir", metavar="DIR", help="Write checkpoints here; a run resumes from the newest.")
@click.option("--checkpoint-every", type=int, help="Steps between checkpoints (default: only at the end).")
@click.option("--no-resume", is_flag=True, help="Start afresh even if --checkpoint-dir holds a checkpoint.")
@click.option("--reschedule", is_flag=True,
              help="On resume, rebuild the learning-rate schedule from --steps and --lr (default: the checkpoint's).")
@click.option("--checkpoint-on-signal/--no-checkpoint-on-signal", default=True, show_default=True,
              help="On SIGTERM or SIGINT, finish the step and write a checkpoint before exiting 143 or 130; "
                   "--no-checkpoint-on-signal exits at once.")
@click.option("--keep-checkpoints", type=click.IntRange(min=0), metavar="N",
              help="Keep the newest N checkpoints, deleting older ones (logged); 0 keeps all (default 2).")
@click.option("--tensorboard", "tensorboard_dir", metavar="DIR",
              help="Write every step's metrics as TensorBoard events here (pip install 'marin[tensorboard]').")
@click.option("--wandb", "wandb_project", metavar="PROJECT",
              help="Log every step's metrics to this W&B project (pip install 'marin[wandb]'; WANDB_MODE=offline).")
@click.option("--log-every", type=int, help="Steps between log lines.")
@click.option("--eval-every", type=int, metavar="N",
              help="Evaluate on the held-out split every N steps and at the end, as `marin-train eval` does; the "
                   "results join metrics.jsonl (eval/loss, eval/bpb, per subset eval/SUBSET/loss).")
@click.option("--eval-tokens", type=int, metavar="N", help="Held-out target tokens per evaluation (default: all).")
@click.option("--seed", type=int, help="Model init and data order.")
@threads_option
@corpus_options
def command(source, preset, mixture, mixture_from, schedule_file, packing, val_fraction, ep, recompute, steps, until,
            batch_size, accumulation, seq_len, lr, checkpoint_dir, checkpoint_every, no_resume, reschedule,
            checkpoint_on_signal, keep_checkpoints, tensorboard_dir, wandb_project, log_every, eval_every, eval_tokens,
            seed, threads, **corpus) -> int:
    """Train the Marin MoE model on a corpus, streaming it from S3 or a Hub mirror when remote.

    Logs loss, tokens/s, time waiting for data and router statistics; every step's metrics go to
    CHECKPOINT_DIR/metrics.jsonl (at each checkpoint) and, when asked, to TensorBoard or W&B. The model is
    sharded over the ranks (FSDP2, and --ep N splits the routed experts over N ranks); under torchrun each
    process trains on its slice of every global batch (gloo on CPU, NCCL on GPU). Checkpoints (sharded: model,
    optimizer, loader position, balancing bias, RNG, step) are atomic, and a run resumes from the newest, also
    at another world size or --ep, keeping the global batch, and the learning-rate schedule (--reschedule
    rebuilds it from the flags). Without --checkpoint-dir nothing is saved. SIGTERM or Ctrl-C: every rank
    finishes the step, a checkpoint is written, exit 143 or 130 (a second signal stops at once). Torch's
    threads: --threads, else OMP_NUM_THREADS, else 1 per process under torchrun, else the usable cores less
    one, as the first log line says.

    \b
    EXAMPLES
      marin-train --data out/sample --steps 50 --checkpoint-dir out/run
      marin-train --data out/sample --checkpoint-dir out/run --checkpoint-every 10 --keep-checkpoints 0 \\
                  --tensorboard out/run/tb
      marin-train --data s3://bucket/corpus --endpoint-url http://127.0.0.1:9000 \\
                  --mixture 'code/*=0.3' --mixture 'prose/*=0.7' --cache-gb 4
      marin-train --data hf://datasets/marin/sample --endpoint http://127.0.0.1:8000 --steps 100
      marin-train --data /data/marin-store --mixture 'cluster=*/quality=4=0.8' \\
                  --mixture 'cluster=*/quality=3=0.2'                 # a store pinned with marin-data adopt
      marin-train --data /data/marin-store --packing levanter --val-fraction 0.01 \\
                  --checkpoint-dir out/run --eval-every 100           # Levanter's windows, 1% held out
      marin-train --data out/sample --mixture 'code/*=0.3' --mixture 'prose/*=0.7' \\
                  --mixture-from '1000:code/*=0.5,prose/*=0.5' --checkpoint-dir out/run
      marin-train --data out/sample --schedule examples/schedules/sample.yaml --checkpoint-dir out/run \\
                  --eval-every 20
      torchrun --nproc-per-node 4 -m marin_train --data out/sample --ep 2 --steps 20
    """
    if preset not in TRAIN_PRESETS:
        raise click.UsageError(f"unknown --preset {preset!r}; choose one of {', '.join(TRAIN_PRESETS)}")
    base = TRAIN_PRESETS[preset]
    schedule = None
    fields = {k: v for k, v in (("packing", packing), ("val_fraction", val_fraction)) if v is not None}
    if schedule_file:
        if mixture or mixture_from:
            raise click.UsageError("--schedule holds the mixture's phases: drop --mixture and --mixture-from")
        schedule = load_schedule(schedule_file)
        _check_against(schedule, {"--steps": steps, "--seq-len": seq_len, "--packing": packing,
                                  "--val-fraction": val_fraction})
        steps, seq_len, fields = schedule.steps, schedule.seq_len, {**fields, **schedule.data_fields()}
    data = data_config(source, mixture=_mixture(mixture), mixture_from=_mixture_from(mixture_from), schedule=schedule,
                       **fields, **corpus)
    changes = {"steps": steps, "batch_size": batch_size, "accumulation": accumulation, "seq_len": seq_len, "lr": lr,
               "checkpoint_dir": checkpoint_dir, "checkpoint_every": checkpoint_every, "log_every": log_every,
               "eval_every": eval_every, "eval_tokens": eval_tokens, "seed": seed, "ep": ep, "recompute": recompute,
               "keep_checkpoints": keep_checkpoints, "tensorboard_dir": tensorboard_dir, "wandb_project": wandb_project}
    try:
        cfg = dataclasses.replace(base, data=data, **{k: v for k, v in changes.items() if v is not None})
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    signals = StopSignals(checkpoint=checkpoint_on_signal and bool(checkpoint_dir), unsaved=(
        "nothing since the last checkpoint is saved (--no-checkpoint-on-signal)" if checkpoint_dir else
        "no --checkpoint-dir, so nothing is saved"))
    with signals:
        result = run_training(cfg, resume=not no_resume, until=until, threads=threads, stop=signals.requested,
                              reschedule=reschedule, log=lambda line: click.echo(line))
        rank = dist.get_rank()
        shutdown_distributed()  # this process joined a process group; it leaves it, so exit is clean
        if result.records and rank == 0:
            click.echo(summary(result))
    return exit_code(signals.signum or signal.SIGTERM) if result.stopped else 0


@click.command("export", context_settings={"max_content_width": 100})
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False))
@click.option("--to", "to", required=True, metavar="DIR", help="Write model.safetensors and config.json here.")
@click.option("--format", "fmt", type=click.Choice(["marin", "transformers"]), default="marin", show_default=True,
              help="marin: this package's model; transformers: a Qwen2-MoE model for "
                   "AutoModelForCausalLM.from_pretrained(DIR) (docs/training.md says what it refuses).")
def export(checkpoint, to, fmt) -> None:
    """Write CHECKPOINT (a step-NNNNNNNN directory, or a run directory: its latest) as one model.

    One process, no process group: every sharded tensor is reassembled whole into model.safetensors, with
    config.json. Load it back with marin_train.export.load_exported(DIR), or any safetensors reader; with
    --format transformers, with transformers' AutoModelForCausalLM.from_pretrained(DIR).

    \b
    EXAMPLES
      marin-train export out/run --to out/model
      marin-train export out/run/step-00000050 --to out/model-50
      marin-train export out/run --to out/hf-model --format transformers
    """
    from marin_train.export import export_checkpoint  # safetensors only where exporting
    from marin_train.export_hf import export_transformers

    try:
        path = resolve_checkpoint(checkpoint)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="CHECKPOINT") from None
    write = export_transformers if fmt == "transformers" else export_checkpoint
    click.echo(f"exported {path} to {write(path, to)}")


@click.command("plot", context_settings={"max_content_width": 100})
@click.argument("run", type=click.Path(exists=True))
@click.option("--out", metavar="FILE", help="The PNG to write (default RUN/metrics.png).")
def plot(run, out) -> None:
    """Plot RUN's metrics.jsonl (RUN: a checkpoint directory, or the file) as one PNG.

    Loss (and held-out loss where the run evaluated), learning rate, tokens/s and the experts' load (busiest
    over mean, per layer) against steps, with tokens on the top axis. Headless (matplotlib's Agg canvas).

    \b
    EXAMPLES
      marin-train plot out/run
      marin-train plot out/run/metrics.jsonl --out run.png
    """
    from marin_train.plot import plot_path, plot_run  # matplotlib only where plotting

    try:
        plot_run(run, plot_path(run, out))
    except (FileNotFoundError, ValueError) as e:
        raise click.BadParameter(str(e), param_hint="RUN") from None
    click.echo(f"wrote {plot_path(run, out)}")


@click.command("eval", context_settings={"max_content_width": 100})
@click.argument("model", metavar="CHECKPOINT_OR_EXPORT")
@click.option("--data", "source", required=True, metavar="CORPUS",
              help="The corpus whose held-out split to evaluate on: a directory, s3://... or hf://datasets/...")
@click.option("--subset", "subsets", multiple=True, metavar="NAME_OR_GLOB",
              help="Evaluate these subsets only (repeat; default: all, or a partial download's own).")
@click.option("--max-tokens", type=int, metavar="N",
              help="At most N target tokens: the split's first N // seq_len sequences (default: all of it).")
@click.option("--batch-size", type=int, default=8, show_default=True,
              help="Sequences per forward (part of what the numbers are; not of the ranks).")
@click.option("--seq-len", type=int, help="Tokens per sequence (default: the run's).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@threads_option
@corpus_options
def evaluate(model, source, subsets, max_tokens, batch_size, seq_len, as_json, threads, **corpus) -> None:
    """Held-out loss and bits per byte of a model, per subset and overall.

    MODEL is a checkpoint (step-NNNNNNNN/), a run directory (its latest checkpoint) or an exported model.
    The sequences are the corpus's held-out split (the loader's split="validation": never served to a run
    trained on this corpus at the same sequence length), at the run's held-out fraction and packing, in a
    fixed order; stderr says how many, and what share of the split and of the data they are. Loss is the
    mean cross-entropy in nats per target token. Bits per byte = total nats / ln 2 / total bytes, where the bytes are the
    UTF-8 bytes of the decoded target tokens (each token's own bytes under a byte-level BPE; EOS and other
    special tokens count 0), so models with different tokenizers compare. Under torchrun the ranks split
    the sequences and report the same numbers as any other process count, to the last bit: every process
    uses one intra-op thread under torchrun (--threads or OMP_NUM_THREADS sets another count; a lone process
    without torchrun matches with --threads 1). The choice goes to stderr.

    \b
    EXAMPLES
      marin-train eval out/run --data out/sample
      marin-train eval out/run/step-00000050 --data out/sample --subset 'code/*' --max-tokens 100000 --json
      marin-train eval out/model --data s3://bucket/corpus --endpoint-url http://127.0.0.1:9000
      torchrun --nproc-per-node 2 -m marin_train eval out/run --data out/sample
    """
    from marin_train.inference import evaluate_saved  # safetensors only where a saved model is read

    for flag, value in (("--max-tokens", max_tokens), ("--batch-size", batch_size), ("--seq-len", seq_len)):
        if value is not None and value < 1:
            raise click.UsageError(f"{flag} must be >= 1, got {value}")
    choice = set_threads(threads)
    result = evaluate_saved(model, source, subsets=list(subsets) or None, max_tokens=max_tokens,
                            batch_size=batch_size, seq_len=seq_len, data=data_config(source, **corpus),
                            log=lambda line: click.echo(line, err=True))
    rank = dist.get_rank()
    shutdown_distributed()
    if rank == 0:
        click.echo(choice.describe(), err=True)
        click.echo(json.dumps(result.to_json(), indent=1) if as_json else format_eval(result))


def format_eval(result: EvalResult) -> str:
    """The eval table: one row per subset and one for all of them."""
    m = result.meta
    head = (f"{m.get('model')} (step {m.get('step')}) on {m.get('data')}: held-out split, {result.seq_len} tokens a "
            f"sequence, {result.overall.sequences:,} sequences, {result.seconds:.1f} s")
    rows = [[name, f"{t.sequences:,}", f"{t.tokens:,}", f"{t.bytes:,}", f"{t.loss:.4f}", f"{t.bits_per_byte:.4f}"]
            for name, t in [*result.subsets.items(), ("all", result.overall)]]
    return head + "\n" + format_table(["subset", "sequences", "tokens", "bytes", "loss", "bits/byte"], rows)


@click.command("generate", context_settings={"max_content_width": 100})
@click.argument("model", metavar="CHECKPOINT_OR_EXPORT")
@click.option("--prompt", "prompts", multiple=True, required=True, metavar="TEXT",
              help="Text to continue (repeat for more samples, one line each).")
@click.option("--max-new-tokens", type=int, default=64, show_default=True, help="Tokens to add at most.")
@click.option("--temperature", type=float, default=0.8, show_default=True, help="0: greedy (always the likeliest).")
@click.option("--top-k", type=int, default=50, show_default=True, help="Sample among the K likeliest (0: all).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the sampler: the same seed, the same text.")
@click.option("--tokenizer", metavar="FILE_OR_REPO",
              help="A tokenizer.json or Hugging Face repo id (default: the one the run recorded).")
@click.option("--data", "source", metavar="CORPUS", help="Use this corpus's tokenizer (default: the run's).")
@click.option("--no-cache", is_flag=True, help="Run the whole context every step (slower; the cache's reference).")
@click.option("--json", "as_json", is_flag=True, help="Print the samples as JSON.")
@corpus_options
def generate(model, prompts, max_new_tokens, temperature, top_k, seed, tokenizer, source, no_cache, as_json,
             **corpus) -> None:
    """Continue prompts with a model, sampling token by token with a KV cache.

    MODEL is a checkpoint (step-NNNNNNNN/), a run directory (its latest checkpoint) or an exported model. The
    prompts are encoded with the training corpus's tokenizer, which a run keeps in its checkpoint directory
    (and export copies beside the model); --tokenizer or --data name one for a model without it. Generation
    stops at EOS. A prompt and its new tokens share the model's context: a longer prompt keeps its last
    tokens (stderr says so). The KV cache keeps every key of the global layers and the last window of the
    sliding-window layers. One line per prompt: the prompt, then the continuation (newlines shown as \\n).

    \b
    EXAMPLES
      marin-train generate out/run --prompt 'def parse(' --prompt 'The module'
      marin-train generate out/model --prompt 'import os' --temperature 0 --max-new-tokens 32
      marin-train generate out/run/step-00000050 --prompt 'class ' --seed 3 --top-k 20 --json
      marin-train generate out/model --tokenizer meta-llama/Llama-3.1-8B --prompt 'Hello'
    """
    from marin_train.inference import generate_text  # safetensors only where a saved model is read

    if max_new_tokens < 1 or temperature < 0 or top_k < 0:
        raise click.UsageError("--max-new-tokens must be >= 1, --temperature and --top-k >= 0")
    if any(not p for p in prompts):
        raise click.UsageError("--prompt must not be empty: there is no token to continue")
    if tokenizer and source:
        raise click.UsageError("--tokenizer and --data both name a tokenizer: give one")
    samples = generate_text(model, prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                            seed=seed, tokenizer=tokenizer, source=source, data=data_config(source, **corpus),
                            use_cache=not no_cache)
    for n, s in enumerate(samples, 1):
        if s.dropped:
            click.echo(f"note: prompt {n} lost its first {s.dropped:,} tokens: the model's context holds its last "
                       f"tokens and the --max-new-tokens {max_new_tokens} new ones", err=True)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(s) for s in samples], indent=1, ensure_ascii=False))
        return
    for s in samples:
        click.echo(_one_line(s.prompt) + click.style(_one_line(s.completion), bold=True))


def _one_line(text: str) -> str:
    """``text`` on one line: newlines, tabs and other unprintable characters as Python escapes (``\\n``)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class _TrainByDefault(click.Group):
    """A group whose default command is ``train``: arguments that do not start with a command name go to it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["train", *args]
        return super().parse_args(ctx, args)


@click.group("marin-train", cls=_TrainByDefault,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def group() -> None:
    """Train the Marin MoE model (the default command: marin-train --data DIR ...), evaluate, sample, export
    it, plot a run's metrics, or trace what a run trained on.

    \b
    EXAMPLES
      marin-train --data out/sample --steps 50 --checkpoint-dir out/run --eval-every 25
      marin-train eval out/run --data out/sample
      marin-train generate out/run --prompt 'def main(' --max-new-tokens 40
      marin-train export out/run --to out/model
      marin-train plot out/run
      marin-train trace out/run --step 30
    """


group.add_command(command)
group.add_command(evaluate)
group.add_command(generate)
group.add_command(export)
group.add_command(plot)
group.add_command(trace)


def main(argv: list[str] | None = None, prog_name: str = "marin-train") -> None:
    """``marin-train``: `group`, with marin-data's error messages and exit codes."""
    try:
        rv = group.main(args=sys.argv[1:] if argv is None else argv, prog_name=prog_name, standalone_mode=False)
        sys.exit(rv if isinstance(rv, int) else 0)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:  # Ctrl-C before or after a run's own handlers (`marin_train.signals`)
        click.echo("Aborted.", err=True)
        sys.exit(exit_code(signal.SIGINT))
    except Exception as e:  # noqa: BLE001 - known errors become one line and an exit code
        known = describe(e)
        if known is None:
            raise
        click.secho(f"error: {known[0]}", err=True, fg="red")
        sys.exit(known[1])
