"""A Levanter cache pinned in place, seen from its manifest: where each subset's cache root is.

`marin_data.levanter.adopt` writes such a manifest (``format`` `LEVANTER_STORE`: each subset the cache at the
folder of its name, or `LEVANTER_CACHE`: one cache at the corpus root holding the one subset); every
file of a subset's cache is a row of the shard index, so that a download of the subset fetches, and
verify hashes, all of it.
"""

from __future__ import annotations

from marin_data.corpus.manifest import Manifest

__all__ = ["LEVANTER_STORE", "LEVANTER_CACHE", "is_pinned_cache", "cell_prefixes"]

# The names of the plug-in's formats: a manifest's ``format``, the registry's `Format.name`
# (`marin_data.levanter.formats`).
LEVANTER_STORE = "levanter-store"
LEVANTER_CACHE = "levanter-cache"


def is_pinned_cache(manifest: Manifest) -> bool:
    return manifest.format in (LEVANTER_STORE, LEVANTER_CACHE)


def cell_prefixes(manifest: Manifest) -> dict[str, str]:
    """subset -> its cache root relative to the corpus root ("" for a single cache)."""
    if manifest.format == LEVANTER_CACHE:
        return {name: "" for name in manifest.subsets}
    return {name: name for name in manifest.subsets}
