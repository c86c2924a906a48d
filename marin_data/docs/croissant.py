"""MLCommons Croissant 1.1 metadata (``croissant.json``): the corpus's files and record structure.

- one ``cr:FileObject`` per shard, with its ``sha256`` and ``contentSize`` from ``shards.parquet`` (the same
  SHA-256 + size content hash that the manifest, S3 and the Hub's LFS use — docs/design.md);
- one ``cr:FileSet`` per subset (``data/<subset>/*.parquet``) that its record set reads;
- one ``cr:RecordSet`` per subset with two fields: ``id`` (``sc:Text``) and ``tokens`` (``cr:UInt32``,
  ``isArray``, variable length).

Paths are relative to the file, so the same ``croissant.json`` works in a local copy, under an S3 prefix
and in a Hub repo; ``mlcroissant`` reads records from a local copy directly. The ``@context`` is the
standard one for 1.1 (``mlcroissant`` warns on any other). Keys are sorted and nothing time-dependent is
written, so the same corpus gives the same bytes. At ~100,000 shards the file is ~30 MB: large, but
still one small request next to the shards it describes.
"""

from __future__ import annotations

import json
from collections import Counter

from marin_data.corpus.manifest import Corpus
from marin_data.docs.questions import Metadata
from marin_data.docs.stats import CorpusStats
from marin_data.errors import InvalidManifestError
from marin_data.ui import plural

__all__ = ["CONFORMS_TO", "CONTEXT", "croissant_jsonld", "render_croissant"]

CONFORMS_TO = "http://mlcommons.org/croissant/1.1"
PARQUET = "application/x-parquet"
CONTEXT = {
    "@language": "en",
    "@vocab": "https://schema.org/",
    "arrayShape": "cr:arrayShape",
    "citeAs": "cr:citeAs",
    "column": "cr:column",
    "conformsTo": "dct:conformsTo",
    "containedIn": "cr:containedIn",
    "cr": "http://mlcommons.org/croissant/",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/",
    "description": {"@container": "@language"},
    "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract",
    "field": "cr:field",
    "fileProperty": "cr:fileProperty",
    "fileObject": "cr:fileObject",
    "fileSet": "cr:fileSet",
    "format": "cr:format",
    "includes": "cr:includes",
    "isArray": "cr:isArray",
    "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath",
    "key": "cr:key",
    "md5": "cr:md5",
    "name": {"@container": "@language"},
    "parentField": "cr:parentField",
    "path": "cr:path",
    "recordSet": "cr:recordSet",
    "references": "cr:references",
    "regex": "cr:regex",
    "repeated": "cr:repeated",
    "replace": "cr:replace",
    "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/",
    "separator": "cr:separator",
    "source": "cr:source",
    "subField": "cr:subField",
    "transform": "cr:transform",
}


def _fileset_id(subset: str) -> str:
    return f"files/{subset}"


def _record_set(subset: str, description: str) -> dict:
    def field(column: str, data_type: str, text: str, **extra) -> dict:
        return {"@type": "cr:Field", "@id": f"{subset}/{column}", "name": f"{subset}/{column}",
                "description": text, "dataType": data_type,
                "source": {"fileSet": {"@id": _fileset_id(subset)}, "extract": {"column": column}}, **extra}

    return {
        "@type": "cr:RecordSet", "@id": subset, "name": subset, "description": description,
        "field": [
            field("id", "sc:Text", "Document id, unique within the corpus."),
            field("tokens", "cr:UInt32", "Token ids of the document, EOS appended.", isArray=True, arrayShape="-1"),
        ],
    }


def croissant_jsonld(corpus: Corpus, stats: CorpusStats, meta: Metadata) -> dict:
    """The Croissant document as a dict."""
    manifest = corpus.manifest
    summary = meta.answer("motivation.summary")
    description = summary if isinstance(summary, str) else (
        f"Tokenized pretraining corpus {manifest.name} version {manifest.version}: {stats.docs:,} documents, "
        f"{stats.tokens:,} tokens in {plural(len(stats.subsets), 'subset')}, tokenizer {manifest.tokenizer.name}."
    )
    doc: dict = {
        "@context": CONTEXT,
        "@type": "sc:Dataset",
        "conformsTo": CONFORMS_TO,
        "name": meta.pretty_name or manifest.name,
        "description": description,
        "version": manifest.version,
    }
    licenses = [f"https://spdx.org/licenses/{x}.html" for x in sorted({s.license for s in stats.subsets})
                if x != "unknown"]
    if licenses:
        doc["license"] = licenses
    optional = {"url": "distribution.homepage", "datePublished": "distribution.date_published",
                "citeAs": "distribution.citation"}
    for key, qid in optional.items():
        value = meta.answer(qid)
        if value is not None:
            doc[key] = value if isinstance(value, str) else "\n".join(value)
    files = [{"@type": "cr:FileObject", "@id": s.path, "name": s.path, "contentUrl": s.path,
              "contentSize": f"{s.bytes} B", "encodingFormat": PARQUET, "sha256": s.sha256}
             for s in sorted(corpus.shards, key=lambda s: s.path)]
    sets = [{"@type": "cr:FileSet", "@id": _fileset_id(s.name), "name": _fileset_id(s.name),
             "description": f"The Parquet shards of subset {s.name}.", "encodingFormat": PARQUET,
             "includes": f"data/{s.name}/*.parquet"} for s in stats.subsets]
    doc["distribution"] = files + sets
    records = []
    for s in stats.subsets:
        text = meta.answer(f"subsets.{s.name}.description")
        records.append(_record_set(s.name, text if isinstance(text, str) else
                                   f"Subset {s.name}: {s.docs:,} documents, {s.tokens:,} tokens ({s.license})."))
    doc["recordSet"] = records
    ids = [n["@id"] for n in doc["distribution"] + records] + [f["@id"] for r in records for f in r["field"]]
    clashes = sorted(i for i, n in Counter(ids).items() if n > 1)
    if clashes:  # e.g. subsets "a" and "a/id": the field a/id and the record set a/id
        raise InvalidManifestError(f"subset names give clashing Croissant ids: {', '.join(clashes)}")
    return doc


def render_croissant(corpus: Corpus, stats: CorpusStats, meta: Metadata) -> str:
    return json.dumps(croissant_jsonld(corpus, stats, meta), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
