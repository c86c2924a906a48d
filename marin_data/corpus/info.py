"""``marin-data info``: what a corpus holds, and the digest that vouches for it.

The manifest's own sha256 is the corpus's root of trust (docs/design.md, "The chain of trust"): it is what publish prints, the
datasheet shows, and ``download``/``verify --manifest-sha256`` pin, so ``info`` always shows it. A partial
download lists every subset of its manifest and marks those it holds (its record, `marin_data.corpus.record`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.mirrors import read_mirrors
from marin_data.corpus.names import select_subsets
from marin_data.corpus.record import read_download_record
from marin_data.corpus.records import SubsetInfo
from marin_data.raw.tokenizer import TokenizerInfo
from marin_data.ui import format_table, human_bytes, plural, printable

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
    present: tuple[str, ...] | None = None  # a partial download: the subsets it holds (None: all of them)

    def to_json(self) -> dict:
        total = asdict(total_of(self.subsets))
        del total["license"]
        here = set(self.subsets if self.present is None else self.present)
        return {"corpus": self.root, "name": self.name, "version": self.version,
                "manifest_sha256": self.manifest_sha256, "tokenizer": asdict(self.tokenizer),
                "subsets": {k: {**asdict(v), "present": k in here} for k, v in self.subsets.items()},
                "partial": self.present is not None, "total": total, "mirrors": self.mirrors}

    def __str__(self) -> str:
        t = self.tokenizer
        bos = f", BOS {t.bos_id} prepended" if t.add_bos else ""
        lines = [
            f"{printable(self.name)} {printable(self.version)}  ({printable(self.root)})",
            "",
            subsets_table(self.subsets, self.present),
            "",
            *([f"partial copy     holds {len(self.present)} of {plural(len(self.subsets), 'subset')} (here: yes); "
               "`marin-data download` fetches the others"] if self.present is not None else []),
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
    record = read_download_record(root)
    present = None if record is None else tuple(select_subsets(m.subsets, record.subsets) if record.subsets else ())
    return CorpusInfo(root=str(root), name=m.name, version=m.version, manifest_sha256=corpus.manifest_sha256,
                      tokenizer=m.tokenizer, subsets=dict(sorted(m.subsets.items())), mirrors=read_mirrors(root),
                      present=present)


def total_of(subsets: dict[str, SubsetInfo]) -> SubsetInfo:
    """The sums over subsets (its license is empty)."""
    s = subsets.values()
    return SubsetInfo(docs=sum(i.docs for i in s), tokens=sum(i.tokens for i in s), bytes=sum(i.bytes for i in s),
                      shards=sum(i.shards for i in s), license="")


def subsets_table(subsets: dict[str, SubsetInfo], present: tuple[str, ...] | None = None) -> str:
    """The subsets as a table with a total row: documents, tokens, shards, bytes, license, and, for a partial
    copy (``present``: the subsets it holds), a last column saying which are here."""
    rows = [[name, f"{s.docs:,}", f"{s.tokens:,}", f"{s.shards:,}", human_bytes(s.bytes), s.license]
            for name, s in [*sorted(subsets.items()), ("total", total_of(subsets))]]
    headers = ["subset", "documents", "tokens", "shards", "bytes", "license"]
    if present is not None:
        rows = [[*r, "" if r[0] == "total" else "yes" if r[0] in present else "no"] for r in rows]
        headers.append("here")
    return format_table(headers, rows)
