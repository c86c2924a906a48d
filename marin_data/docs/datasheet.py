"""The datasheet: Markdown in the seven sections of *Datasheets for Datasets* (Gebru et al., 2021).

Each section interleaves computed facts (tables built from the manifest and the length statistics) with
curated answers to the questions of `marin_data.docs.questions`, quoted as written in the metadata file.
No number is typed in and no answer is made up: a missing answer prints **Not answered.** with its id.
The text holds no timestamp and no tool version, so the same corpus and metadata give the same bytes.
What a format says in its own words (the headline, the subsets table, how lengths are measured, how tokens
are stored, and, for a source nothing pins, that it has no root of trust) comes from its `SheetParts`
(a Parquet corpus: `marin_data.formats.marin.datasheet`; a Levanter cache or store:
`marin_data.levanter.cachesheet`); the sections around them are the same for every format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from marin_data.corpus.manifest import Manifest
from marin_data.docs import markdown as md
from marin_data.docs.distribution import SOURCE_PLACEHOLDER, download_command, mirrors, mirrors_of, verify_commands
from marin_data.docs.questions import QUESTIONS, SECTIONS, SUBSET_QUESTIONS, Metadata
from marin_data.docs.stats import PERCENTILES, CorpusStats
from marin_data.layout import COMPOSITION_PNG, LENGTHS_PNG
from marin_data.ui import plural

__all__ = ["SheetParts", "render_datasheet", "subset_table"]


SUBSET_HEADERS = ("Subset", "Documents", "Tokens", "Bytes", "Shards", "Token share", "License")
LENGTH_HEADERS = ("Subset", "Documents scanned", *(f"p{p}" for p in PERCENTILES), "max", "mean", "Scope")


class SheetParts(Protocol):
    """What a format says in its own words. ``lengths``: how document lengths were measured;
    ``everything``: the *Scope* of a subset measured in full."""

    lengths: str
    everything: str

    def generated_from(self) -> str:
        """What the datasheet was computed from, for its header comment."""

    def headline(self, manifest: Manifest, stats: CorpusStats, manifest_sha256: str | None) -> list[str]:
        """The lines under the title: what it is, its totals and its pin."""

    def subsets(self, manifest: Manifest, stats: CorpusStats) -> list[str]:
        """The composition section's table of subsets (its heading included)."""

    def scan_scopes(self) -> list[str] | None:
        """What the duplicate scan read of each subset, where it is not what the lengths read (else None)."""

    def subset_detail(self, index: int, manifest: Manifest) -> list[str]:
        """Computed lines atop the ``index``-th subset's own questions."""

    def tokenization(self, manifest: Manifest) -> tuple[list[str], list[tuple[str, str]]]:
        """How the tokens are stored (paragraphs), and the tokenizer table's rows after name, digest and
        vocabulary size."""

    def unpinned(self, manifest: Manifest) -> list[str] | None:
        """The distribution section after the licenses table of a source nothing pins (it has no root of
        trust); None where a manifest pins it."""


def _questions(meta: Metadata, section: str) -> list[str]:
    out = []
    for q in QUESTIONS:
        if q.section == section:
            out += [f"**{q.text}**", "", md.answer(meta, q.id), ""]
    return out


def subset_table(stats: CorpusStats) -> str:
    """Every subset's totals, its token share and license, and a total row."""
    rows = [(f"`{s.name}`", md.count(s.docs), md.count(s.tokens), md.count(s.bytes), md.count(s.shards),
             md.share(s.token_share), s.license) for s in stats.subsets]
    licenses = ", ".join(sorted({s.license for s in stats.subsets}))
    rows.append(("**Total**", md.count(stats.docs), md.count(stats.tokens), md.count(stats.bytes),
                 md.count(stats.shards), md.share(1.0 if stats.tokens else 0.0), licenses))
    return md.table(SUBSET_HEADERS, rows, "lrrrrrl")


def _length_table(stats: CorpusStats, everything: str) -> str:
    rows = []
    for s in stats.subsets:
        ls = s.lengths
        scope = f"sample: {ls.shards_scanned} of {plural(s.shards, 'shard')}" if ls.sampled else everything
        mean = f"{s.tokens / s.docs:,.1f}" if s.docs else "0.0"
        rows.append((f"`{s.name}`", md.count(ls.docs), *(md.count(ls.percentile(p)) for p in PERCENTILES),
                     md.count(ls.max), mean, scope))
    return md.table(LENGTH_HEADERS, rows, "l" + "r" * (len(LENGTH_HEADERS) - 2) + "l")


def _ratio(part: int, whole: int) -> str:
    return md.share(part / whole if whole else 0.0)


def _duplicates(stats: CorpusStats, scopes: list[str] | None) -> list[str]:
    """Exact duplicates within each subset and shared by each pair, with their share of the scanned tokens;
    ``scopes``: what was scanned of each subset, as a last column (a cache's), when it is not the lengths'."""
    dup = stats.duplicates
    if dup is None:
        return []
    rows = [(f"`{s.name}`", md.count(int(dup.scanned_docs[i])), md.count(int(dup.within_docs[i])),
             md.count(int(dup.within_tokens[i])), _ratio(int(dup.within_tokens[i]), int(dup.scanned_tokens[i])),
             *([scopes[i]] if scopes else [])) for i, s in enumerate(stats.subsets)]
    headers = ("Subset", "Documents scanned", "Copies", "Tokens in copies", "Share of scanned tokens",
               *(["Scope"] if scopes else []))
    out = ["### Exact duplicates (computed)", "",
           "Documents whose stored tokens are identical, among the documents scanned "
           + ("(*Scope* says which files of a cell were read; a document cut by the edge of what was read is not "
              "scanned). " if scopes else "above. ") + "Each document's "
           "tokens get a 128-bit BLAKE2b digest; each shard's digests are appended to bucket files on disk "
           "chosen by the digest, and each bucket is sorted on its own, so memory stays bounded whatever the "
           "corpus size. *Copies* are the documents beyond the first of each text that occurs more than once in "
           "its subset (what deduplicating the subset would remove). A text contained in a longer document (a "
           "file that quotes another's text, a docstring inside its module's source) is not an exact "
           "duplicate and is not counted."
           + (" In subsets measured on a sample of shards, only copies among the scanned documents are found."
              if dup.sampled.any() else ""), "",
           md.table(headers, rows, "lrrrr" + "l" * bool(scopes)), ""]
    pairs = [(a, b) for a in range(len(stats.subsets)) for b in range(a + 1, len(stats.subsets))
             if dup.cross_docs[a, b]]
    if not pairs:
        return out + ["No two subsets share a document.", ""]
    rows = [(f"`{stats.subsets[a].name}`", f"`{stats.subsets[b].name}`",
             md.count(int(dup.cross_docs[a, b])), _ratio(int(dup.cross_tokens[a, b]), int(dup.scanned_tokens[a])),
             md.count(int(dup.cross_docs[b, a])), _ratio(int(dup.cross_tokens[b, a]), int(dup.scanned_tokens[b])))
            for a, b in pairs]
    return out + ["Pairs of subsets that share documents (every other pair shares none):", "",
                  md.table(("Subset A", "Subset B", "Documents of A also in B", "Share of A's tokens",
                            "Documents of B also in A", "Share of B's tokens"), rows, "llrrrr"), ""]


def _composition(manifest: Manifest, stats: CorpusStats, meta: Metadata, parts: SheetParts) -> list[str]:
    sampled = any(s.lengths.sampled for s in stats.subsets)
    out = [*parts.subsets(manifest, stats),
           f"![Token composition by subset]({COMPOSITION_PNG})", "",
           "### Document lengths (computed)", "", parts.lengths, ""]
    if sampled:
        out += ["Subsets too large to decode in full were measured on whole shards spread evenly over the "
                "subset (see *Scope*): their percentiles are estimates from the documents scanned, and *max* "
                "is the longest document seen.", ""]
    out += [_length_table(stats, parts.everything), "",
            f"![Document-length distribution by subset]({LENGTHS_PNG})", "",
            *_duplicates(stats, parts.scan_scopes()),
            "### Questions", "", *_questions(meta, "composition"), "### Subsets in detail", ""]
    for i, s in enumerate(stats.subsets):
        out += [f"#### `{s.name}`", "", *parts.subset_detail(i, manifest)]
        for q in SUBSET_QUESTIONS:
            out += [f"**{q.text}**", "", md.answer(meta, q.for_subset(s.name).id), ""]
    return out


def _preprocessing(manifest: Manifest, meta: Metadata, parts: SheetParts) -> list[str]:
    tok = manifest.tokenizer
    about, rows = parts.tokenization(manifest)
    rows = [("Name", f"`{tok.name}`"), ("Fingerprint (sha256 of `tokenizer.json`)", f"`{tok.sha256}`"),
            ("Vocabulary size", md.count(tok.vocab_size)), *rows]
    return ["### Tokenization (computed)", "", *about, "",
            md.table(("Tokenizer", "Value"), rows, "ll"), "",
            "### Questions", "", *_questions(meta, "preprocessing")]


def _distribution(manifest: Manifest, stats: CorpusStats, meta: Metadata, manifest_sha256: str | None,
                  listed: bool, published: Sequence[dict], parts: SheetParts) -> list[str]:
    dest = f"./{manifest.name}"
    recorded = mirrors(published)
    out = ["### Licenses (computed)", "",
           md.table(("Subset", "License (SPDX)"), [(f"`{s.name}`", s.license) for s in stats.subsets], "ll"),
           ""]
    unpinned = parts.unpinned(manifest)
    if unpinned is not None:
        return out + [*unpinned, "### Questions", "", *_questions(meta, "distribution")]
    out += ["### Root of trust", "",
           f"`manifest.json` has sha256 **`{manifest_sha256}`**. It lists the sha256 and size of every "
           "other metadata file, and `shards.parquet` lists those of every shard, so this one digest vouches "
           "for every byte. Pin it when downloading or verifying, so that a tampered mirror cannot vouch for "
           "itself:", "",
           md.code(verify_commands(dest, manifest_sha256)), ""]
    if listed:
        out += ["The dataset card (`README.md`), `croissant.json` and the figures are listed in `manifest.json` "
                "and `SHA256SUMS`. This datasheet is the one file they do not list: it states the manifest's "
                "digest, and no file can hold the digest of a manifest that holds the file's own digest. "
                "Obtain the digest from a source you trust (the publisher's announcement) rather than from a "
                "mirror's copy of this page.", ""]
    else:
        out += ["This datasheet and the files beside it were generated outside the corpus (`--out`): the "
                "manifest does not list them.", ""]
    out += ["### Mirrors", ""]
    if recorded:
        rows = [(f"`{m.url}`", f"`{m.endpoint[1]}`" if m.endpoint else "default",
                 "all" if m.subsets is None else ", ".join(f"`{s}`" for s in m.subsets)) for m in recorded]
        out += [md.table(("URL", "Endpoint", "Subsets"), rows, "lll"), "",
                "Where the corpus was published does not change the digest above: any mirror serves the same "
                "`manifest.json`.", ""]
    else:
        out += [f"No mirror is recorded yet (`marin-data publish` records each one it completes). The commands "
                f"below show the form, with `{SOURCE_PLACEHOLDER}` standing for an `s3://bucket/prefix` URL, an "
                "`hf://datasets/org/name` repo or a local copy of the corpus.", ""]
    out += ["### Download one subset", ""]
    for s in stats.subsets:
        found = mirrors_of(published, s.name)
        lines = [download_command(m, s.name, dest, manifest_sha256) for m in found] or [
            download_command(None, s.name, dest, manifest_sha256)]
        out += [f"`{s.name}`" + ("" if found or not recorded else " (no recorded mirror holds it)") + ":", "",
                md.code(lines), ""]
    return out + ["### Questions", "", *_questions(meta, "distribution")]


def render_datasheet(manifest: Manifest, stats: CorpusStats, meta: Metadata, *, manifest_sha256: str | None,
                     listed: bool, parts: SheetParts, published: Sequence[dict] = ()) -> str:
    """The datasheet's Markdown.

    Args:
        manifest: the corpus manifest, as it stands once the generated files are committed (a cache nothing
            pins: one made in memory from its ledgers and the tokenizer given, pinning nothing).
        stats: the statistics of the same data (`marin_data.docs.stats.CorpusStats`).
        meta: curated answers.
        manifest_sha256: sha256 of that manifest's bytes (None for a cache nothing pins).
        listed: whether the card, Croissant file and figures are listed in the manifest (False with --out).
        published: the places the corpus was published (`marin_data.corpus.mirrors.read_mirrors`).
        parts: what its format says in its own words (`SheetParts`).
    """
    title = meta.pretty_name or manifest.name
    unanswered = meta.unanswered(s.name for s in stats.subsets)
    out = [
        f"# Datasheet: {title}", "",
        "<!-- Generated by `marin-data datasheet` from "
        + parts.generated_from()
        + (f", with answers from {meta.source}" if meta.source else "")
        + ". Edit the metadata file and regenerate; do not edit this file. -->", "",
        *parts.headline(manifest, stats, manifest_sha256),
        "Numbers marked *computed* come from the corpus itself; every other answer is quoted from the "
        "dataset's metadata file, and a question nobody answered says so.", "",
    ]
    for n, (key, name) in enumerate(SECTIONS, 1):
        out += [f"## {n}. {name}", ""]
        if key == "composition":
            out += _composition(manifest, stats, meta, parts)
        elif key == "preprocessing":
            out += _preprocessing(manifest, meta, parts)
        elif key == "distribution":
            out += _distribution(manifest, stats, meta, manifest_sha256, listed, published, parts)
        else:
            out += _questions(meta, key)
    out += ["## Unanswered questions", ""]
    out += [f"- `{qid}`" for qid in unanswered] if unanswered else ["Every question is answered."]
    return "\n".join(out).rstrip("\n") + "\n"
