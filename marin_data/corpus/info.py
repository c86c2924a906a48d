"""``marin-data info``: what a corpus holds, and the digest that vouches for it.

The manifest's own sha256 is the corpus's root of trust (docs/design.md, "The chain of trust"): it is what publish prints, the
datasheet shows, and ``download``/``verify --manifest-sha256`` pin, so ``info`` always shows it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from marin_data.corpus.manifest import SubsetInfo, load_corpus
from marin_data.corpus.mirrors import read_mirrors
from marin_data.raw.tokenizer import TokenizerInfo
from marin_data.ui import format_table, human_bytes, printable

__all__ = ["CorpusInfo", "corpus_info", "total_of", "subsets_table"]


@dataclass(frozen=True)
class CorpusInfo:
    root: str
    name: str
    version: str
    manifest_sha256: str
    tokenizer: TokenizerInfo
    subsets: dict[str, SubsetInfo]
    mirrors: list[dict]

    def to_json(self) -> dict:
        total = asdict(total_of(self.subsets))
        del total["license"]
        return {"corpus": self.root, "name": self.name, "version": self.version,
                "manifest_sha256": self.manifest_sha256, "tokenizer": asdict(self.tokenizer),
                "subsets": {k: asdict(v) for k, v in self.subsets.items()}, "total": total, "mirrors": self.mirrors}

    def __str__(self) -> str:
        t = self.tokenizer
        bos = f", BOS {t.bos_id} prepended" if t.add_bos else ""
        lines = [
            f"{printable(self.name)} {printable(self.version)}  ({printable(self.root)})",
            "",
            subsets_table(self.subsets),
            "",
            f"tokenizer        {printable(t.name)}: vocab {t.vocab_size:,}, EOS {t.eos_id}{bos}; tokenizer.json sha256 {t.sha256}",
            *(f"mirror           {printable(m.get('url'))}  ({printable(', '.join(m.get('subsets') or ['all subsets']))})"
              for m in self.mirrors),
            f"manifest sha256  {self.manifest_sha256}",
        ]
        return "\n".join(lines)


def corpus_info(root: str | os.PathLike) -> CorpusInfo:
    """Read a local corpus's manifest and shard index (both checked, see `load_corpus`) into a summary.

    Raises:
        InvalidManifestError: no manifest, or a malformed or inconsistent one.
    """
    corpus = load_corpus(root)
    m = corpus.manifest
    return CorpusInfo(root=str(root), name=m.name, version=m.version, manifest_sha256=corpus.manifest_sha256,
                      tokenizer=m.tokenizer, subsets=dict(sorted(m.subsets.items())), mirrors=read_mirrors(root))


def total_of(subsets: dict[str, SubsetInfo]) -> SubsetInfo:
    """The sums over subsets (its license is empty)."""
    s = subsets.values()
    return SubsetInfo(docs=sum(i.docs for i in s), tokens=sum(i.tokens for i in s), bytes=sum(i.bytes for i in s),
                      shards=sum(i.shards for i in s), license="")


def subsets_table(subsets: dict[str, SubsetInfo]) -> str:
    """The subsets as a table with a total row: documents, tokens, shards, bytes, license."""
    rows = [[name, f"{s.docs:,}", f"{s.tokens:,}", f"{s.shards:,}", human_bytes(s.bytes), s.license]
            for name, s in [*sorted(subsets.items()), ("total", total_of(subsets))]]
    return format_table(["subset", "documents", "tokens", "shards", "bytes", "license"], rows)
