"""What the ledgers of Levanter caches say of the tokenizer run that made them.

Levanter's tokenizer run (``BatchTokenizer``) records in each cache's ``metadata.preprocessor_metadata`` the
tokenizer's name (``tokenizer``: the Hub repo id or the path it was loaded from), ``vocab_size``, and whether
each document was framed with the tokenizer's BOS (``append_bos``) and EOS (``append_eos``); a sharded
cache's top ledger may hold null and its parts the metadata. A cache written otherwise (``SerialCacheWriter``)
records none. A fact holds for a set of caches only when every one records it alike (`agreed`).

`ledger_tokenizer` finds the tokenizer the ledgers name on this machine (a path, or a Hub repo already in
the local Hugging Face cache: never the network), which `tokenizer_of` offers a command given no
``--tokenizer``; `load_framed` loads a tokenizer with the BOS id the
ledgers say was prepended, so that what a manifest or a datasheet states agrees with them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from marin_data.errors import InvalidTokenizerError, MarinDataError
from marin_data.levanter.cache import LevanterCache, open_cache
from marin_data.levanter.detect import Source
from marin_data.raw.tokenizer import LoadedTokenizer, load_tokenizer, local_tokenizer

__all__ = ["ledger_metadata", "agreed", "ledger_tokenizer", "tokenizer_of", "load_framed"]


def ledger_metadata(cache: LevanterCache) -> dict:
    """A cache's ``preprocessor_metadata``: its top ledger's, else its first part's ({} when neither has any)."""
    top = cache.ledger.preprocessor_metadata
    return top or (cache.parts[0].ledger.preprocessor_metadata if cache.parts else None) or {}


def agreed(caches: Iterable[LevanterCache], key: str) -> Any:
    """The value every cache's metadata gives ``key``, when all give the same one; else None."""
    values = [ledger_metadata(c).get(key) for c in caches]
    return values[0] if values and all(v == values[0] for v in values) else None


def ledger_tokenizer(caches: Iterable[LevanterCache]) -> tuple[str, str] | None:
    """``(name, local path)`` of the tokenizer the caches' ledgers all name, when it is found on this machine
    without the network; else None (no name, names that differ, or nothing local)."""
    name = agreed(caches, "tokenizer")
    if not isinstance(name, str) or not name:
        return None
    found = local_tokenizer(name)
    return (name, str(found)) if found is not None else None


def tokenizer_of(found: Source, given: str | None) -> tuple[str | None, str | None]:
    """The tokenizer for an unpinned cache or store ``found``: ``given``; else the one every cell's ledger
    names, when it is on this machine, with the line that says so on stderr; else ``(None, None)`` (also
    when a ledger cannot be read: the command then refuses as it does without a tokenizer)."""
    if given is not None:
        return given, None
    try:
        caches = [open_cache(found.store, p, require_finished=False) for p in (found.cells or [""])]
    except MarinDataError:
        return None, None
    named = ledger_tokenizer(caches)
    if named is None:
        return None, None
    return named[1], f"tokenizer: {named[0]}, from the cache's ledger"


def load_framed(spec: str, caches: Iterable[LevanterCache], *, name: str | None = None) -> LoadedTokenizer:
    """`load_tokenizer` of ``spec`` (recorded as ``name``), with its BOS id when the caches' ledgers all say
    ``append_bos: true`` and the tokenizer marks a BOS token; a tokenizer without one is loaded as it is.

    Raises:
        InvalidTokenizerError: the tokenizer cannot be loaded, or has no EOS.
    """
    if agreed(list(caches), "append_bos") is True:
        try:
            return load_tokenizer(spec, add_bos=True, name=name)
        except InvalidTokenizerError:
            pass  # no BOS token it marks special: nothing to record (an EOS missing is raised just below)
    return load_tokenizer(spec, name=name)
