"""The parts of a datasheet that differ for a Levanter cache or store (`CacheSheet`, the `SheetParts` that
`marin_data.docs.datasheet` composes): the headline, the cells table with the cluster x quality heat map and Marin's registry columns, where
the document lengths come from, what the duplicate scan read, each cell's first scanned document, how the
tokens are stored, and, for a cache nothing pins yet, a distribution section that says so and how to pin it.

Every number is computed (`marin_data.levanter.cachestats`); text from a cache (its metadata, a decoded document)
is hostile: control characters are escaped, and a document is quoted in a fence longer than any it holds.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import ClassVar

from marin_data.corpus.manifest import Manifest
from marin_data.docs import markdown as md
from marin_data.docs.stats import CorpusStats
from marin_data.levanter.cachestats import FIRST_CHARS, REGISTRY_COLUMNS, CacheStats, CellFacts
from marin_data.docs.distribution import ENDPOINT_FLAGS
from marin_data.layout import HEATMAP_PNG
from marin_data.ui import human_bytes, plural, terminal_safe

__all__ = ["CacheSheet", "MARIN_REGISTRY", "generated_from", "headline", "cells_section", "LENGTHS_FROM_OFFSETS",
           "scan_scopes", "first_document", "storage", "not_pinned"]

MARIN_REGISTRY = ("Marin's token-count registry ([`marin-community/token-counts`]"
                  "(https://huggingface.co/datasets/marin-community/token-counts), written by "
                  "[`experiments/count_tokens.py`](https://github.com/marin-community/marin/blob/main/experiments/"
                  "count_tokens.py))")
LENGTHS_FROM_OFFSETS = ("Tokens per document, from the offsets arrays (the document boundaries Levanter keeps "
                        "beside the tokens): every document of every cell, no token decoded. Percentiles are "
                        "nearest-rank: p90 is the smallest length that at least 90% of documents do not exceed. The "
                        "mean is the cell's tokens divided by its documents.")


@dataclass(frozen=True)
class CacheSheet:
    """A Levanter cache or store the datasheet describes, and what was computed from it: the datasheet's
    words for it (`marin_data.docs.datasheet.SheetParts`)."""

    lengths: ClassVar[str] = LENGTHS_FROM_OFFSETS
    everything: ClassVar[str] = "all documents"

    url: str  # where it was read (a path, s3://..., hf://datasets/...)
    kind: str  # "cache" or "store"
    pinned: bool  # a manifest pins it (`marin-data adopt`)
    stats: CacheStats
    heatmap: bool  # the cluster x quality heat map was drawn
    store_flags: dict = field(default_factory=dict)  # the endpoint options it was read with (`ENDPOINT_FLAGS`)

    @property
    def what(self) -> str:
        return "store of Levanter caches" if self.kind == "store" else "Levanter cache"

    def generated_from(self) -> str:
        return generated_from(self)

    def headline(self, manifest: Manifest, stats: CorpusStats, manifest_sha256: str | None) -> list[str]:
        return headline(manifest, self, manifest_sha256)

    def subsets(self, manifest: Manifest, stats: CorpusStats) -> list[str]:
        return cells_section(self)

    def scan_scopes(self) -> list[str]:
        return scan_scopes(self)

    def subset_detail(self, index: int, manifest: Manifest) -> list[str]:
        return first_document(self.stats.cells[index], manifest.tokenizer.name)

    def tokenization(self, manifest: Manifest) -> tuple[list[str], list[tuple[str, str]]]:
        """What a cache's tokenizer run added is its own record's to say (`storage`)."""
        tok = manifest.tokenizer
        about = [*storage(self), "The tokenizer named here is " + (
            "the pinned `tokenizer.json`, whose fingerprint the manifest holds." if self.pinned else
            "the one given with `--tokenizer`: a cache carries none until it is pinned.")]
        return about, [("EOS id", f"`{tok.eos_id}`"), ("BOS id", "none" if tok.bos_id is None else f"`{tok.bos_id}`")]

    def unpinned(self, manifest: Manifest) -> list[str] | None:
        if self.pinned:
            return None
        return ["A Levanter cache records no license: `marin-data adopt --license SPDX` records one for every "
                "subset of the pinned copy.", "", *not_pinned(self, manifest.tokenizer.name)]


def generated_from(source: CacheSheet) -> str:
    return ("manifest.json, shards.parquet and the cache's files" if source.pinned else
            "the cache's ledgers, zarr.json files, offsets and data chunk files")


def headline(manifest: Manifest, source: CacheSheet, manifest_sha256: str | None) -> list[str]:
    """The sentence under the title: what it is, its totals, and its pin (or that it has none)."""
    s = source.stats.corpus
    totals = (f"{plural(len(s.subsets), 'cell')}, {plural(s.docs, 'document')}, {plural(s.tokens, 'token')}, "
              f"{plural(s.bytes, 'byte')} ({human_bytes(s.bytes)}) in {plural(s.shards, 'data chunk file')}")
    if source.pinned:
        return [f"A pinned {source.what}, `{manifest.name}` version `{manifest.version}`: {totals}. Manifest sha256 "
                f"`{manifest_sha256}`.", ""]
    return [f"A {source.what} at `{source.url}`: {totals}.", "",
            f"**Not pinned.** No manifest lists its files with their SHA-256, so nothing vouches for the bytes a "
            f"reader gets and this datasheet states no digest to pin. `marin-data adopt` pins it in place "
            f"(*Distribution* says how); its datasheet then states the manifest's sha256.", ""]


def cells_section(source: CacheSheet) -> list[str]:
    """The cells table, the heat map (a store of ``cluster=X/quality=Y`` cells) and the registry columns."""
    s = source.stats.corpus
    rows = [(f"`{c.name}`", md.count(x.docs), md.count(x.tokens), md.count(x.bytes), md.count(x.shards),
             md.count(c.parts), c.layout, c.dtype, c.codec, md.share(x.token_share))
            for x, c in zip(s.subsets, source.stats.cells)]
    rows.append(("**Total**", md.count(s.docs), md.count(s.tokens), md.count(s.bytes), md.count(s.shards),
                 md.count(sum(c.parts for c in source.stats.cells)), "", "", "", md.share(1.0 if s.tokens else 0.0)))
    out = ["### Cells (computed)", "",
           "Documents and tokens are the ledgers' (checked against the offsets below); bytes are every file of "
           "the cell; a data chunk file holds a run of the cell's tokens (a shard of a pinned cache); a sharded "
           "cell keeps its rows in parts (`part-NNNNN-of-MMMMM/`), a consolidated one in one.", "",
           md.table(("Cell", "Documents", "Tokens", "Bytes", "Chunk files", "Parts", "Layout", "Tokens as",
                     "Codec", "Token share"), rows, "lrrrrrlllr"), ""]
    if source.heatmap:
        out += [f"![Tokens by cluster and quality]({HEATMAP_PNG})", ""]
    return out + _registry(source.stats.cells)


def _registry(cells: tuple[CellFacts, ...]) -> list[str]:
    columns = [k for k in REGISTRY_COLUMNS if any(k in c.registry for c in cells)]
    named = ", ".join(f"`{k}`" for k in REGISTRY_COLUMNS)
    intro = (f"{MARIN_REGISTRY} keeps one row per source with the columns {named}; `marin_tokens` is the "
             "`total_tokens` of the source's `.stats.json`.")
    if not columns:
        return ["### Registry columns (computed)", "", intro + " No cell's ledger metadata "
                "(`metadata.preprocessor_metadata`) or `.stats.json` carries any of them.", ""]
    rows = [(f"`{c.name}`", *(c.registry.get(k, "—") for k in columns)) for c in cells]
    return ["### Registry columns (computed)", "",
            intro + " Below, those the cells' ledger metadata (`metadata.preprocessor_metadata`) and `.stats.json` "
            "carry; — where a cell has none.", "",
            md.table(("Cell", *columns), rows, "l" + "l" * len(columns)), ""]


def scan_scopes(source: CacheSheet) -> list[str]:
    """What the duplicate scan read of each cell, for the duplicates table's *Scope* column."""
    sampled = source.stats.corpus.duplicates.sampled
    return [f"sample: {c.files_scanned:,} of {plural(x.shards, 'chunk file')}" if sampled[i] else "all chunk files"
            for i, (x, c) in enumerate(zip(source.stats.corpus.subsets, source.stats.cells))]


def first_document(cell: CellFacts, tokenizer: str) -> list[str]:
    """The first document scanned in a cell, decoded, quoted in a fence no line of it can close."""
    if cell.first is None:
        return ["*No whole document of this cell was scanned.*", ""]
    text = terminal_safe(cell.first.text)
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    more = " (its first characters)" if cell.first.tokens and len(cell.first.text) >= FIRST_CHARS else ""
    return [f"**The first document scanned** (row {cell.first.row:,}, {plural(cell.first.tokens, 'token')}, decoded "
            f"with `{tokenizer}`){more}:", "", fence + "text", text, fence, ""]


def storage(source: CacheSheet) -> list[str]:
    """How the tokens are stored, and what the ledgers say of the tokenizer that made them."""
    cells = source.stats.cells
    seen = sorted({(c.dtype, c.codec, c.layout) for c in cells})
    kinds = "; ".join(f"{layout}, {dtype}, {codec}" for dtype, codec, layout in seen)
    out = ["Documents are stored as Levanter writes them (Zarr v3): per cache, `input_ids/data` holds every token "
           "of every document back to back and `input_ids/offsets` where each document ends; the ledger "
           f"(`shard_ledger.json`) counts rows and tokens. Here: {kinds or 'no cell'}. Whether a BOS or EOS token "
           "was added is the tokenizer run's choice, recorded (when it was) in the ledgers' "
           "`preprocessor_metadata`:", ""]
    said = sorted({_said(c.metadata) for c in cells})
    out += [f"- {line}" for line in said] if said else ["- (no cell)"]
    return out + [""]


def _said(metadata: dict) -> str:
    keys = ("tokenizer", "vocab_size", "append_bos", "append_eos")
    found = [f"`{k}`: `{terminal_safe(metadata[k])[:80]}`" for k in keys if k in metadata]
    return ", ".join(found) if found else "nothing (no `preprocessor_metadata`)"


def not_pinned(source: CacheSheet, tokenizer: str) -> list[str]:
    """The distribution section's root of trust for a cache nothing pins: none, how to pin it, how to check it."""
    flags = [f for key, flag in ENDPOINT_FLAGS.items() if source.store_flags.get(key)
             for f in (flag, str(source.store_flags[key]))]
    local = "://" not in source.url
    return ["### Root of trust", "",
            f"**None: this {source.what} is not pinned.** No manifest lists its files with their SHA-256 and size, "
            "so nothing here vouches for the bytes a reader gets, and there is no digest to pin. `marin-data "
            "download` reads a manifest first and has none to read. Pin it in place on local disk" +
            ("" if local else " (a copy: `adopt` takes a folder)") + ", with the tokenizer it was built with "
            f"(`{tokenizer}` here); adopt hashes every file, rewrites none, and prints the manifest sha256 that "
            "the datasheet of the pinned copy states:", "",
            md.code([f"marin-data adopt {shlex.quote(source.url) if local else 'PATH'} --tokenizer TOK --license SPDX",
                     f"marin-data datasheet {shlex.quote(source.url) if local else 'PATH'}"]), "",
            "Until then its structure (ledgers, offsets, every chunk file's index; with `--deep` every token) can "
            "be checked where it is:", "",
            md.code([" ".join(["marin-data verify", shlex.quote(source.url), *map(shlex.quote, flags),
                               "--deep --tokenizer TOK"])]), ""]
