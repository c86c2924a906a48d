"""The options ``marin-train train``, ``eval`` and ``generate`` share, and the `DataConfig` they make.

`corpus_options` adds what reading a corpus takes beyond its path: a remote one's mirrors, its pinned
manifest sha256, the Hub endpoint, the shard cache, and the S3 options every marin-data command that
talks to a store has (`marin_data.cli._store_options`); `data_config` turns them into the `DataConfig` of a
run. `threads_option` is Torch's intra-op thread count, which decides whether processes agree to the last
bit.
"""

from __future__ import annotations

import click

from marin_data.cli._store_options import check_sha256, store_kwargs, store_options
from marin_train.config import DataConfig

__all__ = ["corpus_options", "data_config", "threads_option"]


def corpus_options(fn):
    """The options of a corpus to read: a remote one's mirrors, pin, endpoints and cache."""
    for option in reversed([
        click.option("--mirror", "mirrors", multiple=True, metavar="URL",
                     help="Fallback store of a remote corpus (repeat)."),
        click.option("--manifest-sha256", metavar="HEX", help="Pin the corpus manifest's sha256."),
        click.option("--endpoint", metavar="URL",
                     help="Hugging Face endpoint of an hf:// corpus (e.g. marin-data serve)."),
        click.option("--cache-dir", metavar="DIR", help="Shard cache: a remote corpus's fetched shards, a local "
                     "one's decoded copies (default ~/.cache/marin/remote, ~/.cache/marin/decoded)."),
        click.option("--cache-gb", type=float, help="Remote shard cache limit per rank, in GiB (default 64)."),
    ]):
        fn = option(fn)
    return store_options(fn)


threads_option = click.option(
    "--threads", type=click.IntRange(min=1), metavar="N",
    help="Torch's intra-op threads per process (default: 1 under torchrun, else the usable cores less one; "
         "OMP_NUM_THREADS also sets it). Processes agree to the last bit only at equal counts.")


def data_config(source, *, mirrors, manifest_sha256, endpoint, cache_dir, cache_gb, endpoint_url, profile, anonymous,
                requester_pays, **fields) -> DataConfig:
    """The `DataConfig` of `corpus_options` (and any other fields)."""
    check_sha256(manifest_sha256)
    options = store_kwargs(endpoint_url, profile, anonymous, requester_pays)
    if endpoint:
        options["endpoint"] = endpoint
    cache = {"cache_bytes": int(cache_gb * (1 << 30))} if cache_gb else {}
    return DataConfig(source=source, mirrors=tuple(mirrors), manifest_sha256=manifest_sha256, cache_dir=cache_dir,
                      store_options=options, **cache, **fields)
