"""MoE block forward+backward on CPU: the marin:: op chain vs naive per-expert loops.

All of them run the same ``MoE`` module (same parameters, same routing) on the same tokens. "ops" goes through
``route_topk -> permute -> grouped experts (torch._grouped_mm) -> unpermute``. The naive versions are
``marin_model.naive`` (torch routing, then a Python loop over experts): "naive" gathers each expert's tokens,
runs it and ``index_add``s the weighted result (Mixtral-style reference code), with one view per expert as a
ModuleList of experts would; "naive-stacked" is the same loop indexing the stacked [E,...] weights inside the
loop, as code written against stacked expert tensors does, so every expert's backward writes a zero-filled
gradient the size of all the experts; "naive-mask" is the literal per-expert masking baseline: every
expert runs on every token and its output is multiplied by a dense [T,E] gate, zero where the token is not
routed to it (E/k times the expert FLOPs).

"floor" is not a variant of the block but a yardstick for the op chain: the same step with the routing done
once, outside the timed step, and plain ``index_select`` gathers and a weighted sum in place of ``permute`` and
``unpermute`` (no custom op, no routing math, no gradient through the combine weights). It is what the step
would cost if the three ops and their backwards cost no more than the rows they move.

"dispatch" is the op chain with each op's body replaced by a copy of the output it gave on the first call with
those shapes (``register_kernel`` on "cpu", enabled only while this kind is timed): what the chain costs in
custom-op dispatch, autograd and output allocation alone, i.e. the floor for any CPU kernel behind these ops.

"mask/ops work" is the ratio of the two variants' GEMM work: every weight of the block's linear layers is one
multiply-add per token, masking uses all of them for every token and the op chain all but the (E-k)/E of the
routed experts' weights a token is not sent to (the same in the backward). It is not a bound on the time
ratio: masking also does E/k times the experts' element-wise work and loops over experts in Python.

One step = forward, a scalar loss with the z-loss, backward. The module is in eval mode so the balancing
statistics (which the naive versions do not gather) are not timed. Timing: ``torch.utils.benchmark.Timer
.blocked_autorange``; each repeat times them back to back; figures are medians over the repeats.
Default: one intra-op thread, because on a shared 2-core VM two OpenMP threads stall at every GEMM barrier
whenever a neighbour takes a core (the same grouped GEMMs measured 2-5 s with 2 threads, 0.3-0.4 s with 1).
``--clock cpu`` times process CPU time instead of wall time: steadier on a busy machine.

    .venv/bin/python benchmarks/bench_moe_cpu.py                                  # the record: tiny (2k, 8k tokens), mid
    .venv/bin/python benchmarks/bench_moe_cpu.py --repeats 1 --min-run-time 0.2   # quick check
    .venv/bin/python benchmarks/bench_moe_cpu.py --threads 2 --dtype bfloat16     # other settings
"""

import argparse
import contextlib
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F
import torch.utils.benchmark as benchmark

from marin_model.config import PRESETS, with_overrides
from marin_model import ops
from marin_model.moe import MoE, permute_tokens, route
from marin_model.naive import naive_moe_forward

SIZES = {
    # name: (config, tokens per step). "mid" keeps Marin's proportions (latent = expert = shared width = D/2,
    # two shared experts) at 1/12 of its width, with 64 experts of which 8 are active.
    "tiny": (PRESETS["tiny"], 2048),
    "tiny-8k": (PRESETS["tiny"], 8192),  # the same block on 4x the tokens: what per-op fixed costs weigh
    "mid": (with_overrides(PRESETS["tiny"], d_model=512, moe_num_experts=64, moe_top_k=8, moe_expert_dim=256,
                           moe_latent_dim=256, moe_num_shared=2, moe_shared_dim=256), 2048),
}
# The naive kinds: naive_moe_forward options.
NAIVE_OPTIONS = {"naive": {}, "naive-stacked": dict(index_stacked=True), "naive-mask": dict(dense_mask=True)}
KINDS = ("ops", "dispatch", "floor", *NAIVE_OPTIONS)
OPS = (ops.route_topk, ops.route_topk_backward, ops.permute, ops.unpermute, ops.unpermute_backward)


def make_step(moe: MoE, x_TD: torch.Tensor, kind: str):
    probe_TD = torch.randn_like(x_TD)
    if kind == "floor":
        return make_floor_step(moe, x_TD, probe_TD)

    def step():
        if kind in ("ops", "dispatch"):
            out_TD, stats = moe(x_TD)
            z_loss = stats.z_loss
        else:
            out_TD, z_loss = naive_moe_forward(moe, x_TD, **NAIVE_OPTIONS[kind])
        ((out_TD.float() * probe_TD).sum() + z_loss).backward()
        moe.zero_grad(set_to_none=True)

    return step


def make_floor_step(moe: MoE, x_TD: torch.Tensor, probe_TD: torch.Tensor):
    """The "floor" (module docstring): the block's GEMMs and row movement with the routing precomputed."""
    m, T = moe.cfg, x_TD.shape[0]
    with torch.no_grad():
        routing = route(F.linear(x_TD, moe.router.weight), moe.bias_E, m)
        _, meta = permute_tokens(moe.down(x_TD), routing.expert_ids_TK, m.num_experts, m.align, 0)
    src_R = meta.src_of_R.long().clamp(min=0) // m.top_k  # padding rows (src -1) read token 0: the same traffic
    row_N = meta.row_of_TK.reshape(-1).long()

    def step():
        logits_TE = F.linear(x_TD, moe.router.weight)
        y_RL = moe.experts(moe.down(x_TD).index_select(0, src_R), meta.offsets_E1)
        y_TL = (y_RL.index_select(0, row_N).view(T, m.top_k, -1) * routing.weights_TK[..., None]).sum(1)
        out_TD = moe.up(y_TL) + moe.shared(x_TD)
        ((out_TD * probe_TD).sum() + logits_TE.sum()).backward()
        moe.zero_grad(set_to_none=True)

    return step


def install_copying_kernels() -> None:
    """Registers the "dispatch" kind's CPU kernels (module docstring); `copying_kernels` turns them off."""
    for op in OPS:
        outputs = {}

        def copy_of_first_output(*args, op=op, outputs=outputs):
            key = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)
            if key not in outputs:
                with op.set_kernel_enabled("cpu", False):  # the reference, once
                    outputs[key] = op(*args)
            out = outputs[key]
            return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()

        op.register_kernel("cpu", copy_of_first_output)


@contextlib.contextmanager
def copying_kernels(enabled: bool):
    """The ops run the copying kernels inside this block when `enabled`, their reference otherwise."""
    with contextlib.ExitStack() as stack:
        for op in () if enabled else OPS:
            stack.enter_context(op.set_kernel_enabled("cpu", False))
        yield


def work_ratio(moe: MoE) -> float:
    """Multiply-adds per token of the masking loop over those of the op chain ("mask/ops work")."""
    m = moe.cfg
    block = sum(p.numel() for p in moe.parameters())
    routed = sum(p.numel() for p in moe.experts.parameters())
    return block / (block - routed + routed * m.top_k / m.num_experts)


def run(sizes: list[str], repeats: int, min_run_time: float, dtype: torch.dtype, clock) -> list[dict]:
    rows = []
    for name in sizes:
        cfg, tokens = SIZES[name]
        torch.manual_seed(0)
        moe = MoE(cfg).to(dtype).eval()
        x_TD = torch.randn(tokens, cfg.d_model, dtype=dtype, requires_grad=True)
        times = {kind: [] for kind in KINDS}
        for _ in range(repeats):
            for kind in KINDS:
                step = make_step(moe, x_TD, kind)
                with copying_kernels(kind == "dispatch"):
                    step()  # warm-up (the first call probes grouped GEMM support, and fills the copies)
                    timer = benchmark.Timer(stmt="step()", globals={"step": step}, timer=clock,
                                            num_threads=torch.get_num_threads())
                    times[kind].append(timer.blocked_autorange(min_run_time=min_run_time).median)
        ms = {kind: statistics.median(t) * 1e3 for kind, t in times.items()}
        rows.append(dict(size=name, tokens=tokens, cfg=cfg, ms=ms, work=work_ratio(moe)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,tiny-8k,mid", help=f"comma-separated, from {', '.join(SIZES)}")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds per blocked_autorange")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1, see above)")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    args = parser.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = set(sizes) - set(SIZES)
    if unknown or args.repeats < 1 or args.threads < 1:
        parser.error(f"unknown sizes {sorted(unknown)}" if unknown else "--repeats and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    install_copying_kernels()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(f"torch {torch.__version__}, {args.threads} thread(s) of {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}, {args.dtype}, {args.clock} clock, grouped GEMM "
          f"{'present' if hasattr(torch, '_grouped_mm') else 'absent'}, median of {args.repeats}")
    print("| size | tokens | E | k | d_model | latent | " + " | ".join(f"{kind} (ms)" for kind in KINDS)
          + " | " + " | ".join(f"vs {kind}" for kind in NAIVE_OPTIONS)
          + " | mask/ops work | mask/dispatch | mask/floor |")
    print("|---|---:|---:|---:|---:|---:|" + "---:|" * (len(KINDS) + len(NAIVE_OPTIONS) + 3))
    for r in run(sizes, args.repeats, args.min_run_time, getattr(torch, args.dtype), clock):
        m, ms = r["cfg"].moe, r["ms"]
        print(f"| {r['size']} | {r['tokens']} | {m.num_experts} | {m.top_k} | {r['cfg'].d_model} | {m.latent_dim} | "
              + " | ".join(f"{ms[kind]:.1f}" for kind in KINDS) + " | "
              + " | ".join(f"{ms[kind] / ms['ops']:.2f}x" for kind in NAIVE_OPTIONS) + f" | {r['work']:.2f}x | "
              + f"{ms['naive-mask'] / ms['dispatch']:.2f}x | {ms['naive-mask'] / ms['floor']:.2f}x |")


if __name__ == "__main__":
    main()
