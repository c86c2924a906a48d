"""Two real torch.distributed (gloo) ranks take disjoint slices whose union is the global batch."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch.distributed as dist
from loader_checks import check_global_stream, take
from ranks import spawn_ranks

from marin_data.loader import LoaderConfig, TokenStream, make_loader
from marin_data.testing.loopback import free_port
from marin_train.distributed import shutdown_distributed

CONFIG = LoaderConfig(seq_len=16, batch_size=3, mixture={"a": 0.7, "b": 0.3}, val_fraction=0.05, mixture_block=64)
STEPS = 4


def _rank_main(rank: int, port: int, root: str, cache: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    loader = make_loader(root, CONFIG, cache_dir=cache)  # rank and world size come from torch.distributed
    batches = take(loader, STEPS)
    # The ranks agree on the resume state without talking about it.
    states = [None, None]
    dist.all_gather_object(states, loader.state_dict())
    assert states[0] == states[1]
    np.savez(f"{out}/rank{rank}.npz", **{f"{k}{i}": v for i, b in enumerate(batches) for k, v in b.items()})
    shutdown_distributed()


def test_two_gloo_ranks_get_disjoint_slices_whose_union_is_the_global_batch(make_corpus, tmp_path):
    corpus = make_corpus({"a": [40, 30], "b": [50]}, doc_tokens=(1, 30))
    ctx = spawn_ranks(_rank_main, (free_port(), str(corpus.root), str(tmp_path / "cache"), str(tmp_path)), 2,
                      join=False)
    deadline = time.monotonic() + 120
    while not ctx.join(timeout=5):  # True once both ranks exit; a rank's failure raises with its traceback
        if time.monotonic() > deadline:
            for process in ctx.processes:
                process.kill()
            pytest.fail("the ranks did not finish within 120 s")
    per_rank = []
    for rank in range(2):
        saved = np.load(tmp_path / f"rank{rank}.npz")
        per_rank.append([{k: saved[f"{k}{i}"] for k in ("index", "input_ids", "labels", "subset")}
                         for i in range(STEPS)])
    index = [np.concatenate([b["index"] for b in batches]) for batches in per_rank]
    assert not set(index[0].tolist()) & set(index[1].tolist())
    reference = TokenStream(corpus, CONFIG, cache_dir=tmp_path / "cache").read(np.arange(STEPS * 6))
    check_global_stream(per_rank, 0, reference)
