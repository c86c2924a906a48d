"""The datasheet of a corpus of Parquet shards: its statistics streamed from the shards
(`marin_data.docs.stats.corpus_stats`), its own card and Croissant file (`marin_data.docs.card`,
`marin_data.docs.croissant`), and what its datasheet says in its own words (`ParquetParts`). Where the files
go is the same for every corpus (`marin_data.docs.write.CorpusDatasheet`).
"""

from __future__ import annotations

from marin_data.corpus.manifest import Corpus, Manifest
from marin_data.docs.card import render_card
from marin_data.docs.croissant import render_croissant
from marin_data.docs.datasheet import subset_table
from marin_data.docs.questions import Metadata
from marin_data.docs.stats import CorpusStats, corpus_stats
from marin_data.docs.write import Assembled, CorpusDatasheet, figures
from marin_data.layout import CARD, CROISSANT
from marin_data.stores.base import Store
from marin_data.ui import human_bytes, plural

__all__ = ["ParquetParts", "parquet_datasheet"]


class ParquetParts:
    """The datasheet's words for Parquet shards (`marin_data.docs.datasheet.SheetParts`)."""

    lengths = ("Tokens per document, streamed from the shards' `tokens` column one row group at a time. Percentiles "
               "are nearest-rank: p90 is the smallest length that at least 90% of documents do not exceed. The mean "
               "is the subset's tokens divided by its documents.")
    everything = "all shards"

    def generated_from(self) -> str:
        return "manifest.json, shards.parquet and the shards"

    def headline(self, manifest: Manifest, stats: CorpusStats, manifest_sha256: str | None) -> list[str]:
        return [f"Corpus `{manifest.name}` version `{manifest.version}`: {plural(len(stats.subsets), 'subset')}, "
                f"{plural(stats.docs, 'document')}, {plural(stats.tokens, 'token')}, {plural(stats.bytes, 'byte')} "
                f"({human_bytes(stats.bytes)}) in {plural(stats.shards, 'shard')}. Manifest sha256 "
                f"`{manifest_sha256}`.", ""]

    def subsets(self, manifest: Manifest, stats: CorpusStats) -> list[str]:
        return ["### Subsets (computed)", "",
                "Every number below is read from `manifest.json`, whose totals `marin-data` checks against "
                "`shards.parquet` (one row per shard) before writing this page. Token counts include the EOS token "
                "appended after every document" + (" and the BOS token before it" if manifest.tokenizer.add_bos
                                                   else "") + "; bytes are the sizes of the Parquet shards.", "",
                subset_table(stats), ""]

    def scan_scopes(self) -> None:
        return None

    def subset_detail(self, index: int, manifest: Manifest) -> list[str]:
        return []

    def tokenization(self, manifest: Manifest) -> tuple[list[str], list[tuple[str, str]]]:
        tok = manifest.tokenizer
        bos = f"`{tok.bos_id}`, prepended to every document" if tok.add_bos else "not added"
        about = ["Documents are stored tokenized, one row per document: columns `id` (string) and `tokens` "
                 "(`large_list<uint32>`), zstd-compressed Parquet. The tokenizer is shipped as `tokenizer.json`; "
                 "its fingerprint is also written in every shard's key-value metadata."]
        return about, [("EOS id (appended to every document)", f"`{tok.eos_id}`"), ("BOS", bos)]

    def unpinned(self, manifest: Manifest) -> None:
        return None  # its manifest pins it


def _assemble(corpus: Corpus, meta: Metadata, scan_tokens: int) -> Assembled:
    stats = corpus_stats(corpus, scan_tokens=scan_tokens)
    outputs = {CARD: render_card(corpus.manifest, stats, meta).encode(),
               CROISSANT: render_croissant(corpus, stats, meta).encode(), **figures(stats)}
    return Assembled(stats, outputs, ParquetParts())


def parquet_datasheet(store: Store, manifest: Manifest, url: str | None = None) -> CorpusDatasheet:
    """The datasheet of the Parquet corpus at ``store`` (``url``: as it was named)."""
    return CorpusDatasheet(store, manifest, _assemble, url)
