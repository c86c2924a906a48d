"""The datasheet of a Levanter cache or store: its statistics from the cache (`marin_data.levanter.cachestats`),
its words for the datasheet (`marin_data.levanter.cachesheet.CacheSheet`), and its card and Croissant file
(`marin_data.levanter.describe`, the ones `adopt` wrote).

- Pinned by ``adopt`` (`pinned_datasheet`): documented like any corpus (`marin_data.docs.write.CorpusDatasheet`),
  its cells checked against the manifest's totals and read with the pinned tokenizer.
- Nothing pins it (`CacheDatasheet`: local, ``s3://``, ``hf://``): documented under ``out`` only, with the
  tokenizer it was built with: the datasheet and figures, saying it is not pinned; the card and Croissant
  file, which list what a pin vouches for, come with ``adopt``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from marin_data.corpus.manifest import Corpus, Manifest
from marin_data.corpus.records import SubsetInfo
from marin_data.docs.datasheet import render_datasheet
from marin_data.docs.distribution import ENDPOINT_FLAGS
from marin_data.docs.questions import Metadata, load_metadata, require_complete
from marin_data.docs.stats import SCAN_TOKENS
from marin_data.docs.write import Assembled, CorpusDatasheet, DatasheetResult, figures, result, source_name, \
    write_outputs
from marin_data.errors import InvalidTokenizerError, NotApplicableError, UnpinnedCacheError
from marin_data.layout import CARD, CROISSANT, DATASHEET, HEATMAP, TOKENIZER
from marin_data.levanter.cache import open_cache
from marin_data.levanter.cachesheet import CacheSheet
from marin_data.levanter.cachestats import cache_stats
from marin_data.levanter.describe import descriptions_of, render_cache_card, render_cache_croissant
from marin_data.levanter.detect import CACHE, STORE
from marin_data.levanter.detect import Source as Found
from marin_data.levanter.ledgermeta import load_framed
from marin_data.levanter.pinned import LEVANTER_CACHE, LEVANTER_STORE, cell_prefixes
from marin_data.levanter.summary import cell_bytes, open_cells
from marin_data.raw.tokenizer import tokenizer_from_bytes
from marin_data.stores.base import METADATA_LIMIT, Store
from marin_data.stores.local import LocalStore
from marin_data.transfer.apart import data_url, kept_apart
from marin_data.transfer.read import read_file

__all__ = ["CacheDatasheet", "pinned_datasheet"]


def _assemble_pinned(corpus: Corpus, meta: Metadata, scan_tokens: int, options: dict) -> Assembled:
    """The statistics of a pinned cache's cells, each checked against the manifest's totals, read with the
    pinned tokenizer (checked against the manifest's fingerprint); its card and Croissant file are adopt's.
    A pin kept apart from its data reads the cells where the data is (`kept_apart`, opened with ``options``)."""
    manifest = corpus.manifest
    store = kept_apart(LocalStore(corpus.root), data_url(manifest, corpus.root), (s.path for s in corpus.shards),
                       options)
    tokenizer = tokenizer_from_bytes(read_file(store, TOKENIZER, limit=METADATA_LIMIT) or b"", manifest.tokenizer,
                                     where=str(corpus.root / TOKENIZER))
    computed = cache_stats({s: open_cache(store, p) for s, p in cell_prefixes(manifest).items()},
                           sizes={s: i.bytes for s, i in manifest.subsets.items()}, tokenizer=tokenizer,
                           licenses={s: i.license for s, i in manifest.subsets.items()}, expected=manifest.subsets,
                           scan_tokens=scan_tokens)
    described = descriptions_of(meta, manifest.subsets)
    outputs = {CARD: render_cache_card(manifest, described).encode(),
               CROISSANT: render_cache_croissant(manifest, list(corpus.shards), described).encode(),
               **figures(computed.corpus)}
    sheet = CacheSheet(url=str(corpus.root), kind=STORE if manifest.format == LEVANTER_STORE else CACHE, pinned=True,
                       stats=computed, heatmap=HEATMAP in outputs)
    return Assembled(computed.corpus, outputs, sheet)


def pinned_datasheet(store: Store, manifest: Manifest, url: str | None = None,
                     options: dict | None = None) -> CorpusDatasheet:
    """The datasheet of the cache or store ``adopt`` pinned at ``store`` (``url``: as it was named; ``options``:
    the store options of the data a pin kept apart names)."""
    return CorpusDatasheet(store, manifest, functools.partial(_assemble_pinned, options=dict(options or {})), url)


class CacheDatasheet:
    """The datasheet and figures of a cache or store nothing pins (``found``), named ``url``, under ``out``."""

    def __init__(self, found: Found, url: str, options: dict) -> None:
        self.found, self.url, self.options = found, url, options

    @property
    def subsets(self) -> list[str]:
        """Its cells, or the one subset of a single cache (named after its folder)."""
        return [source_name(self.url)] if self.found.kind == CACHE else list(self.found.cells)

    def check_options(self, *, tokenizer: str | None, out: Path | None) -> None:
        """Raise NotApplicableError: it carries no tokenizer and takes nothing written into it."""
        if tokenizer is None or out is None:
            raise NotApplicableError(f"a Levanter {self.found.kind} not pinned yet carries no tokenizer and takes "
                                     "nothing written into it: pass --tokenizer (the one it was built with) and "
                                     "--out DIR (or pin it first: `marin-data adopt PATH --tokenizer TOK`)")

    def write(self, *, meta: str | os.PathLike | None = None, out: str | os.PathLike | None = None,
              strict: bool = False, scan_tokens: int = SCAN_TOKENS, tokenizer: str | None = None) -> DatasheetResult:
        """The datasheet and figures under ``out``, read with ``tokenizer``."""
        url = self.url
        if tokenizer is None:
            raise InvalidTokenizerError("a Levanter cache carries no tokenizer: name the one it was built with",
                                        path=url)
        out = Path(out) if out is not None else None
        if out is None or ("://" not in url and out.resolve().is_relative_to(Path(url).resolve())):
            raise UnpinnedCacheError("nothing pins this cache, so its datasheet is not written into it: name a "
                                     "folder outside it for the outputs, or pin it and document it in place",
                                     path=url)
        name, names = source_name(url), self.subsets
        answers = load_metadata(meta, subsets=names)
        if strict:
            require_complete(answers, names)  # before anything is read or written
        caches = {k or name: c for k, c in open_cells(self.found, None).items()}
        loaded = load_framed(tokenizer, caches.values())  # its BOS id where the ledgers say one was prepended
        sizes = {k or name: v for k, v in cell_bytes(self.found).items()}
        computed = cache_stats(caches, sizes=sizes, tokenizer=loaded, scan_tokens=scan_tokens)
        stats = computed.corpus
        manifest = Manifest(name=name, version="unpinned", tokenizer=loaded.info,
                            subsets={s.name: SubsetInfo(s.docs, s.tokens, s.bytes, s.shards) for s in stats.subsets},
                            format=LEVANTER_CACHE if self.found.kind == CACHE else LEVANTER_STORE)
        outputs = figures(stats)
        sheet = CacheSheet(url=url, kind=self.found.kind, pinned=False, stats=computed, heatmap=HEATMAP in outputs,
                           store_flags={k: v for k, v in self.options.items() if k in ENDPOINT_FLAGS})
        outputs[DATASHEET] = render_datasheet(manifest, stats, answers, manifest_sha256=None, listed=False,
                                              parts=sheet).encode()
        return result(out, False, None, write_outputs(out, outputs), answers.unanswered(names))
