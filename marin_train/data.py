"""The data side of a run: the loader a `TrainConfig` describes, then the training loop on it.

A local corpus goes through `make_loader`, a remote one (``s3://``, ``hf://``) through `make_remote_loader`,
with this process's rank and world size from ``torch.distributed``. The model's vocabulary is the corpus
tokenizer's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from marin_data.errors import LoaderConfigError
from marin_data.loader import LoaderConfig, Phase, make_loader
from marin_data.loader.remote.stream import is_remote, make_remote_loader
from marin_data.corpus.manifest import load_corpus
from marin_train.checkpoint import resume_config
from marin_train.config import DataConfig, TrainConfig
from marin_train.distributed import init_distributed
from marin_train.loop import TrainResult, train
from marin_train.threads import set_threads

__all__ = ["mixture_schedule", "run_training", "training_loader"]


def mixture_schedule(data: DataConfig, global_batch: int):
    """``data.mixture``, or with ``data.mixture_from`` the loader's phases: the mixture up to the first change
    step, each change's weights up to the next (``global_batch`` sequences a step; the loader may round a
    phase end to its mixture block, see `marin_data.loader.Phase`)."""
    if not data.mixture_from:
        return data.mixture
    if data.mixture is None:
        raise LoaderConfigError("--mixture-from needs --mixture: the weights before the first change")
    phases, start, weights = [], 0, data.mixture
    for step, changed in sorted(data.mixture_from, key=lambda change: change[0]):
        if step <= start:
            raise LoaderConfigError(f"--mixture-from steps must be positive and distinct, got {step}")
        phases.append(Phase(dict(weights), (step - start) * global_batch))
        start, weights = step, changed
    return [*phases, Phase(dict(weights))]


def training_loader(cfg: TrainConfig, *, rank: int | None = None, world_size: int | None = None):
    """The `TokenLoader` that ``cfg.data`` describes, serving ``cfg.batch_size`` x ``cfg.seq_len`` batches."""
    data = cfg.data
    if not data.source:
        raise LoaderConfigError("no training data: set DataConfig.source (--data) to a corpus path or URL")
    _, world = (rank, world_size) if world_size is not None else init_distributed()[:2]
    config = LoaderConfig(seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed,
                          mixture=mixture_schedule(data, cfg.global_batch(world)), val_fraction=data.val_fraction,
                          segments=True)  # the model masks attention across documents
    if is_remote(data.source):
        return make_remote_loader(data.source, config, mirrors=data.mirrors, manifest_sha256=data.manifest_sha256,
                                  cache_dir=data.cache_dir, cache_bytes=data.cache_bytes, rank=rank,
                                  world_size=world_size, **dict(data.store_options))
    corpus = load_corpus(data.source, manifest_sha256=data.manifest_sha256)
    return make_loader(corpus, config, rank=rank, world_size=world_size)


def run_training(cfg: TrainConfig, *, resume: bool = True, until: int | None = None,
                 log: Callable[[str], None] = print) -> TrainResult:
    """Set torch's threads (`marin_train.threads`), build the loader, then `marin_train.loop.train` (joining
    ``torchrun``'s process group if there is one). A resume keeps the checkpoint's global batch: the per-rank
    batch follows the world size. The first log line says the threads chosen."""
    started = time.perf_counter()
    threads = set_threads()
    rank, world, device = init_distributed()
    if rank == 0:
        log(threads.describe())
    cfg = resume_config(cfg, world) if resume else cfg
    if rank == 0 and not cfg.checkpoint_dir:
        log("no --checkpoint-dir: this run saves no checkpoint")
    loader = training_loader(cfg)
    stream = loader.dataset.stream
    vocab = stream.corpus.manifest.tokenizer.vocab_size
    cfg = dataclasses.replace(cfg, model_overrides={"vocab_size": vocab, **cfg.model_overrides})
    try:
        result = train(cfg, loader, resume=resume, log=log, device=device, until=until, started=started)
        if hasattr(stream, "close"):
            s = stream.source.stats()
            log(f"shard cache: {s.fetches.total()} fetches of {len(s.fetches)} shards "
                f"({s.bytes_fetched / 2**20:.1f} MiB), {s.hits} hits, {s.evictions} evictions, high-water "
                f"{s.high_water / 2**20:.1f} of {s.max_bytes / 2**20:.1f} MiB")
        return result
    finally:
        if hasattr(stream, "close"):  # a remote stream: its cache's threads and directory lock
            stream.close()
