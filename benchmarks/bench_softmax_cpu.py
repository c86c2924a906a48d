"""torch.softmax over a narrow last dim on CPU, plain vs padded to 16 with -inf (``marin_model.ops.contract.softmax``).

``route_topk_backward`` takes the softmax of the router logits, [tokens, experts], and the tiny preset has 8
experts. torch's CPU kernel takes a slow path when the last dim is narrower than 16 (seen on AVX-512, torch
2.13), so ``contract.softmax`` pads such rows with -inf (exp(-inf) = 0: the same sum) and slices the result.
One intra-op thread, ``torch.utils.benchmark`` medians.

    .venv/bin/python benchmarks/bench_softmax_cpu.py
"""

import torch
import torch.utils.benchmark as benchmark

from marin_model.ops.contract import softmax as padded_softmax


def main() -> None:
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, 1 thread")
    print("| tokens x width | torch.softmax (µs) | padded (µs) | plain / padded |")
    print("|---|---:|---:|---:|")
    for width in (2, 4, 8, 15, 16, 64):
        x_TE = torch.randn(2048, width)
        times = [benchmark.Timer("f(x)", globals={"f": f, "x": x_TE}).blocked_autorange(min_run_time=0.5).median
                 for f in (lambda x: torch.softmax(x, dim=-1), padded_softmax)]
        print(f"| 2048 x {width} | {times[0] * 1e6:.0f} | {times[1] * 1e6:.0f} | {times[0] / times[1]:.2f}x |")


if __name__ == "__main__":
    main()
