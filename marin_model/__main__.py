"""``python -m marin_model --preset tiny``: parameter counts, a timed forward/backward, router statistics.

EXAMPLES
    python -m marin_model --preset tiny
    python -m marin_model --preset tiny --batch 8 --seq 128 --steps 5 --capacity-factor 1.0
    python -m marin_model --preset marin-535b-a23b      # counts only: the model is counted on the meta device
"""

import argparse
import statistics
import time

import torch

from marin_model.config import PRESETS, get_preset, with_overrides
from marin_model.params import count_params
from marin_model.model import Transformer

# Above this many parameters the demo only counts (fp32 weights, grads and activations must fit in memory).
MAX_RUN_PARAMS = 200_000_000


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m marin_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    parser.add_argument("--seq", type=int, default=64, help="tokens per sequence (default 64)")
    parser.add_argument("--steps", type=int, default=3, help="timed forward/backward steps (default 3)")
    parser.add_argument("--capacity-factor", type=float, default=None, help="override the preset's (0 = no drops)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.batch, args.seq, args.steps) < 1:
        parser.error("--batch, --seq and --steps must be at least 1")
    cfg = get_preset(args.preset)
    if args.capacity_factor is not None:
        cfg = with_overrides(cfg, moe_capacity_factor=args.capacity_factor)

    counts = count_params(cfg)
    print(f"preset {args.preset}: parameters (counted on the meta device)")
    for label, value in [("total", counts.total), ("embedding", counts.embedding),
                         ("non-embedding", counts.non_embedding), ("active", counts.active),
                         ("active non-embedding", counts.active_non_embedding),
                         ("published total (+ unnamed D x E per layer)", counts.published_total),
                         ("published active non-embedding", counts.published_active_non_embedding)]:
        print(f"  {label:<46} {value:>19,}")
    if counts.total > MAX_RUN_PARAMS:
        print(f"forward/backward skipped: {counts.total:,} parameters exceed this demo's {MAX_RUN_PARAMS:,}")
        return

    torch.manual_seed(args.seed)
    model = Transformer(cfg).train()
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1))
    segments = (torch.arange(args.seq) >= args.seq // 3).long().expand(args.batch, -1)  # two documents a row
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        out = model(tokens[:, :-1], tokens[:, 1:], segment_ids_BS=segments)
        out.loss.backward()
        times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
        model.update_router_bias()
    print(f"forward+backward of {args.batch}x{args.seq} tokens: median {statistics.median(times) * 1e3:.1f} ms "
          f"over {args.steps} steps (loss {out.loss.item():.4f}, cross-entropy {out.ce_loss.item():.4f})")
    print(f"router (last step): z-loss {out.z_loss.item():.4f} (coefficient {cfg.moe.z_loss:g}); per-expert load "
          f"as a fraction of the {args.batch * args.seq * cfg.moe.top_k} token copies")
    for i, stats in enumerate(out.router):
        load = stats.counts_E.float() / stats.counts_E.sum()
        shown = " ".join(f"{v:.3f}" for v in load[:16].tolist()) + (" ..." if load.numel() > 16 else "")
        print(f"  layer {i:>2}: load [{shown}] max/mean {load.max().item() * load.numel():.2f}  "
              f"dropped {stats.dropped.item():.3f}  z-loss {stats.z_loss.item():.4f}")


if __name__ == "__main__":
    main()
