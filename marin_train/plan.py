"""The layout of a training run, computed: per-GPU memory, FLOPs per token, total FLOPs and the implied MFU.

``python -m marin_train.plan --preset marin-535b-a23b --gpus 792 --gpu-memory-gb 186 --ep 64 --seq-len 4096
--global-batch 11264``

``--schedule FILE`` (a run's data schedule, `marin_train.schedule`) takes the steps, global batch and
sequence length from the file and adds its phases: where each starts (step and sequence, rounded to whole
mixture blocks as the loader runs them), its tokens and its FLOPs, next to the totals. With ``--data CORPUS``
(and the run's ``--seed``) it also shows what the run will train on, before it starts: per subset the
sequences and tokens served up to ``--until STEP`` (default: the end), the epochs, the fraction seen, the
first step that serves it, and the subsets never served (`marin_data.loader.trace.exposure`).

The layout is `marin_train.parallel`'s: every dense parameter sharded over all ranks, the routed experts
split over ``ep`` ranks and each sharded (on its second dim) over the world/ep ranks that own it. The global
batch must divide over the data-parallel ranks (every rank reads its own sequences), so the plan trains on the
largest world <= ``gpus`` that the batch and ``ep`` divide, and leaves the rest as spares.

Parameter bytes per rank are exact: `param_shard_numel` applies FSDP's chunking (rank 0 holds ceil(d/n) rows
of a dim of d split n ways) to the real module's shapes, built on the meta device; a test checks it against
``fully_shard`` under a fake process group. Activations are an estimate from the tensors a block saves for
its backward pass (`activation_bytes_per_token`), not a measurement.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import torch

from marin_data.cli._errors import describe
from marin_model.config import ModelConfig, get_preset
from marin_model.model import Transformer
from marin_model.params import count_params
from marin_train.config import DataConfig, TrainConfig
from marin_train.schedule import Schedule, load_schedule

__all__ = ["Plan", "PhasePlan", "activation_bytes_per_token", "flops_per_token", "make_plan", "param_shard_numel",
           "phase_plans"]

PUBLISHED_FLOPS = {"marin-535b-a23b": 2.7e24}  # the published training compute of the hero run
PEAK_BF16 = 2.5e15  # GB200, dense bf16 FLOP/s per GPU: 180 PFLOPS per NVL72 rack of 72 GPUs (NVIDIA's sheet)
GiB = 1 << 30


def param_shard_numel(cfg: ModelConfig, world: int, ep: int) -> int:
    """Parameters rank 0 holds (the most any rank holds) under `marin_train.parallel`'s layout."""
    with torch.device("meta"):
        model = Transformer(cfg)
    total = 0
    for name, p in model.named_parameters():
        if ".experts." in name:  # [E, a, b]: E/ep experts, split over world/ep ranks on dim 1, else dim 0
            E, a, b = p.shape
            dp = world // ep
            total += (E // ep) * (a // dp) * b if a % dp == 0 else math.ceil(E // ep / dp) * a * b
        else:
            total += math.ceil(p.shape[0] / world) * (p.numel() // p.shape[0])
    return total


def flops_per_token(cfg: ModelConfig, seq_len: int) -> tuple[float, float]:
    """Training FLOPs per token (forward + backward = 3 x forward): (matmuls with weights, attention scores).

    Matmuls: 6 x the active parameters that multiply (k of E experts, router, head; not the embedding lookup,
    not the norms). Attention: 3 x 2 x 2 x heads x head_dim x the mean causal context of a layer (QK^T and
    AV), S/2 on a global layer, w - w^2/(2S) on a window layer of width w (for S >= w).
    """
    counts = count_params(cfg)
    norms = (2 * cfg.n_layers + 1) * cfg.d_model
    matmul = counts.active_non_embedding - norms + cfg.vocab_size * cfg.d_model
    window = cfg.window if seq_len > cfg.window else seq_len
    local = window - window ** 2 / (2 * seq_len) if seq_len > cfg.window else (seq_len + 1) / 2
    contexts = sum((seq_len + 1) / 2 if cfg.is_global(i) else local for i in range(cfg.n_layers))
    return 6.0 * matmul, 12.0 * cfg.n_heads * cfg.head_dim * contexts


def activation_bytes_per_token(cfg: ModelConfig, recompute: bool) -> float:
    """Bytes of activations kept for the backward pass per token (bf16, fp32 router logits), over all layers.

    Per layer without recompute: the block input and both norm outputs (3D), q, k, v and the attention output
    (2 Hq d + 2 Hkv d), the latent down-projection and its routed copies, each expert's gate/up and SwiGLU
    output and its result (L + k(2L + 3F)), the unpermuted sum (L), the shared experts' hidden state (3 Fs),
    and the router's fp32 logits (E). With recompute only the block input is kept, plus one block's full set
    during its backward pass. The head's logits (V, bf16 and fp32 for the loss) are counted in both.
    """
    m, D = cfg.moe, cfg.d_model
    L = m.latent_dim or D
    kv = max(cfg.n_kv_heads, cfg.n_kv_heads_global)
    block = 2 * (3 * D + 2 * cfg.n_heads * cfg.head_dim + 2 * kv * cfg.head_dim + L
                 + m.top_k * (2 * L + 3 * m.expert_dim) + L + 3 * m.num_shared * m.shared_dim) + 4 * m.num_experts
    head = 6 * cfg.vocab_size
    if recompute:
        return cfg.n_layers * 2 * D + block + head
    return cfg.n_layers * block + head


@dataclass(frozen=True)
class Plan:
    world: int  # GPUs that train (the rest are spares)
    ep: int
    micro_batch: int  # sequences per rank per micro-batch
    accumulation: int  # micro-batches per step
    param_numel: int  # per rank (rank 0, the most)
    memory: dict[str, float]  # per-GPU bytes by kind
    flops_per_token: float
    total_flops: float
    mfu: float  # model-FLOPs utilisation implied by the run time


def make_plan(cfg: ModelConfig, *, gpus: int, gpu_memory_gb: float, ep: int, seq_len: int, global_batch: int,
              tokens: float, days: float, peak: float = PEAK_BF16, recompute: bool = True) -> Plan:
    """The largest world <= ``gpus`` that ``global_batch`` and ``ep`` divide (raises if none); the largest
    micro-batch whose memory fits ``gpu_memory_gb``; the memory, FLOPs and MFU of that layout."""
    if cfg.moe.num_experts % ep:
        raise ValueError(f"--ep {ep} does not divide the {cfg.moe.num_experts} routed experts")
    world = next((w for w in range(gpus, 0, -1) if global_batch % w == 0 and w % ep == 0), None)
    if world is None:
        raise ValueError(f"no world size <= {gpus} divides the global batch {global_batch} and is a multiple of {ep}")
    per_rank = global_batch // world
    numel = param_shard_numel(cfg, world, ep)
    states = {"parameters (fp32 master)": 4 * numel, "gradients (fp32)": 4 * numel, "Adam moments (fp32)": 8 * numel}
    with torch.device("meta"):
        block = Transformer(cfg).blocks[0]
    block_numel = sum(p.numel() for n, p in block.named_parameters() if ".experts." not in n)
    expert_numel = sum(p.numel() for n, p in block.named_parameters() if ".experts." in n) // ep
    states["gathered bf16 blocks (2, prefetch)"] = 2 * 2 * (block_numel + expert_numel)
    micro = {mode: _largest_micro_batch(per_rank, sum(states.values()), seq_len * activation_bytes_per_token(cfg, mode),
                                        gpu_memory_gb * 1e9) for mode in (False, True)}
    memory = {**states, **{f"activations, {'' if mode else 'no '}recompute (micro-batch {micro[mode]})":
                           micro[mode] * seq_len * activation_bytes_per_token(cfg, mode) for mode in (False, True)}}
    matmul, attention = flops_per_token(cfg, seq_len)
    total = (matmul + attention) * tokens
    return Plan(world, ep, micro[recompute], per_rank // micro[recompute], numel, memory, matmul + attention, total,
                total / (gpus * peak * days * 86400))


@dataclass(frozen=True)
class PhasePlan:
    name: str
    start_step: float  # where it starts once rounded to a block (a fraction when mid-step)
    start_sequence: int
    sequences: int
    tokens: int
    flops: float


def phase_plans(schedule: Schedule, cfg: ModelConfig) -> list[PhasePlan]:
    """Each phase of ``schedule``: where it starts, what it trains on, and its FLOPs (`flops_per_token`)."""
    per_token = sum(flops_per_token(cfg, schedule.seq_len))
    return [PhasePlan(p.name or str(k), start / schedule.global_batch, start, n, n * schedule.seq_len,
                      per_token * n * schedule.seq_len)
            for k, (p, start, n) in enumerate(zip(schedule.phases, schedule.starts(), schedule.lengths()))]


def _print_phases(schedule: Schedule, cfg: ModelConfig) -> None:
    plans = phase_plans(schedule, cfg)
    block = schedule.mixture_block
    print(f"schedule {schedule.source}: {schedule.steps:,} steps x {schedule.global_batch:,} sequences x "
          f"{schedule.seq_len:,} tokens = {schedule.sequences * schedule.seq_len:,} tokens; mixture blocks of "
          f"{block:,} sequences (phase starts rounded to them)")
    rows = [(p.name, f"{p.start_step:,.2f}".rstrip("0").rstrip("."), f"{p.start_sequence:,}",
             f"{p.start_sequence / block:,.2f}".rstrip("0").rstrip("."), f"{p.tokens:,}", f"{p.tokens / 1e12:.3f}T",
             f"{p.flops:.4g}") for p in plans]
    total = sum(p.flops for p in plans)
    rows.append(("total", f"{schedule.steps:,}", f"{schedule.sequences:,}", f"{schedule.sequences / block:,.2f}",
                 f"{schedule.sequences * schedule.seq_len:,}", f"{schedule.sequences * schedule.seq_len / 1e12:.3f}T",
                 f"{total:.4g}"))
    headers = ("phase", "from step", "from sequence", "blocks", "tokens", "", "FLOPs")
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    for r in [headers, *rows]:
        print("  " + "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in
                               enumerate(zip(r, widths))))


def _print_exposure(schedule: Schedule, source: str, seed: int, until: int) -> None:
    from marin_data.loader.trace import exposure, never_served
    from marin_train.trace import format_exposure, open_stream

    cfg = TrainConfig(steps=schedule.steps, seq_len=schedule.seq_len, seed=seed,
                      data=DataConfig(source=source, schedule=schedule, **schedule.data_fields()))
    with open_stream(cfg, schedule.global_batch) as stream:
        table = exposure(stream, schedule.global_batch, until)
        print(f"exposure on {source} (seed {seed}): " + format_exposure(table, never_served(stream, table), until))


def _largest_micro_batch(per_rank: int, fixed: float, per_sequence: float, capacity: float) -> int:
    """The largest divisor of ``per_rank`` whose activations fit beside ``fixed`` bytes (1 if none does)."""
    return next((mb for mb in range(per_rank, 0, -1) if per_rank % mb == 0 and fixed + mb * per_sequence <= capacity), 1)


def main(argv: list[str] | None = None) -> None:
    """Print the plan; a known error (a corpus that cannot serve, a bad schedule) is one line and its exit
    code, as the commands give it (`marin_data.cli._errors`)."""
    try:
        _plan(argv)
    except Exception as e:  # noqa: BLE001 - known errors become one line and an exit code
        known = describe(e)
        if known is None:
            raise
        print(f"error: {known[0]}", file=sys.stderr)
        sys.exit(known[1])


def _plan(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="python -m marin_train.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="marin-535b-a23b")
    parser.add_argument("--gpus", type=int, default=792)
    parser.add_argument("--gpu-memory-gb", type=float, default=186.0)
    parser.add_argument("--ep", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--global-batch", type=int, default=11264, help="sequences per optimizer step")
    parser.add_argument("--tokens", type=float, default=18.75e12, help="training tokens (default 18.75T)")
    parser.add_argument("--days", type=float, default=90.0, help="wall-clock days of the run (default ~3 months)")
    parser.add_argument("--peak-tflops", type=float, default=PEAK_BF16 / 1e12, help="dense bf16 peak per GPU")
    parser.add_argument("--schedule", metavar="FILE", help="a run's data schedule: its steps, batch, seq_len and "
                                                           "phases (overrides --global-batch, --seq-len, --tokens)")
    parser.add_argument("--data", metavar="CORPUS", help="with --schedule: each subset's exposure on this corpus")
    parser.add_argument("--seed", type=int, default=0, help="with --data: the run's seed (default 0)")
    parser.add_argument("--until", type=int, metavar="STEP", help="with --data: up to this step (default: the end)")
    args = parser.parse_args(argv)
    if (args.data or args.until) and not args.schedule:
        parser.error("--data and --until need --schedule")
    cfg = get_preset(args.preset)
    if args.schedule:
        schedule = load_schedule(args.schedule)
        args.global_batch, args.seq_len = schedule.global_batch, schedule.seq_len
        args.tokens = schedule.sequences * schedule.seq_len
        _print_phases(schedule, cfg)
        if args.data:
            until = schedule.steps if args.until is None else args.until
            if not 1 <= until <= schedule.steps:
                parser.error(f"--until {until}: the schedule's steps are 1-{schedule.steps:,}")
            _print_exposure(schedule, args.data, args.seed, until)
    plan = make_plan(cfg, gpus=args.gpus, gpu_memory_gb=args.gpu_memory_gb, ep=args.ep, seq_len=args.seq_len,
                     global_batch=args.global_batch, tokens=args.tokens, days=args.days, peak=args.peak_tflops * 1e12)
    print(f"{args.preset}: {count_params(cfg).total:,} parameters; layout on {plan.world} of {args.gpus} GPUs "
          f"({args.gpus - plan.world} spare): FSDP over {plan.world}, EP {plan.ep} x {plan.world // plan.ep} "
          f"shards per expert")
    print(f"batch: {args.global_batch} sequences = {plan.world} ranks x {plan.micro_batch} x {plan.accumulation} "
          f"micro-batches of {args.seq_len} tokens (with recompute)")
    print(f"per GPU ({args.gpu_memory_gb:g} GB): {plan.param_numel:,} parameters")
    for kind, size in plan.memory.items():
        print(f"  {kind:<40} {size / 1e9:9.2f} GB")
    fixed = sum(v for k, v in plan.memory.items() if not k.startswith("activations"))
    for kind, size in plan.memory.items():
        if kind.startswith("activations"):
            print(f"  total with {kind[len('activations, '):]:<29} {(fixed + size) / 1e9:9.2f} GB")
    matmul, attention = flops_per_token(cfg, args.seq_len)
    print(f"FLOPs per token: {plan.flops_per_token:.4g} ({matmul:.4g} matmuls + {attention:.4g} attention)")
    print(f"total for {args.tokens:.4g} tokens: {plan.total_flops:.4g} FLOPs", end="")
    published = PUBLISHED_FLOPS.get(args.preset)
    print(f"; published {published:.2g}, ratio {plan.total_flops / published:.3f}" if published else "")
    print(f"MFU over {args.days:g} days on {args.gpus} GPUs at {args.peak_tflops:g} TFLOP/s bf16 each: {plan.mfu:.1%}")


if __name__ == "__main__":
    main()
