"""`run_training`: one ``marin-train`` run from its `TrainConfig`: torch's threads, the process group of
``torchrun`` when there is one, the checkpoint's settings on a resume, the loader (`marin_train.data`), a
copy of the corpus's ``tokenizer.json`` in the run directory, the ``--eval-every`` evaluator, then the
training loop (`marin_train.loop.train`), and the remote shard cache's counts at the end.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

from marin_data.layout import TOKENIZER
from marin_data.loader.remote.stream import RemoteStream
from marin_data.loader.stream import TokenStream
from marin_data.raw.tokenizer import token_byte_lengths
from marin_train.checkpoint import atomic_write, resume_config
from marin_train.config import TrainConfig
from marin_train.data import corpus_tokenizer, eval_config, tokenizer_bytes, training_loader
from marin_train.distributed import init_distributed
from marin_train.evaluate import HeldOut, evaluate
from marin_train.loop import TrainResult, train
from marin_train.threads import set_threads

__all__ = ["run_training"]


def _record_tokenizer(cfg: TrainConfig, stream: TokenStream) -> None:
    """Keep the corpus's ``tokenizer.json`` in the run directory (rank 0; fetched only when it changed)."""
    path = Path(cfg.checkpoint_dir) / TOKENIZER
    want = stream.corpus.manifest.tokenizer.sha256
    if path.is_file() and not path.is_symlink() and hashlib.sha256(path.read_bytes()).hexdigest() == want:
        return
    data = tokenizer_bytes(cfg.data.source, stream.corpus.manifest, cfg.data)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(data))


def _evaluator(cfg: TrainConfig, stream: TokenStream, device, log: Callable[[str], None]) -> Callable:
    """``--eval-every``: a function of the model giving the eval fields of a metrics record. Its stream is a
    sibling of the training one (the same corpus and shard source; `eval_config`), built for each evaluation
    so that the shards it maps are released afterwards. ``log`` gets which evaluation it is, and its size."""
    table = token_byte_lengths(corpus_tokenizer(cfg.data.source, stream.corpus.manifest, cfg.data))
    config = dataclasses.replace(eval_config(cfg.seq_len, cfg.data.val_fraction, stream.subsets, cfg.data.packing),
                                 shuffle=stream.config.shuffle, shuffle_window=stream.config.shuffle_window)
    limit = None if cfg.eval_tokens is None else max(1, cfg.eval_tokens // cfg.seq_len)
    held = HeldOut.of(TokenStream(stream.corpus, config, source=stream.source), limit)  # nothing held out: raises
    log(held.describe(cfg.eval_every))

    def run(model) -> dict[str, float]:
        held_out = TokenStream(stream.corpus, config, source=stream.source)
        return evaluate(model, held_out, table, batch_size=cfg.eval_batch, max_sequences=limit,
                        device=device).metrics()

    return run


def run_training(cfg: TrainConfig, *, resume: bool = True, until: int | None = None, threads: int | None = None,
                 log: Callable[[str], None] = print, stop: Callable[[], bool] | None = None,
                 reschedule: bool = False) -> TrainResult:
    """Set torch's threads (`marin_train.threads`; ``threads`` is ``--threads``), build the loader, then
    `marin_train.loop.train` (joining ``torchrun``'s process group if there is one). A resume keeps the
    checkpoint's global batch: the per-rank batch follows the world size. The first log line says the threads
    chosen. ``stop`` and ``reschedule`` go to `train`."""
    started = time.perf_counter()
    threads = set_threads(threads)
    rank, world, device = init_distributed()
    if rank == 0:
        log(threads.describe())
    cfg = resume_config(cfg, world) if resume else cfg
    if rank == 0 and not cfg.checkpoint_dir:
        log("no --checkpoint-dir: this run saves no checkpoint")
    loader = training_loader(cfg)
    stream = loader.dataset.stream
    # Recorded in each checkpoint's config.json: the manifest this run read, pinned for `marin-train trace`.
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, manifest_sha256=stream.corpus.manifest_sha256))
    vocab = stream.corpus.manifest.tokenizer.vocab_size
    cfg = dataclasses.replace(cfg, model_overrides={"vocab_size": vocab, **cfg.model_overrides})
    try:
        if cfg.checkpoint_dir and rank == 0:
            _record_tokenizer(cfg, stream)
        evaluator = _evaluator(cfg, stream, device, log if rank == 0 else lambda _: None) if cfg.eval_every else None
        result = train(cfg, loader, resume=resume, log=log, device=device, until=until, evaluate=evaluator,
                       started=started, stop=stop, reschedule=reschedule)
        if isinstance(stream, RemoteStream):
            s = stream.source.stats()
            log(f"shard cache: {s.fetches.total()} fetches of {len(s.fetches)} shards "
                f"({s.bytes_fetched / 2**20:.1f} MiB), {s.hits} hits, {s.evictions} evictions, high-water "
                f"{s.high_water / 2**20:.1f} of {s.max_bytes / 2**20:.1f} MiB")
        return result
    finally:
        stream.close()  # a remote stream's cache threads and directory lock
