"""``info`` and ``show`` on an unpinned Levanter cache or store, read through its store.

`cache_info` reads the ledgers, ``zarr.json`` files and the listing (no chunk data): per cell its rows,
tokens, data chunk files and bytes, token type and codec. `show_cache` decodes the first documents of a
cell (or the one whose row number is given) with a tokenizer the caller names, since a cache carries none
until it is adopted (a pinned one is shown with its own). Nothing here is checked against a hash.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass

import numpy as np

from marin_data.corpus.foreign import foreign, skipped_note
from marin_data.corpus.info import subsets_table
from marin_data.corpus.manifest import Manifest
from marin_data.corpus.names import select_subsets
from marin_data.corpus.records import SubsetInfo
from marin_data.corpus.show import ShownDocument
from marin_data.errors import CacheCheckError, InvalidTokenizerError, ManifestHashMismatchError, UnknownSubsetError
from marin_data.layout import MANIFEST, TOKENIZER
from marin_data.levanter.cache import CachePart, LevanterCache, open_cache
from marin_data.levanter.detect import CACHE, CORPUS, STORE, Source, detect
from marin_data.levanter.pinned import cell_prefixes
from marin_data.transfer.read import read_file
from marin_data.raw.tokenizer import LoadedTokenizer, load_tokenizer, tokenizer_from_bytes
from marin_data.stores.base import METADATA_LIMIT

__all__ = ["CacheInfo", "cache_info", "summarize", "show_cache", "show_found", "open_cells", "cell_bytes"]


@dataclass(frozen=True)
class CacheInfo:
    root: str
    kind: str  # "cache" or "store"
    cells: dict[str, SubsetInfo]  # a single cache: one entry named ""
    layouts: dict[str, str]  # cell -> "consolidated (int32, blosc lz4 clevel 5)"
    skipped: tuple[str, ...] = ()  # a store's bookkeeping of other tools (`detect.Source.skipped`)

    def to_json(self) -> dict:
        return {"source": self.root, "kind": self.kind, "pinned": False,
                "subsets": {k: {**asdict(v), "layout": self.layouts[k]} for k, v in self.cells.items()},
                "total": {f: sum(getattr(v, f) for v in self.cells.values())
                          for f in ("docs", "tokens", "bytes", "shards")},
                "ignored": list(self.skipped)}

    def __str__(self) -> str:
        what = "a Levanter cache" if self.kind == CACHE else f"a store of {len(self.cells)} Levanter caches"
        return "\n".join([f"{self.root}: {what}, not pinned (`marin-data adopt` pins it)", "",
                          subsets_table({k or "(cache)": v for k, v in self.cells.items()}), "",
                          *self._layout_lines(), *filter(None, [skipped_note(self.skipped, "not counted")]),
                          "chunk files are counted as shards; nothing here is checked: `marin-data verify` does"])

    def _layout_lines(self) -> list[str]:
        """One line per layout, naming its cells when the cells differ (a few, then a count)."""
        by_layout: dict[str, list[str]] = {}
        for cell, layout in sorted(self.layouts.items()):
            by_layout.setdefault(layout, []).append(cell)
        if len(by_layout) == 1:
            return [f"layout           {next(iter(by_layout))}"]
        more = {layout: f" and {len(cells) - 3:,} more" if len(cells) > 3 else "" for layout, cells in by_layout.items()}
        return [f"layout           {layout}: {', '.join(cells[:3])}{more[layout]}" for layout, cells in by_layout.items()]


def open_cells(found: Source, subsets: list[str] | None) -> dict[str, LevanterCache]:
    """The selected cells of a cache or store, opened (ledgers and ``zarr.json`` only)."""
    if found.kind == CACHE:
        if subsets:
            raise UnknownSubsetError("--subset selects cells of a store; this is one cache", actual=subsets)
        return {"": open_cache(found.store)}
    return {c: open_cache(found.store, c) for c in select_subsets(found.cells, subsets, what="cell")}


def cell_bytes(found: Source) -> dict[str, int]:
    """The bytes of each cell's files from one listing of the store (a single cache: one entry named ""),
    other tools' bookkeeping (`foreign`) left out."""
    sizes: dict[str, int] = {}
    for o in (o for o in found.store.list() if not foreign(o.path)):
        cell = next((c for c in found.cells if o.path.startswith(c + "/")), "")
        sizes[cell] = sizes.get(cell, 0) + o.size
    return sizes


def _describe(cache: LevanterCache) -> str:
    return f"{cache.ledger.layout} ({cache.dtype}, {cache.codec})"


def cache_info(url: str | os.PathLike, **store_options) -> CacheInfo:
    """Summarize the cache or store at ``url`` from its ledgers, ``zarr.json`` files and listing.

    Raises:
        UnknownSourceError: not a cache or store; CacheFormatError, CacheUnfinishedError: a cell that
            cannot be opened.
    """
    return summarize(detect(url, **store_options), str(url))


def summarize(found: Source, root: str) -> CacheInfo:
    """`cache_info` of the cache or store ``found`` (`detect`), named ``root`` in the summary."""
    sizes = cell_bytes(found)
    cells = open_cells(found, None)
    return CacheInfo(root=root, kind=found.kind, layouts={k: _describe(c) for k, c in cells.items()},
                     cells={k: SubsetInfo(docs=c.rows, tokens=c.tokens, bytes=sizes.get(k, 0),
                                          shards=sum(len(p.data_chunks()) for p in c.parts))
                            for k, c in cells.items()}, skipped=found.skipped)


def _pinned(found: Source, subset: str | None, manifest_sha256: str | None) -> tuple[str, LevanterCache,
                                                                                     LoadedTokenizer]:
    """A pinned corpus's cell and its own tokenizer (checked against the manifest, itself against the pin)."""
    data = read_file(found.store, MANIFEST, limit=METADATA_LIMIT) or b""
    digest = hashlib.sha256(data).hexdigest()
    if manifest_sha256 and digest != manifest_sha256.strip().lower():
        raise ManifestHashMismatchError(f"manifest sha256 is {digest}, but {manifest_sha256} was pinned",
                                        path=found.store.describe(MANIFEST), expected=manifest_sha256, actual=digest)
    manifest = Manifest.from_json(data, found.store.describe(MANIFEST))
    prefixes = cell_prefixes(manifest)
    if subset is None and len(prefixes) > 1:
        raise UnknownSubsetError(f"{len(prefixes)} subsets: name one with --subset", expected=sorted(prefixes))
    (cell,) = select_subsets(prefixes, [subset] if subset else None)[:1] or [""]
    tok = read_file(found.store, TOKENIZER, limit=METADATA_LIMIT) or b""
    loaded = tokenizer_from_bytes(tok, manifest.tokenizer, where=found.store.describe(TOKENIZER))
    return cell, open_cache(found.store, prefixes[cell]), loaded


def show_cache(url: str | os.PathLike, *, tokenizer: str | None = None, subset: str | None = None, n: int = 5,
               row: int | None = None, manifest_sha256: str | None = None, **store_options) -> list[ShownDocument]:
    """Decode ``n`` documents from the start of a cell (or the one document ``row``).

    An unpinned cache or store is decoded with ``tokenizer`` (it carries none); a pinned one (`adopt`) with
    its own ``tokenizer.json``, checked against its manifest (and that against ``manifest_sha256``).
    Shown tokens are not checked against their sha256 (`verify` does that).

    Raises:
        as `cache_info`; UnknownSubsetError: a store without ``subset``, or a row past the end;
        InvalidTokenizerError: no ``tokenizer`` for an unpinned cache, or one given for a pinned one;
        CacheCheckError: a shown document holds a token id outside the tokenizer's vocabulary (or below 0).
    """
    return show_found(detect(url, **store_options), str(url), tokenizer=tokenizer, subset=subset, n=n, row=row,
                      manifest_sha256=manifest_sha256)


def show_found(found: Source, where: str, *, tokenizer: str | None = None, subset: str | None = None, n: int = 5,
               row: int | None = None, manifest_sha256: str | None = None) -> list[ShownDocument]:
    """`show_cache` of the source ``found`` (`detect`), named ``where`` in its errors."""
    if found.kind == CORPUS:
        if tokenizer is not None or not found.pinned_cache:
            raise InvalidTokenizerError("a corpus decodes with its own tokenizer: pass no --tokenizer"
                                        if found.pinned_cache else "a Parquet corpus: `marin-data show` reads it",
                                        path=where)
        cell, cache, loaded = _pinned(found, subset, manifest_sha256)
    else:
        if tokenizer is None:
            raise InvalidTokenizerError("a Levanter cache carries no tokenizer: name the one it was built with",
                                        path=where)
        if found.kind == STORE and not subset:
            raise UnknownSubsetError(f"a store of {len(found.cells)} caches: name one with --subset",
                                     expected=list(found.cells))
        (cell, cache), = open_cells(found, [subset] if subset else None).items()
        loaded = load_tokenizer(tokenizer)
    first = row or 0
    if first >= cache.rows:
        raise UnknownSubsetError(f"row {first} is past the cache's {cache.rows} rows", actual=first)
    shown, base_row, decoded = [], 0, {}
    for part in cache.parts:
        wanted = range(max(first, base_row), min(first + (1 if row is not None else n), base_row + part.rows))
        if len(wanted):
            ends = cache.document_ends(part)
            starts = np.concatenate([[0], ends[:-1]])
            for r in wanted:
                a, b = int(starts[r - base_row]), int(ends[r - base_row])
                tokens = _tokens(cache, part, a, b, decoded)
                _refuse_ids(cache, part, r, a, tokens, loaded.info.vocab_size)
                shown.append(ShownDocument(id=f"{cell}:{r}" if cell else str(r), shard=part.prefix or ".",
                                           tokens=b - a,
                                           text=loaded.tokenizer.decode(tokens.tolist(), skip_special_tokens=False)))
        base_row += part.rows
    return shown


def _refuse_ids(cache: LevanterCache, part: CachePart, row: int, start: int, tokens: np.ndarray, vocab: int) -> None:
    """Raise `CacheCheckError` naming the first token of row ``row`` (its first token at ``start`` of the part)
    whose id the tokenizer cannot decode: negative, or past its vocabulary."""
    bad = np.flatnonzero((tokens < 0) | (tokens >= vocab))
    if len(bad):
        i = int(bad[0])
        chunk = part.data_chunks()[(start + i) // part.data.chunk]
        raise CacheCheckError(f"row {row}: token {i} is {tokens[i]}, outside the tokenizer's vocabulary [0, {vocab})"
                              f" ({len(bad)} such tokens in the row)", path=cache.where(chunk.path))


def _tokens(cache: LevanterCache, part: CachePart, start: int, stop: int, decoded: dict) -> np.ndarray:
    """Tokens ``[start, stop)`` of ``part``, each chunk file decoded once (``decoded`` keeps them)."""
    pieces = []
    for c in part.data_chunks():
        if c.start < stop and c.stop > start:
            if c.path not in decoded:
                decoded[c.path] = cache.read_chunk(c, part.data)
            pieces.append(decoded[c.path][max(0, start - c.start):stop - c.start])
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
