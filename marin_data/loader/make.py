"""`make_loader`: the one entry point to the loader, for a corpus on local disk or in a store.

A local corpus gets a `TokenStream` read through `TokenDataset` and `TokenLoader` (a torch ``DataLoader``,
with worker processes if asked); a remote one (``s3://``, ``hf://``) streams through the remote shard cache
(`marin_data.loader.remote.stream.make_remote_loader`), in-process or in workers. All serve the same batches.
"""

from __future__ import annotations

import os
from typing import Any

from marin_data.corpus.manifest import Corpus
from marin_data.errors import LoaderConfigError
from marin_data.loader.dataset import TokenDataset, TokenLoader
from marin_data.loader.remote.stream import apart_pin, is_remote, make_remote_loader
from marin_data.loader.config import LoaderConfig
from marin_data.loader.stream import TokenStream

__all__ = ["make_loader"]


def make_loader(corpus: Corpus | str | os.PathLike, config: LoaderConfig = LoaderConfig(), *,
                rank: int | None = None, world_size: int | None = None, split: str = "train",
                num_workers: int = 0, pin_memory: bool = False, prefetch: int = 2,
                cache_dir: str | os.PathLike | None = None, state: dict[str, Any] | None = None,
                strict: bool = True, verify_shards: bool = True, **remote_options: Any) -> TokenLoader:
    """A ready loader over a local or remote corpus: the one call a training loop needs (a `TokenLoader`:
    it iterates like a DataLoader and knows what the trainer took; ``.dataset`` is the IterableDataset).

    Args:
        corpus: a `Corpus`, a local corpus directory, or a remote one (``s3://bucket/prefix``,
            ``hf://datasets/org/name``), which streams through a bounded, verified shard cache
            (`marin_data.loader.remote.stream.make_remote_loader`; with ``num_workers``, each worker through its own
            share of the cache).
            Any of them may be a Levanter cache or store pinned with ``marin-data adopt`` (its cells are the
            subsets); an unpinned one is refused (`UnpinnedCacheError`). A local pin kept apart from its data
            (``adopt --pin-to``) streams like a remote corpus, its shards from where its manifest's ``data``
            says (store options for that store in ``remote_options``).
        config: what to serve (`LoaderConfig`).
        rank, world_size: default to `torch.distributed` when initialised.
        split: ``"train"`` or ``"validation"``.
        num_workers: DataLoader worker processes (0: in-process, the fast path).
        pin_memory: pin batches for faster host-to-GPU copies.
        prefetch: batches built ahead (a thread in-process; DataLoader's prefetch factor with workers). The
            thread overlaps building a batch with a step that releases the GIL (a GPU step); a loop that only
            takes batches runs fastest with 0 (docs/benchmarks.md: 566M vs 148M tokens/s at 8 x 4096).
        cache_dir: where decoded shards are kept (`cache.default_cache_dir`).
        state: a `state_dict()` to resume from; ``strict=False`` accepts one of another stream.
        verify_shards: check each local shard's SHA-256 against the index before its first use (remote shards
            are always checked as they arrive).
        **remote_options: for a remote corpus (or a pin kept apart) only: ``mirrors``, ``manifest_sha256``, ``cache_bytes``,
            store options (``endpoint_url``, ``endpoint``...); see `make_remote_loader`.

    Example::

        loader = make_loader("corpus/", LoaderConfig(seq_len=4096, batch_size=8, segments=True,
                             mixture={"pretrain/*": 0.8, "midtrain/math": 0.2}))
        for step, batch in enumerate(loader):
            loss = model(batch["input_ids"], segment_ids=batch["segment_ids"], ...)
            if step % 1000 == 0:
                save({"model": ..., "loader": loader.state_dict()})
    """
    apart = apart_pin(corpus)  # a local pin kept apart from its data streams its shards from where they are
    if is_remote(corpus) or apart:
        return make_remote_loader(apart or str(corpus), config, rank=rank, world_size=world_size, split=split,
                                  prefetch=prefetch, num_workers=num_workers, pin_memory=pin_memory,
                                  cache_dir=cache_dir, state=state, strict=strict, **remote_options)
    if remote_options:
        raise LoaderConfigError(f"options for a remote corpus given for a local one: {sorted(remote_options)}")
    stream = TokenStream(corpus, config, cache_dir=cache_dir, verify_shards=verify_shards)
    dataset = TokenDataset(stream, rank=rank, world_size=world_size, split=split,
                           prefetch=prefetch if num_workers == 0 else 0)
    if state is not None:
        dataset.load_state_dict(state, strict=strict)
    return TokenLoader(dataset, num_workers=num_workers, pin_memory=pin_memory,
                       prefetch_factor=max(1, prefetch))
