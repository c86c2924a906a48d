"""A Levanter cache pinned in place, seen from its manifest: where each subset's cache root is.

`marin_data.levanter.adopt` writes such a manifest (``format`` `LEVANTER_STORE` or `LEVANTER_CACHE`); every
file of a subset's cache is a row of the shard index, so that a download of the subset fetches, and
verify hashes, all of it.
"""

from __future__ import annotations

from marin_data.corpus.manifest import LEVANTER_CACHE, LEVANTER_STORE, Manifest

__all__ = ["is_pinned_cache", "cell_prefixes"]


def is_pinned_cache(manifest: Manifest) -> bool:
    return manifest.format in (LEVANTER_STORE, LEVANTER_CACHE)


def cell_prefixes(manifest: Manifest) -> dict[str, str]:
    """subset -> its cache root relative to the corpus root ("" for a single cache)."""
    if manifest.format == LEVANTER_CACHE:
        return {name: "" for name in manifest.subsets}
    return {name: name for name in manifest.subsets}
