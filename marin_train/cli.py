"""``marin-train`` (also ``python -m marin_train``): a command group whose default command is ``train``, so
``marin-train --data DIR`` trains; ``marin-train export`` writes a checkpoint as one safetensors model and
``marin-train plot`` a run's metrics as a PNG.
``marin-data train`` is the same ``train`` command (an entry point of the ``marin_data.commands`` group)."""

from __future__ import annotations

import dataclasses
import sys

import click
import torch.distributed as dist

from marin_data.cli._errors import describe
from marin_data.cli._store_options import check_sha256, store_kwargs, store_options
from marin_train.checkpoint import resolve_checkpoint
from marin_train.config import TRAIN_PRESETS, DataConfig
from marin_train.data import run_training
from marin_train.distributed import shutdown_distributed

__all__ = ["command", "export", "group", "main", "plot"]


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


@click.command("train", context_settings={"max_content_width": 100})
@click.option("--data", "source", required=True, metavar="CORPUS",
              help="A corpus: a local directory, s3://bucket/prefix or hf://datasets/org/name.")
@click.option("--preset", default="tiny", show_default=True, help="Training preset (model shape and defaults).")
@click.option("--mixture", multiple=True, metavar="SUBSET=W", help="Mixture weight of a subset or glob (repeat).")
@click.option("--mixture-from", multiple=True, metavar="STEP:SUBSET=W,...",
              help="The mixture from optimizer step STEP on (repeat for more phases); also on resume.")
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
@click.option("--keep-checkpoints", type=click.IntRange(min=0), metavar="N",
              help="Keep the newest N checkpoints, deleting older ones (logged); 0 keeps all (default 2).")
@click.option("--tensorboard", "tensorboard_dir", metavar="DIR",
              help="Write every step's metrics as TensorBoard events here (pip install 'marin[tensorboard]').")
@click.option("--wandb", "wandb_project", metavar="PROJECT",
              help="Log every step's metrics to this W&B project (pip install 'marin[wandb]'; WANDB_MODE=offline).")
@click.option("--log-every", type=int, help="Steps between log lines.")
@click.option("--seed", type=int, help="Model init and data order.")
@click.option("--mirror", "mirrors", multiple=True, metavar="URL", help="Fallback store of a remote corpus (repeat).")
@click.option("--manifest-sha256", metavar="HEX", help="Pin the corpus manifest's sha256.")
@click.option("--endpoint", metavar="URL", help="Hugging Face endpoint of an hf:// corpus (e.g. marin-data serve).")
@click.option("--cache-dir", metavar="DIR", help="Remote shard cache root (default ~/.cache/marin/remote).")
@click.option("--cache-gb", type=float, help="Remote shard cache limit per rank, in GiB (default 64).")
@store_options
def command(source, preset, mixture, mixture_from, ep, recompute, steps, until, batch_size, accumulation, seq_len, lr,
            checkpoint_dir, checkpoint_every, no_resume, keep_checkpoints, tensorboard_dir, wandb_project, log_every,
            seed, mirrors, manifest_sha256, endpoint, cache_dir, cache_gb, endpoint_url, profile, anonymous,
            requester_pays) -> None:
    """Train the Marin MoE model on a corpus, streaming it from S3 or a Hub mirror when remote.

    Logs loss, tokens/s, time waiting for data and router statistics; every step's metrics go to
    CHECKPOINT_DIR/metrics.jsonl (at each checkpoint) and, when asked, to TensorBoard or W&B. The model is
    sharded over the ranks (FSDP2, and --ep N splits the routed experts over N ranks); under torchrun each
    process trains on its slice of every global batch (gloo on CPU, NCCL on GPU). Checkpoints (sharded: model,
    optimizer, loader position, balancing bias, RNG, step) are atomic, and a run resumes from the newest, also
    at another world size or --ep, keeping the global batch. Without --checkpoint-dir nothing is saved. Torch's
    threads: the usable cores per local process less one, at least 1 (OMP_NUM_THREADS overrides), as the
    first log line says.

    \b
    EXAMPLES
      marin-train --data out/sample --steps 50 --checkpoint-dir out/run
      marin-train --data out/sample --checkpoint-dir out/run --checkpoint-every 10 --keep-checkpoints 0 \\
                  --tensorboard out/run/tb
      marin-train --data s3://bucket/corpus --endpoint-url http://127.0.0.1:9000 \\
                  --mixture 'code/*=0.3' --mixture 'prose/*=0.7' --cache-gb 4
      marin-train --data hf://datasets/marin/sample --endpoint http://127.0.0.1:8000 --steps 100
      marin-train --data out/sample --mixture 'code/*=0.3' --mixture 'prose/*=0.7' \\
                  --mixture-from '1000:code/*=0.5,prose/*=0.5' --checkpoint-dir out/run
      torchrun --nproc-per-node 4 -m marin_train --data out/sample --ep 2 --steps 20
    """
    if preset not in TRAIN_PRESETS:
        raise click.UsageError(f"unknown --preset {preset!r}; choose one of {', '.join(TRAIN_PRESETS)}")
    check_sha256(manifest_sha256)
    options = store_kwargs(endpoint_url, profile, anonymous, requester_pays)
    if endpoint:
        options["endpoint"] = endpoint
    base = TRAIN_PRESETS[preset]
    data = DataConfig(source=source, mixture=_mixture(mixture), mixture_from=_mixture_from(mixture_from),
                      mirrors=tuple(mirrors),
                      manifest_sha256=manifest_sha256, cache_dir=cache_dir, store_options=options,
                      cache_bytes=int(cache_gb * (1 << 30)) if cache_gb else base.data.cache_bytes)
    changes = {"steps": steps, "batch_size": batch_size, "accumulation": accumulation, "seq_len": seq_len, "lr": lr,
               "checkpoint_dir": checkpoint_dir, "checkpoint_every": checkpoint_every, "log_every": log_every,
               "seed": seed, "ep": ep, "recompute": recompute, "keep_checkpoints": keep_checkpoints,
               "tensorboard_dir": tensorboard_dir, "wandb_project": wandb_project}
    try:
        cfg = dataclasses.replace(base, data=data, **{k: v for k, v in changes.items() if v is not None})
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    result = run_training(cfg, resume=not no_resume, until=until, log=lambda line: click.echo(line))
    rank = dist.get_rank()
    shutdown_distributed()  # this process joined a process group; it leaves it, so exit is clean
    if result.records and rank == 0:
        first, last = result.records[0], result.records[-1]
        rest = result.records[1:] or result.records  # the first step also sets the stream up
        wait = sum(r["data_wait"] for r in rest) / sum(r["seconds"] for r in rest)
        click.echo(f"done: step {result.steps}, loss {first['loss']:.4f} -> {last['loss']:.4f}, data wait "
                   f"{wait:.2%} of step time after the first step"
                   + (f", checkpoint {result.checkpoint}" if result.checkpoint else ""))


@click.command("export", context_settings={"max_content_width": 100})
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False))
@click.option("--to", "to", required=True, metavar="DIR", help="Write model.safetensors and config.json here.")
def export(checkpoint, to) -> None:
    """Write CHECKPOINT (a step-NNNNNNNN directory, or a run directory: its latest) as one model.

    One process, no process group: every sharded tensor is reassembled whole into model.safetensors, with
    config.json. Load it back with marin_train.export.load_exported(DIR), or any safetensors reader.

    \b
    EXAMPLES
      marin-train export out/run --to out/model
      marin-train export out/run/step-00000050 --to out/model-50
    """
    from marin_train.export import export_checkpoint  # safetensors only where exporting

    try:
        path = resolve_checkpoint(checkpoint)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="CHECKPOINT") from None
    click.echo(f"exported {path} to {export_checkpoint(path, to)}")


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


class _TrainByDefault(click.Group):
    """A group whose default command is ``train``: arguments that do not start with a command name go to it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["train", *args]
        return super().parse_args(ctx, args)


@click.group("marin-train", cls=_TrainByDefault, context_settings={"max_content_width": 100})
def group() -> None:
    """Train the Marin MoE model (the default command: marin-train --data DIR ...), export a checkpoint, or
    plot a run's metrics.

    \b
    EXAMPLES
      marin-train --data out/sample --steps 50 --checkpoint-dir out/run
      marin-train export out/run --to out/model
      marin-train plot out/run
    """


group.add_command(command)
group.add_command(export)
group.add_command(plot)


def main(argv: list[str] | None = None, prog_name: str = "marin-train") -> None:
    """``marin-train``: `group`, with marin-data's error messages and exit codes."""
    try:
        rv = group.main(args=sys.argv[1:] if argv is None else argv, prog_name=prog_name, standalone_mode=False)
        sys.exit(rv if isinstance(rv, int) else 0)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 - known errors become one line and an exit code
        known = describe(e)
        if known is None:
            raise
        click.secho(f"error: {known[0]}", err=True, fg="red")
        sys.exit(known[1])
