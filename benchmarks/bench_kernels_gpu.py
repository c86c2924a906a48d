"""GPU benchmark of the cuda/ kernels against plain torch, printed as a Markdown table.

For each model shape and token count it times ``marin::route_topk``, ``marin::permute`` and
``marin::unpermute`` on CUDA tensors (which dispatch to cuda/ through marin_model/cuda/dispatch.py) against

* **torch**: the best plain torch we know for the same outputs, without host synchronisation: routing by
  ``torch.topk`` (a softmax only where the mode uses one), argsort + index_select to permute, index_add
  to combine; every ratio in the table is against this baseline ("vs torch"), and
* **compiled** (with ``--compile``): the same functions under ``torch.compile(dynamic=True)``.

"graph" is the op replayed from a CUDA graph: the kernels' time without Python and dispatch.

Timing: CUDA events, median of many runs after warm-up, through ``triton.testing.do_bench`` when Triton is
installed (it clears L2 before every run), else torch.cuda.Event pairs with an explicit L2 flush; in both,
successive runs also rotate through several copies of the inputs. Bandwidth is the op's memory-traffic floor
over its median time, against a measured device-to-device copy: the floor of permute and unpermute is
``T*H*s + T*k*H*s`` bytes (s = bytes per element), of route_topk ``T*E*4`` plus its outputs.

EXAMPLES
    python benchmarks/bench_kernels_gpu.py                       # every shape, T = 4096, 16384, 65536
    python benchmarks/bench_kernels_gpu.py --tokens 4096 --compile
    python benchmarks/bench_kernels_gpu.py --out out/bench_kernels.md --budget-s 240
    python benchmarks/bench_kernels_gpu.py --device cpu --tokens 128 --shapes OLMoE   # smoke test
"""

import argparse
import datetime
import itertools
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from marin_model import ops  # noqa: E402
from marin_model.cuda import dispatch  # noqa: E402


@dataclass(frozen=True)
class Shape:
    name: str
    experts: int        # E
    top_k: int          # k
    hidden: int         # H, the width of the permuted rows
    mode: str           # routing mode
    n_group: int = 1
    topk_group: int = 1


SHAPES = [
    Shape("Marin 535B latent", 384, 8, 3072, "sigmoid"),
    Shape("Marin 535B d_model", 384, 8, 6144, "sigmoid"),
    Shape("DeepSeek-V3", 256, 8, 7168, "sigmoid", n_group=8, topk_group=4),
    Shape("Mixtral 8x7B", 8, 2, 4096, "topk_softmax"),
    Shape("OLMoE", 64, 8, 2048, "softmax_topk"),
]
SCALE = 2.5
L2_FLUSH_BYTES = 256 << 20


# ------------------------------------------------------------------------------------------- torch baselines
def torch_route_topk(logits, bias, k: int, mode: str, n_group: int, topk_group: int):
    """topk routing: the softmax only for the modes that use it, an optional group limit, topk, the gates,
    counts by index_add and lse (the op returns it, so the baseline computes it too)."""
    logits = logits.float()
    probs = torch.softmax(logits, -1) if mode == "softmax_topk" else None
    score = (probs if probs is not None else logits) + bias
    if n_group > 1:
        T, E = score.shape
        group_score = score.view(T, n_group, -1).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(
            1, group_score.topk(topk_group, dim=-1).indices, True)
        score = score.masked_fill(~keep.repeat_interleave(E // n_group, dim=1), float("-inf"))
    ids = score.topk(k, dim=-1).indices
    if mode == "topk_softmax":
        weights = torch.softmax(logits.gather(1, ids), -1)
    else:
        gates = torch.sigmoid(logits.gather(1, ids)) if mode == "sigmoid" else probs.gather(1, ids)
        weights = gates / gates.sum(-1, keepdim=True)
    counts = torch.zeros(score.shape[1], dtype=torch.int32, device=score.device).index_add_(
        0, ids.flatten(), torch.ones(ids.numel(), dtype=torch.int32, device=score.device))
    return ids.int(), weights * SCALE, counts, torch.logsumexp(logits, -1)


def torch_permute(x, ids, num_experts: int):
    """Stable argsort of the flat expert ids; index_select gathers each copy's token row."""
    order = torch.argsort(ids.flatten(), stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=x.device).index_add_(
        0, ids.flatten().long(), torch.ones(ids.numel(), dtype=torch.int64, device=x.device))
    return x.index_select(0, order // ids.shape[1]), order, torch.cumsum(counts, 0)


def torch_unpermute(routed, order, weights, tokens: int):
    """index_add of the weighted rows into their tokens, in fp32."""
    out = torch.zeros(tokens, routed.shape[1], dtype=torch.float32, device=routed.device)
    scaled = routed.float() * weights.flatten()[order][:, None]
    return out.index_add_(0, order // weights.shape[1], scaled).to(routed.dtype)


# --------------------------------------------------------------------------------------------------- timing
class Timer:
    """Median milliseconds of fn(*inputs), inputs rotating through `sets`."""

    def __init__(self, device: str, warmup_ms: float, rep_ms: float):
        self.device, self.warmup_ms, self.rep_ms = device, warmup_ms, rep_ms
        self.do_bench, self.why_not_triton = None, "no triton"
        if device == "cuda":
            try:
                from triton.testing import do_bench

                # Triton compiles its driver helper with the host C compiler and Python's headers on first use:
                # try it once, so a machine without the headers still gets a table.
                probe = torch.zeros(1, device="cuda")
                do_bench(lambda: probe.add_(1), warmup=1, rep=1)
                self.do_bench = do_bench
            except Exception as error:  # noqa: BLE001 - any failure: the events below time the same thing
                self.why_not_triton = f"{type(error).__name__}: {str(error)[:200]}"
                self.flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    @property
    def method(self) -> str:
        if self.device != "cuda":
            return "time.perf_counter (CPU smoke test)"
        if self.do_bench:
            return "triton.testing.do_bench"
        return f"torch.cuda.Event with an L2 flush (triton's do_bench unavailable: {self.why_not_triton})"

    def __call__(self, fn, sets) -> float:
        cycle = itertools.cycle(sets)

        def call():
            return fn(*next(cycle))

        if self.do_bench is not None:
            return self.do_bench(call, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median")
        if self.device != "cuda":
            call()
            times = []
            for _ in range(5):
                start = time.perf_counter()
                call()
                times.append((time.perf_counter() - start) * 1e3)
            return statistics.median(times)
        for _ in range(5):
            call()
        times = []
        deadline = time.perf_counter() + self.rep_ms / 1e3
        while len(times) < 10 or (time.perf_counter() < deadline and len(times) < 1000):
            self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)


def copy_bandwidth(timer: Timer, device: str) -> float:
    """Bytes read + written per second by a device-to-device copy of 1 GiB (the ceiling for row movers)."""
    n = (1 << 30) if device == "cuda" else (64 << 20)
    sets = [(torch.empty(n, dtype=torch.uint8, device=device), torch.empty(n, dtype=torch.uint8, device=device))]
    ms = timer(lambda dst, src: dst.copy_(src), sets)
    return 2 * n / (ms / 1e3)


# ---------------------------------------------------------------------------------------------------- rows
def input_sets(shape: Shape, tokens: int, device: str, count: int):
    g = torch.Generator(device=device).manual_seed(tokens + shape.experts)
    sets = []
    for _ in range(count):
        logits = torch.randn(tokens, shape.experts, generator=g, device=device)
        bias = torch.randn(shape.experts, generator=g, device=device) * (0.01 if shape.mode == "softmax_topk" else 0.1)
        x = torch.randn(tokens, shape.hidden, generator=g, device=device).bfloat16()
        sets.append((logits, bias, x))
    return sets


def sets_for(shape: Shape, tokens: int) -> int:
    """Enough input copies that one pass over them is several times an H200's 60 MB of L2 (at most 4)."""
    per_set = tokens * shape.hidden * 2 * (1 + shape.top_k)
    return max(2, min(4, -(-3 * (60 << 20) // max(per_set, 1))))


def graph_ms(timer: Timer, fn, inputs, device: str):
    """Median ms of replaying fn(*inputs) from a CUDA graph (None on the CPU): kernel time without Python."""
    if device != "cuda":
        return None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(*inputs)  # warm up outside the capture (allocator, library)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*inputs)
    return timer(graph.replay, [()])


def bench_shape(shape: Shape, tokens: int, timer: Timer, compiled: dict, device: str, align: int = 1):
    """Times the three ops for one shape; returns table rows (op, ours ms, graph ms, torch ms, compiled ms,
    bytes, align)."""
    k, E, H = shape.top_k, shape.experts, shape.hidden
    sets = input_sets(shape, tokens, device, sets_for(shape, tokens))
    route_args = (k, shape.mode, SCALE, True, shape.n_group, shape.topk_group)
    staged = []
    for logits, bias, x in sets:
        ids, weights, _, _ = ops.route_topk(logits, bias, *route_args)
        routed, row_of, src_of, _ = ops.permute(x, ids, E, align, 0)
        base_routed, order, _ = torch_permute(x, ids, E)
        staged.append((logits, bias, x, ids, weights, routed, row_of, src_of, base_routed, order))
    check_agreement(shape, staged[0], route_args, align)

    def route_ours(logits, bias, *_):
        return ops.route_topk(logits, bias, *route_args)

    def route_torch(fn):
        return lambda logits, bias, *_: fn(logits, bias, k, shape.mode, shape.n_group, shape.topk_group)

    def permute_ours(logits, bias, x, ids, *_):
        return ops.permute(x, ids, E, align, 0)

    def permute_torch(fn):
        return lambda logits, bias, x, ids, *_: fn(x, ids, E)

    def unpermute_ours(logits, bias, x, ids, weights, routed, row_of, src_of, *_):
        return ops.unpermute(routed, row_of, src_of, weights)

    def unpermute_torch(fn):
        return lambda logits, bias, x, ids, weights, routed, row_of, src_of, base_routed, order: fn(
            base_routed, order, weights, tokens)

    moved = tokens * H * 2 * (1 + k)
    jobs = [("route_topk", route_ours, torch_route_topk, route_torch, tokens * E * 4 + tokens * (8 * k + 4)),
            ("permute", permute_ours, torch_permute, permute_torch, moved),
            ("unpermute", unpermute_ours, torch_unpermute, unpermute_torch, moved)]
    if align > 1:  # the padding rows are what this row measures; routing does not depend on align
        jobs = jobs[1:]
    rows = []
    for name, ours, base, wrap, floor_bytes in jobs:
        ours_ms = timer(ours, staged)
        replay_ms = graph_ms(timer, ours, staged[0], device)
        torch_ms = timer(wrap(base), staged)
        compiled_ms = timer(wrap(compiled[name]), staged) if compiled else None
        rows.append((name, ours_ms, replay_ms, torch_ms, compiled_ms, floor_bytes, align))
    return rows


def check_agreement(shape: Shape, staged, route_args, align: int) -> None:
    """The baselines must do the same work: same expert ids, same permuted rows, same combined output."""
    logits, bias, x, ids, weights, routed, row_of, src_of, base_routed, order = staged
    base_ids = torch_route_topk(logits, bias, shape.top_k, shape.mode, shape.n_group, shape.topk_group)[0]
    differ = (ids != base_ids).any(-1).float().mean().item()  # topk's tie order, softmax rounding: near-ties
    if differ > 0:
        print(f"note: {shape.name}: the torch baseline routes {100 * differ:.3f}% of tokens differently",
              file=sys.stderr)
    if differ > 0.01:
        raise SystemExit(f"{shape.name}: the torch baseline does not choose the experts marin::route_topk does")
    kept = routed[src_of >= 0] if align > 1 else routed[: ids.numel()]
    if not torch.equal(kept, base_routed):
        raise SystemExit(f"{shape.name}: the torch baseline permuted rows differently")
    out, base_out = ops.unpermute(routed, row_of, src_of, weights), torch_unpermute(base_routed, order, weights,
                                                                                    x.shape[0])
    torch.testing.assert_close(out.float(), base_out.float(), rtol=2e-2, atol=2e-2)


def markdown(results, copy_bps: float) -> str:
    lines = ["| shape | T | align | op | ours (µs) | graph (µs) | torch (µs) | compiled (µs) | vs torch | vs compiled "
             "| floor GB/s | % of copy |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for shape, tokens, (name, ours, replay, base, comp, floor_bytes, align) in results:
        bw = floor_bytes / (ours / 1e3) / 1e9
        cell = lambda ms: f"{ms * 1e3:.1f}" if ms else "—"  # noqa: E731
        vs_comp = f"{comp / ours:.1f}x" if comp else "—"
        lines.append(f"| {shape.name} (E={shape.experts}, k={shape.top_k}, H={shape.hidden}) | {tokens} | {align} "
                     f"| {name} | {cell(ours)} | {cell(replay)} | {cell(base)} | {cell(comp)} | {base / ours:.1f}x "
                     f"| {vs_comp} | {bw:.0f} | {100 * bw * 1e9 / copy_bps:.0f}% |")
    return "\n".join(lines)


def write_report(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".part")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384, 65536], help="T values (goal rows first)")
    parser.add_argument("--shapes", nargs="+", default=None, help="shape names (prefixes), default all")
    parser.add_argument("--compile", action="store_true", help="add the torch.compile(dynamic=True) baseline (slow)")
    parser.add_argument("--align", type=int, default=128, help="one extra permute/unpermute row at this align "
                        "(the first shape, the first T); 1 for none")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test of this script")
    parser.add_argument("--warmup-ms", type=float, default=25.0)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting new rows after this long")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown report here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device (use --device cpu for a smoke test)", file=sys.stderr)
        return 2
    shapes = [s for s in SHAPES if args.shapes is None or any(s.name.startswith(p) for p in args.shapes)]
    if args.device == "cuda" and not dispatch.status()["registered"]:
        print(f"warning: CUDA kernels not active ({dispatch.status()['reason']}); 'ours' is the reference",
              file=sys.stderr)
    started, timer = time.perf_counter(), Timer(args.device, args.warmup_ms, args.rep_ms)
    compiled = None if not args.compile else {
        "route_topk": torch.compile(torch_route_topk, dynamic=True),
        "permute": torch.compile(torch_permute, dynamic=True),
        "unpermute": torch.compile(torch_unpermute, dynamic=True)}
    copy_bps = copy_bandwidth(timer, args.device)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    header = (f"Kernel benchmark, {datetime.date.today().isoformat()}, {device_name}, torch {torch.__version__}, "
              f"timer: {timer.method}; bf16 rows, fp32 logits, no capacity limit. \"vs torch\": against the best "
              f"plain torch (topk routing, argsort permute, index_add combine)"
              f"{'; vs compiled: the same under torch.compile' if compiled else ''}.\n"
              f"Device-to-device copy: {copy_bps / 1e9:.0f} GB/s (read + write).\n\n")
    results, skipped = [], []
    plan = [(tokens, shape, 1) for tokens, shape in itertools.product(args.tokens, shapes)]  # first T first
    if args.align > 1 and plan:
        plan.insert(len(shapes), (args.tokens[0], shapes[0], args.align))  # after the first T's rows
    for tokens, shape, align in plan:
        if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
            skipped.append(f"{shape.name} T={tokens} align={align}")
            continue
        for row in bench_shape(shape, tokens, timer, compiled, args.device, align):
            results.append((shape, tokens, row))
        print(f"done: {shape.name} T={tokens} align={align} ({time.perf_counter() - started:.0f} s)", file=sys.stderr,
              flush=True)
        if args.out is not None:  # after every shape, so a run cut short still leaves its rows
            write_report(args.out, header + markdown(results, copy_bps) + "\n\n(partial: still running)")
    report = header + markdown(results, copy_bps) + (f"\n\nNot run (over --budget-s): {', '.join(skipped)}"
                                                     if skipped else "")
    print(report)
    if args.out is not None:
        write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
