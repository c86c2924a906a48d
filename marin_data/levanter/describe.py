"""The dataset card and Croissant file of a pinned Levanter cache or store.

A cache is no Parquet: the Hub's dataset viewer and ``datasets`` cannot load it, so the card declares no
configs and says how to read it (marin, or Levanter's ``TreeCache.load``), and the Croissant file lists
every file with its sha256 and each subset's files as a file set, without record sets (Croissant has no
field extraction for Zarr). A subset's description, where the metadata file (``--meta``) gives one, is
listed under the card's table and opens its file set's description.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import yaml

from marin_data.corpus.manifest import Manifest
from marin_data.corpus.records import SHARD, ShardRecord
from marin_data.docs.questions import Metadata
from marin_data.levanter.pinned import LEVANTER_CACHE, cell_prefixes

__all__ = ["render_cache_card", "render_cache_croissant", "descriptions_of"]

_CONTEXT = {"@language": "en", "@vocab": "https://schema.org/", "cr": "http://mlcommons.org/croissant/",
            "sc": "https://schema.org/", "dct": "http://purl.org/dc/terms/"}


def descriptions_of(meta: Metadata, subsets: Iterable[str]) -> dict[str, str]:
    """The subsets' descriptions the metadata file answers (a list of texts joined by spaces)."""
    said = {s: meta.answer(f"subsets.{s}.description") for s in subsets}
    return {s: t if isinstance(t, str) else " ".join(t) for s, t in said.items() if t}


def render_cache_card(manifest: Manifest, descriptions: dict[str, str] | None = None) -> str:
    """``README.md``: YAML header (license, tags), the subsets table (and ``descriptions``: subset -> text,
    those given), how to verify and read it."""
    licenses = sorted({s.license for s in manifest.subsets.values()} - {"unknown"})
    header = {"license": licenses[0] if len(licenses) == 1 else ("other" if licenses else "unknown"),
              "pretty_name": manifest.name, "tags": ["levanter", "pretokenized", "marin"]}
    rows = "\n".join(f"| `{name}` | {s.docs:,} | {s.tokens:,} | {s.shards:,} | {s.license} |"
                     for name, s in sorted(manifest.subsets.items()))
    where = "the repository root" if manifest.format == LEVANTER_CACHE else "the folder named like the subset"
    first = next(iter(sorted(manifest.subsets)), "SUBSET")
    described = "".join(f"\n- `{name}`: {text}" for name, text in sorted((descriptions or {}).items()))
    described += "\n" if described else ""
    return (f"---\n{yaml.safe_dump(header, sort_keys=True)}---\n\n# {manifest.name} {manifest.version}\n\n"
            f"Levanter token caches (Zarr v3), tokenized with `{manifest.tokenizer.name}` (vocabulary "
            f"{manifest.tokenizer.vocab_size:,}), pinned in place by marin: every file is listed with its "
            "SHA-256 in `shards.parquet` and `SHA256SUMS`, which `manifest.json` vouches for. Each subset is "
            f"the cache at {where}.\n\n| subset | documents | tokens | chunk files | license |\n"
            f"| --- | ---: | ---: | ---: | --- |\n{rows}\n{described}\n## Use\n\n```bash\n"
            f"marin-data download hf://datasets/ORG/NAME --subset '{first}' --to data/\n"
            "marin-data verify data/\n```\n\nLevanter loads a downloaded subset with `TreeCache.load` on its "
            "folder; the files are exactly as Levanter wrote them.\n")


def render_cache_croissant(manifest: Manifest, rows: list[ShardRecord],
                           descriptions: dict[str, str] | None = None) -> str:
    """``croissant.json``: a FileObject (with sha256) per file, a FileSet per subset (``descriptions``: as
    `render_cache_card`)."""
    said = {name: f"{text} " for name, text in (descriptions or {}).items()}
    prefixes = cell_prefixes(manifest)
    files = [{"@type": "cr:FileObject", "@id": r.path, "name": r.path, "contentUrl": r.path,
              "contentSize": f"{r.bytes} B", "sha256": r.sha256,
              "encodingFormat": "application/json" if r.path.endswith(".json") else "application/octet-stream"}
             for r in sorted(rows, key=lambda r: r.path)]
    sets = [{"@type": "cr:FileSet", "@id": f"files/{name}", "name": f"files/{name}",
             "description": f"{said.get(name, '')}The Levanter cache of subset {name}: {info.shards:,} data chunk "
                            "files.",
             "encodingFormat": "application/octet-stream",
             "includes": f"{prefixes[name]}/**" if prefixes[name] else "**"}
            for name, info in sorted(manifest.subsets.items())]
    tokens = sum(r.tokens for r in rows if r.kind == SHARD)
    doc = {"@context": _CONTEXT, "@type": "sc:Dataset", "conformsTo": "http://mlcommons.org/croissant/1.1",
           "name": manifest.name, "version": manifest.version,
           "description": f"Levanter token caches of {tokens:,} tokens in {len(manifest.subsets)} subsets, "
                          f"tokenizer {manifest.tokenizer.name}.",
           "distribution": files + sets}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"
