"""Exact, elastic, mixture-weighted token batches from a local or remote corpus (or a pinned Levanter cache).

The sequence served at global position ``i`` is a pure function of the selected shards, the mixture
schedule, the seed, ``seq_len`` and ``i`` (`TokenStream`); ranks, DataLoader workers and resume are
arithmetic on positions (`TokenDataset`). The batch contract (``input_ids``, ``labels``,
``subset``, ``index``; with ``segments=True`` also ``segment_ids``, ``positions``) is documented in
`marin_data.loader.packing`.

Typical use::

    from marin_data.loader import LoaderConfig, Phase, make_loader
    loader = make_loader("corpus/", LoaderConfig(seq_len=4096, batch_size=8,
                                                 mixture={"pretrain/*": 0.7, "code/*": 0.3}))
    for batch in loader: ...
    ckpt["loader"] = loader.state_dict()          # later: make_loader(..., state=ckpt["loader"])
"""

from __future__ import annotations

import importlib

# Imported on first use (PEP 562): `marin_data.loader.cache` or `.shuffle` alone need neither torch nor
# the rest, and a CLI command that touches one of them should not pay for torch's import.
_EXPORTS = {
    "LoaderConfig": "config",
    "TokenStream": "stream",
    "Phase": "mixture",
    "phases_by_fraction": "mixture",
    "Mixture": "mixture",
    "SHUFFLES": "shuffle",
    "TokenDataset": "dataset",
    "TokenLoader": "dataset",
    "make_loader": "make",
    "to_tensors": "dataset",
    "BatchTensors": "dataset",
    "distributed_rank": "dataset",
    "RankRows": "ranks",
    "DecodedShard": "cache",
    "DecodedShardCache": "cache",
    "ShardSource": "cache",
    "default_cache_dir": "cache",
    "make_remote_loader": "remote.stream",
    "is_remote": "remote.stream",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
