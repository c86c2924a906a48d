"""The reserved names of a corpus directory, in one place: what each file or folder is called.

Names only, no behaviour. A corpus (docs/design.md, the corpus layout) is::

    manifest.json  shards.parquet  SHA256SUMS  tokenizer.json  data/<subset>/part-00000.parquet
    sources/<subset>.json                            what each subset was built from (`marin-data shard`)
    README.md  croissant.json  datasheets/*.png      generated documentation, listed in the manifest
    datasheets/datasheet.md                          the one file the manifest does not list (`UNLISTED`)
    mirrors.json                                     where publish put it: local, never published, never trusted

and, in a store it was published to, ``by-sha256/<sha256>/<name>``: every manifest and every file one lists,
under its content (`marin_data.transfer.versions`),

and, beside a Levanter cache fetched unpinned, ``.marin-checked.json`` (what the download checked each file
against), which ``adopt`` turns into a listed ``vouched.json``,

and, while it is being written or fetched, ``.marin.lock``, ``.marin-adopt.jsonl`` (the files an ``adopt`` of a
store has hashed), ``.staging/``, ``*.marin-download.part`` (with
``*.marin-download.ranges.part``) and, in a partial download, ``.marin-download.json``.

A Levanter cache (`marin_data.levanter`) names its own marker files, which are data, not a writer's
leftovers, though their names start with a dot: ``.success`` and ``.stats.json``.
"""

from __future__ import annotations

__all__ = [
    "MANIFEST",
    "SHARDS_INDEX",
    "SUMS",
    "TOKENIZER",
    "DATA",
    "SOURCES",
    "CARD",
    "CROISSANT",
    "DATASHEETS",
    "DATASHEET",
    "COMPOSITION_PNG",
    "LENGTHS_PNG",
    "FIGURES",
    "HEATMAP_PNG",
    "HEATMAP",
    "LISTED",
    "UNLISTED",
    "MIRRORS",
    "BY_SHA256",
    "LOCK_NAME",
    "STAGING",
    "COMMIT",
    "RECORD",
    "CHECKED",
    "VOUCHED",
    "ADOPT_JOURNAL",
    "PARTIAL_SUFFIX",
    "RANGES_SUFFIX",
    "SUCCESS",
    "STATS",
]

# The description of the corpus: the manifest vouches for the others (the root of trust).
MANIFEST = "manifest.json"
SHARDS_INDEX = "shards.parquet"
SUMS = "SHA256SUMS"
TOKENIZER = "tokenizer.json"
DATA = "data"  # data/<subset>/part-NNNNN.parquet
SOURCES = "sources"  # sources/<subset>.json: the inputs a subset was built from

# Generated documentation (`marin-data datasheet`).
CARD = "README.md"  # the Hugging Face dataset card
CROISSANT = "croissant.json"
DATASHEETS = "datasheets"
DATASHEET = f"{DATASHEETS}/datasheet.md"  # relative to the corpus (or --out) root; the figures sit beside it
COMPOSITION_PNG = "token-composition.png"
LENGTHS_PNG = "document-lengths.png"
FIGURES = (f"{DATASHEETS}/{COMPOSITION_PNG}", f"{DATASHEETS}/{LENGTHS_PNG}")
HEATMAP_PNG = "token-heatmap.png"  # a store of Levanter caches named cluster=X/quality=Y only: tokens by cell
HEATMAP = f"{DATASHEETS}/{HEATMAP_PNG}"  # listed in the manifest like the figures when it is written
LISTED = (CARD, CROISSANT, *FIGURES)  # generated files the manifest lists (in-corpus mode)
UNLISTED = (DATASHEET,)  # states the manifest's digest, so the manifest cannot list it
MIRRORS = "mirrors.json"  # the places publish has put the corpus; outside the chain of trust, kept local
BY_SHA256 = "by-sha256"  # in a store: by-sha256/<sha256>/<name>, each published manifest and file it lists

# Present only while the corpus is being written or fetched.
LOCK_NAME = ".marin.lock"  # one writer per corpus
STAGING = ".staging"  # `marin-data shard`'s work in progress
COMMIT = f"{STAGING}/commit"  # a commit's index, SHA256SUMS and manifest before they move into place
RECORD = ".marin-download.json"  # which subsets a partial download holds
CHECKED = ".marin-checked.json"  # an unpinned Levanter download's per-file sizes, digests and how each was checked
VOUCHED = "vouched.json"  # in a cache adopt pinned: per file, checked against its source or first seen locally
ADOPT_JOURNAL = ".marin-adopt.jsonl"  # where adopt of a store builds its pin: the files hashed so far
PARTIAL_SUFFIX = ".marin-download.part"  # data/x/part-00000.parquet.marin-download.part
RANGES_SUFFIX = ".marin-download.ranges.part"  # beside a partial fetched in ranges: what each range holds

# A Levanter cache's own dot files (`marin_data.levanter.ledger`).
SUCCESS = ".success"  # a finished sub-cache of the sharded layout
STATS = ".stats.json"  # Marin's totals beside a cache: {total_tokens, total_elements}
