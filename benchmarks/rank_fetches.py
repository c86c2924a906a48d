"""How many ranks read each shard: `LoaderConfig.rank_rows` "position" vs "shard", at production scale.

Arithmetic on the real loader code over the index-only 23T-token corpus of `marin_data.testing.simulate`
(100,000 shards, 200 subsets; no data is read): for ``--steps`` consecutive global batches of ``W·b`` rows,
which shards each rank's rows read (`marin_data.loader.ranks.RankRows.rows`, then the shard holding each
row's window). A rank whose rows read a shard once must fetch all of it, so the number of ranks reading a
shard over the run is how many times it is fetched in all (with caches that hold each rank's working set);
the number of shards one rank reads in a step is the working set its cache must hold. With the caches of one
host sharing their fetches (`RemoteShardCache` ``peers``; ranks numbered host by host), a shard is fetched
once per host that reads it.

    .venv/bin/python benchmarks/rank_fetches.py                      # Marin: W=512, b=22, seq_len 4096
    .venv/bin/python benchmarks/rank_fetches.py --world 64 --steps 50

Not a timing: the figures are counts, the same on any machine.
"""

import argparse
import time

import numpy as np

from marin_data.loader import LoaderConfig, TokenStream
from marin_data.loader.ranks import RANK_ROWS, RankRows
from marin_data.testing.simulate import simulated_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=512, help="data-parallel ranks W")
    parser.add_argument("--batch", type=int, default=22, help="rows per rank b (Marin: 11,264 = 512 x 22)")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=200, help="consecutive global batches")
    parser.add_argument("--start-step", type=int, default=100_000)
    parser.add_argument("--mixture-block", type=int, default=1024)
    parser.add_argument("--shuffle-window", type=int, default=4)
    parser.add_argument("--ranks-per-host", type=int, default=8, help="ranks sharing one host's cache")
    args = parser.parse_args()
    world, b = args.world, args.batch
    config = LoaderConfig(seq_len=args.seq_len, batch_size=b, mixture={"pre": 0.8, "mid/*": 0.2}, seed=1,
                          mixture_block=args.mixture_block, shuffle_window=args.shuffle_window)
    stream = TokenStream(simulated_corpus(), config)
    block = max(ph.block for ph in stream.mixture.phases)
    g = world * b
    print(f"W={world} b={b} global batch {g} (mixture block {block}: the batch is "
          f"{'a multiple' if g % block == 0 else 'not a multiple'} of it), seq_len {args.seq_len}, "
          f"shuffle_window {args.shuffle_window}, steps {args.start_step}..{args.start_step + args.steps - 1}")
    print(f"| rank_rows | shards read | ranks per shard (mean / max) | hosts per shard, {args.ranks_per_host} ranks "
          "each (mean / max) | shards per rank per step (mean / max) | shards per rank over the steps (mean) |")
    print("|---|---:|---:|---:|---:|---:|")
    for by in RANK_ROWS:
        t0 = time.perf_counter()
        pairs, per_step = [], []
        for step in range(args.start_step, args.start_step + args.steps):
            start = step * g
            rows = RankRows(0, world, b, by).deal(stream, start)  # [W, b]: rank r's rows in row r
            ids = np.unique(stream.shard_ids(rows.reshape(-1)) * world + np.repeat(np.arange(world), b))
            pairs.append(ids)
            per_step.append(np.bincount(ids % world, minlength=world))
        pairs = np.unique(np.concatenate(pairs))
        shards, ranks_per_shard = np.unique(pairs // world, return_counts=True)
        _, shards_per_rank = np.unique(pairs % world, return_counts=True)
        _, hosts_per_shard = np.unique(np.unique(pairs // world * world + pairs % world // args.ranks_per_host)
                                       // world, return_counts=True)
        print(f"| {by} | {len(shards)} | {ranks_per_shard.mean():.1f} / {ranks_per_shard.max()} | "
              f"{hosts_per_shard.mean():.1f} / {hosts_per_shard.max()} | "
              f"{np.mean(per_step):.1f} / {np.max(per_step)} | {shards_per_rank.mean():.1f} |  ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
