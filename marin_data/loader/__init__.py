"""Exact, elastic, mixture-weighted token batches from a local corpus (issue 8).

The sequence served at global position ``i`` is a pure function of the selected shards, the mixture
schedule, the seed, ``seq_len`` and ``i`` (`TokenStream`); ranks, DataLoader workers and resume are
arithmetic on positions (`TokenDataset`). The batch contract (``input_ids``, ``labels``,
``segment_ids``, ``positions``, ``subset``, ``index``) is documented in `marin_data.loader.packing`.

Typical use::

    from marin_data.loader import LoaderConfig, Phase, make_loader
    loader = make_loader("corpus/", LoaderConfig(seq_len=4096, batch_size=8,
                                                 mixture={"pretrain/*": 0.7, "code/*": 0.3}))
    for batch in loader: ...
    ckpt["loader"] = loader.state_dict()          # later: make_loader(..., state=ckpt["loader"])
"""

from marin_data.loader.cache import DecodedShard, DecodedShardCache, ShardSource, default_cache_dir
from marin_data.loader.dataset import TokenDataset, TokenLoader, distributed_rank, make_loader, to_tensors
from marin_data.loader.mixture import Mixture, Phase, phases_by_fraction
from marin_data.loader.permutation import SHUFFLES
from marin_data.loader.stream import LoaderConfig, TokenStream

__all__ = [
    "LoaderConfig",
    "Phase",
    "phases_by_fraction",
    "Mixture",
    "SHUFFLES",
    "TokenStream",
    "TokenDataset",
    "TokenLoader",
    "make_loader",
    "to_tensors",
    "distributed_rank",
    "DecodedShard",
    "DecodedShardCache",
    "ShardSource",
    "default_cache_dir",
]
