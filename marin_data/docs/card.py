"""The Hugging Face dataset card (``README.md``): a YAML header the Hub reads, and a short body.

The header has one ``configs`` entry per subset, whose ``data_files`` glob is the subset's shard folder
(``data/<subset>/*.parquet``; ``*`` does not cross ``/``, so a subset never picks up its children's shards),
and a default config ``all`` (every subset's folder), so ``load_dataset("org/name")`` works without naming a
config as it does on the Hub; and ``dataset_info`` with each subset's features, document count and Parquet bytes. ``datasets`` ignores
a split without ``num_bytes`` (its in-memory Arrow size), and that needs the ids' total length, which no
metadata records; the card gives the exact Arrow size of the ``tokens`` column from the manifest's counts
(4 bytes per token + 8 per document offset). Ids, a few dozen bytes per document, are left out rather than
estimated. Config names cannot
contain ``/`` (``datasets`` refuses ``<>:/\\|?*`` in them), so ``pretrain/dclm`` becomes ``pretrain--dclm``;
two subsets that would collide are an error rather than a silently merged config.

SPDX ids map to the Hub's license ids (mostly the lower-cased SPDX id); a license the Hub does not know
becomes ``other`` with ``license_name``/``license_link`` naming it, as the Hub asks: the link is the SPDX
page of an id on the SPDX license list (`spdx_page`), and otherwise (a ``LicenseRef-*`` of the corpus's
own, an expression, several licenses) the datasheet's per-subset license table.

The card deliberately does not state the manifest's sha256: it is listed in the manifest (so mirrors and
``sha256sum -c`` cover it), and a file cannot hold the digest of a manifest that holds the file's digest.
It links to the datasheet, which does (see `marin_data.docs.write`).
"""

from __future__ import annotations

from marin_data.corpus.manifest import Manifest
from marin_data.docs import markdown as md
from marin_data.docs.questions import Metadata
from marin_data.docs.stats import CorpusStats
from marin_data.errors import InvalidManifestError
from marin_data.layout import DATASHEET

__all__ = ["config_name", "default_config_name", "hub_license", "spdx_page", "size_category", "card_header",
           "render_card"]

# Hub license ids that are the lower-cased SPDX id (https://huggingface.co/docs/hub/repositories-licenses).
_HUB_SPDX = frozenset({
    "apache-2.0", "mit", "afl-3.0", "artistic-2.0", "bsl-1.0", "bsd-2-clause", "bsd-3-clause",
    "bsd-3-clause-clear", "cc0-1.0", "cc-by-2.0", "cc-by-2.5", "cc-by-3.0", "cc-by-4.0", "cc-by-sa-3.0",
    "cc-by-sa-4.0", "cc-by-nc-2.0", "cc-by-nc-3.0", "cc-by-nc-4.0", "cc-by-nd-4.0", "cc-by-nc-nd-3.0",
    "cc-by-nc-nd-4.0", "cc-by-nc-sa-2.0", "cc-by-nc-sa-3.0", "cc-by-nc-sa-4.0", "cdla-sharing-1.0",
    "cdla-permissive-1.0", "cdla-permissive-2.0", "wtfpl", "ecl-2.0", "epl-1.0", "epl-2.0", "etalab-2.0",
    "eupl-1.1", "eupl-1.2", "agpl-3.0", "gpl-2.0", "gpl-3.0", "lgpl-2.1", "lgpl-3.0", "isc", "lppl-1.3c",
    "ms-pl", "mpl-2.0", "osl-3.0", "postgresql", "ofl-1.1", "ncsa", "unlicense", "zlib",
})
# SPDX ids the Hub spells differently.
_HUB_RENAMED = {"odc-by-1.0": "odc-by", "odbl-1.0": "odbl", "pddl-1.0": "pddl", "unknown": "unknown"}
# Hub size categories by number of examples (documents).
_SIZES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
          (10**7, "1M<n<10M"), (10**8, "10M<n<100M"), (10**9, "100M<n<1B"), (10**10, "1B<n<10B"),
          (10**11, "10B<n<100B"), (10**12, "100B<n<1T"))


def config_name(subset: str) -> str:
    return subset.replace("/", "--")


def default_config_name(configs: list[str]) -> str:
    """``all``, or with as many leading ``_`` as it takes not to be the config of a subset."""
    name = "all"
    while name in configs:
        name = "_" + name
    return name


def hub_license(spdx: str) -> str:
    """The Hub's id for an SPDX license id, or ``other``."""
    key = spdx.lower()
    return _HUB_RENAMED.get(key) or (key if key in _HUB_SPDX else "other")


def spdx_page(license_id: str) -> str | None:
    """The SPDX page of a license on the SPDX license list (any case), or None: a ``LicenseRef-*`` of one's
    own, an expression (``MIT OR Apache-2.0``) or an unknown name has none."""
    from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression

    try:
        canonical = canonicalize_license_expression(license_id)
    except InvalidLicenseExpression:
        return None
    if " " in canonical or canonical.startswith(("LicenseRef-", "DocumentRef-")):
        return None
    return f"https://spdx.org/licenses/{canonical.removesuffix('+')}.html"


def size_category(docs: int) -> str:
    return next((name for limit, name in _SIZES if docs < limit), "n>1T")


def _arrow_bytes(docs: int, tokens: int) -> int:
    """In-memory Arrow size of a subset's ``tokens`` column: uint32 values plus int64 list offsets."""
    return 4 * tokens + 8 * (docs + 1)


def card_header(manifest: Manifest, stats: CorpusStats, meta: Metadata) -> dict:
    """The card's YAML header as a dict (kept separate so tests can compare it with the corpus)."""
    names = [s.name for s in stats.subsets]
    configs = [config_name(n) for n in names]
    if len(set(configs)) != len(configs):
        raise InvalidManifestError(f"subset names collide as Hub config names: {sorted(names)}")
    spdx = sorted({s.license for s in stats.subsets})
    hub = sorted({hub_license(x) for x in spdx})
    header: dict = {"license": hub[0] if len(hub) == 1 else hub}
    others = [x for x in spdx if hub_license(x) == "other"]
    if others:
        header["license_name"] = "-and-".join(x.lower() for x in others)
        # the SPDX text of one listed license; otherwise the datasheet's per-subset license table
        header["license_link"] = (spdx_page(others[0]) if len(others) == 1 else None) or DATASHEET
    header["pretty_name"] = meta.pretty_name or manifest.name
    header["size_categories"] = [size_category(stats.docs)]
    header["tags"] = ["marin", "tokenized", "pretraining"]
    default = default_config_name(configs)
    header["configs"] = [
        {"config_name": default, "default": True,
         "data_files": [{"split": "train", "path": [f"data/{n}/*.parquet" for n in names]}]},
        *({"config_name": c, "data_files": [{"split": "train", "path": f"data/{n}/*.parquet"}]}
          for c, n in zip(configs, names)),
    ]
    header["dataset_info"] = [
        _info(default, stats.docs, stats.tokens, stats.bytes),
        *(_info(config_name(s.name), s.docs, s.tokens, s.bytes) for s in stats.subsets),
    ]
    return header


def _info(config: str, docs: int, tokens: int, nbytes: int) -> dict:
    return {"config_name": config,
            "features": [{"name": "id", "dtype": "string"}, {"name": "tokens", "large_list": "uint32"}],
            "splits": [{"name": "train", "num_bytes": _arrow_bytes(docs, tokens), "num_examples": docs}],
            "download_size": nbytes, "dataset_size": _arrow_bytes(docs, tokens)}


def render_card(manifest: Manifest, stats: CorpusStats, meta: Metadata) -> str:
    """The whole ``README.md``: YAML header, then a summary, subset table, loading snippet and links."""
    import yaml

    header = yaml.safe_dump(card_header(manifest, stats, meta), sort_keys=False, allow_unicode=True, width=1000)
    title = meta.pretty_name or manifest.name
    first = stats.subsets[0].name if stats.subsets else "SUBSET"
    rows = [(f"`{s.name}`", f"`{config_name(s.name)}`", md.count(s.docs), md.count(s.tokens),
             md.share(s.token_share), s.license) for s in stats.subsets]
    body = [
        f"# {title}", "",
        md.answer(meta, "motivation.summary"), "",
        f"Tokenized with `{manifest.tokenizer.name}` (fingerprint `{manifest.tokenizer.sha256}`): each row is one "
        "document, columns `id` (string) and `tokens` (`large_list<uint32>`, EOS appended).", "",
        "## Subsets", "",
        md.table(("Subset", "Config", "Documents", "Tokens", "Token share", "License"), rows, "llrrrl"), "",
        f"The default config, `{default_config_name([config_name(s.name) for s in stats.subsets])}`, reads every "
        "subset.", "",
        "## Use", "",
        "Every shard is a plain Parquet file; with a local copy (`marin-data download`, see the datasheet):", "",
        md.code(["from datasets import load_dataset",
                 f'ds = load_dataset("parquet", data_files="data/{first}/*.parquet", split="train")'], "python"),
        "",
        f"The [datasheet]({DATASHEET}) answers how the data was collected, cleaned and may be used, gives "
        "document-length statistics, and states the manifest's sha256 with the exact download and "
        "verification commands. [`croissant.json`](croissant.json) describes the files in MLCommons "
        "Croissant.", "",
        "## Citation", "",
        md.answer(meta, "distribution.citation"),
    ]
    return f"---\n{header}---\n\n" + "\n".join(body).rstrip("\n") + "\n"
