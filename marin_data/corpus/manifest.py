"""The corpus description read as a whole: ``manifest.json``, and a local corpus loaded through it.

A corpus is a directory tree (docs/design.md, "The corpus format")::

    manifest.json     corpus-level facts; names the sha256 of every other metadata file (root of trust)
    shards.parquet    one row per shard (`marin_data.corpus.index`)
    SHA256SUMS        ``sha256sum -c SHA256SUMS`` checks every shard and metadata file with coreutils alone
    tokenizer.json
    data/<subset>/part-00000.parquet

The chain of trust: the sha256 of ``manifest.json`` (printed by publish, shown in the datasheet, pinned
with ``--manifest-sha256``) vouches for ``shards.parquet`` through ``manifest["files"]``, which vouches for
every shard. The manifest is written last (`marin_data.corpus.commit`), so it never names a file that is not
there. It also fixes which Hugging Face repo of the corpus holds each subset (``manifest["repos"]``), so a
download finds the part repos through the pinned digest; where the corpus was published is recorded
outside it (`marin_data.corpus.mirrors`), so publishing never changes the digest. A pin kept apart from its
data (``adopt --pin-to``) names where the shard files are in ``data``, under the digest: a download fetches
them from there and checks each against the index as always.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from marin_data.corpus.index import read_shard_index
from marin_data.corpus.names import check_digest, check_subset_name, is_reserved, safe_relpath
from marin_data.corpus.records import SHARD, FileRecord, ShardRecord, SubsetInfo
from marin_data.errors import InvalidManifestError, ManifestHashMismatchError, shown
from marin_data.layout import COMMIT, MANIFEST, SHARDS_INDEX
from marin_data.raw.tokenizer import TokenizerInfo
from marin_data.fileio.untrusted_json import loads

__all__ = [
    "SCHEMA_VERSION",
    "MARIN",
    "Manifest",
    "Corpus",
    "load_corpus",
    "shards_fingerprint",
    "summarize_subsets",
]

SCHEMA_VERSION = 1
# `Manifest.format`: what the shards are, the name of a registered format (`marin_data.formats`, which refuses
# a name it does not know when the corpus is opened). MARIN (the default): Parquet shards under data/<subset>/.
MARIN = "marin"
_FORMAT_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_CREDENTIALS = re.compile(r"://[^/]*@|[\x00-\x1f]")  # user:secret@ in a URL, or a control character


@dataclass
class Manifest:
    name: str
    version: str
    tokenizer: TokenizerInfo
    subsets: dict[str, SubsetInfo] = field(default_factory=dict)
    files: dict[str, FileRecord] = field(default_factory=dict)
    # subset -> the Hub repo that holds its shards: 1 the main repo org/name, n > 1 org/name-partN
    repos: dict[str, int] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    # what the shards are: MARIN, or a Levanter cache pinned in place (`marin_data.levanter.pinned`)
    format: str = MARIN
    # where the shard files live when not beside the manifest (a pin kept apart from its data, written by
    # ``adopt --pin-to``): a URL or local path, no credentials; "": beside it, as every other corpus
    data: str = ""

    def to_json(self) -> bytes:
        """Canonical bytes: sorted keys, no timestamps, so equal corpora have equal manifest digests."""
        doc = {
            "schema_version": self.schema_version,
            "name": self.name,
            "version": self.version,
            "tokenizer": asdict(self.tokenizer),
            "subsets": {k: asdict(v) for k, v in sorted(self.subsets.items())},
            "files": {k: asdict(v) for k, v in sorted(self.files.items())},
            "repos": dict(sorted(self.repos.items())),
        }
        if self.format != MARIN:  # written only when not the default: existing manifests keep their bytes
            doc["format"] = self.format
        if self.data:  # likewise: only a pin kept apart from its data names where that is
            doc["data"] = self.data
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, path: str = MANIFEST) -> Manifest:
        """Parse and validate manifest bytes; raise `InvalidManifestError` naming ``path`` on any defect."""
        try:
            doc = loads(data)
            if not isinstance(doc, dict):
                raise TypeError("top level is not an object")
            version = doc.get("schema_version")
            if version != SCHEMA_VERSION:
                raise InvalidManifestError(
                    f"unsupported schema_version {version!r} (this marin reads {SCHEMA_VERSION})",
                    path=path, expected=SCHEMA_VERSION, actual=version,
                )
            manifest = cls(
                name=str(doc["name"]),
                version=str(doc["version"]),
                tokenizer=TokenizerInfo(**doc["tokenizer"]),
                subsets={str(k): SubsetInfo(**v) for k, v in doc["subsets"].items()},
                files={safe_relpath(k, where=path): FileRecord(**v) for k, v in doc["files"].items()},
                repos={str(k): int(v) for k, v in doc.get("repos", {}).items()},
                format=doc.get("format", MARIN),
                data=doc.get("data", ""),
            )
            if not isinstance(manifest.data, str) or _CREDENTIALS.search(manifest.data):
                raise InvalidManifestError(f"data {shown(str(manifest.data))} is no URL without credentials",
                                           path=path, actual=str(manifest.data))
            if not isinstance(manifest.format, str) or not _FORMAT_NAME.fullmatch(manifest.format):
                raise InvalidManifestError(f"format {shown(str(manifest.format))} is no format name", path=path,
                                           actual=manifest.format)
        except InvalidManifestError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise InvalidManifestError(f"malformed manifest: {e!r}", path=path) from e
        for name in manifest.subsets:
            check_subset_name(name, path)
        for fname, rec in manifest.files.items():
            if is_reserved(fname):  # a download would write it where a writer's own file goes
                raise InvalidManifestError(f"files[{shown(fname)}] is a reserved name", path=path, actual=fname)
            check_digest(rec.sha256, f"{path} files[{fname}]")
        for name, part in manifest.repos.items():
            if name not in manifest.subsets or not 1 <= part <= len(manifest.subsets):  # each repo holds one
                raise InvalidManifestError(f"repos[{name!r}] = {part} names no subset or no repo", path=path)
        return manifest


@dataclass(frozen=True)
class Corpus:
    """A corpus on local disk: its root, parsed manifest, the manifest's own sha256, and the shard index."""

    root: Path
    manifest: Manifest
    manifest_sha256: str
    shards: tuple[ShardRecord, ...]

    def shards_of(self, subsets: Iterable[str]) -> list[ShardRecord]:
        wanted = set(subsets)
        return [s for s in self.shards if s.subset in wanted]


def summarize_subsets(shards: Iterable[ShardRecord], licenses: dict[str, str]) -> dict[str, SubsetInfo]:
    """Per-subset totals computed from the shard rows (the manifest never holds a typed-in number)."""
    totals: dict[str, list[int]] = {}
    for s in shards:  # every row's bytes count (they are all fetched); only shards count as shards
        t = totals.setdefault(s.subset, [0, 0, 0, 0])
        t[0] += s.docs
        t[1] += s.tokens
        t[2] += s.bytes
        t[3] += s.kind == SHARD
    return {
        name: SubsetInfo(docs=d, tokens=t, bytes=b, shards=n, license=licenses.get(name, "unknown"))
        for name, (d, t, b, n) in sorted(totals.items())
    }


def shards_fingerprint(shards: Iterable[ShardRecord], tokenizer_sha256: str) -> str:
    """A digest of exactly these shards' contents and the tokenizer.

    It covers the selected shards only, so a partial download and the full remote corpus give the same
    fingerprint for the same selection (docs/design.md, "The loader").
    """
    h = hashlib.sha256(tokenizer_sha256.encode())
    for s in sorted(shards, key=lambda s: s.path):
        h.update(f"\n{s.path}\t{s.sha256}\t{s.bytes}".encode())
    return h.hexdigest()


def load_corpus(root: str | os.PathLike, *, manifest_sha256: str | None = None) -> Corpus:
    """Open a local corpus: check the pinned manifest digest, parse it, and load the shard index.

    Args:
        root: the corpus directory.
        manifest_sha256: when given, the manifest's own sha256 must equal it (the root of trust).

    Raises:
        InvalidManifestError: missing or malformed manifest or index, unsafe paths, totals that disagree,
            or a shard index whose digest differs from the one the manifest names.
        ManifestHashMismatchError: the manifest differs from the pinned digest.
    """
    root = Path(root)
    try:  # a commit moving into place (`finish_commit`): its manifest, index and sums are the corpus's
        mpath, data = _read_first(root / COMMIT / MANIFEST, root / MANIFEST)
    except FileNotFoundError as e:
        raise InvalidManifestError("no manifest.json: not a marin corpus (or an unfinished one)",
                                   path=str(root / MANIFEST)) from e
    digest = hashlib.sha256(data).hexdigest()
    if manifest_sha256 is not None and digest != manifest_sha256.strip().lower():
        raise ManifestHashMismatchError(
            f"manifest sha256 is {digest}, but {manifest_sha256} was pinned: the mirror's copy differs",
            path=str(mpath), expected=manifest_sha256, actual=digest,
        )
    manifest = Manifest.from_json(data, str(mpath))
    index = manifest.files.get(SHARDS_INDEX)
    if index is None:
        raise InvalidManifestError(f"manifest does not list {SHARDS_INDEX}", path=str(mpath))
    try:
        ipath, index_bytes = _read_first(mpath.parent / SHARDS_INDEX, root / SHARDS_INDEX)
    except FileNotFoundError as e:
        raise InvalidManifestError(f"{SHARDS_INDEX} is missing", path=str(root / SHARDS_INDEX)) from e
    actual = hashlib.sha256(index_bytes).hexdigest(), len(index_bytes)
    if actual != (index.sha256, index.bytes):
        raise InvalidManifestError(
            f"{SHARDS_INDEX} does not match the manifest (sha256/size {actual[0][:12]}…/{actual[1]} "
            f"!= {index.sha256[:12]}…/{index.bytes})",
            path=str(ipath), expected=(index.sha256, index.bytes), actual=actual,
        )
    shards = read_shard_index(ipath, metadata=manifest.files)
    _check_totals(manifest, shards, str(mpath))
    return Corpus(root=root, manifest=manifest, manifest_sha256=digest, shards=tuple(shards))


def _check_totals(manifest: Manifest, shards: list[ShardRecord], where: str) -> None:
    computed = summarize_subsets(shards, {k: v.license for k, v in manifest.subsets.items()})
    if computed != manifest.subsets:
        bad = sorted(set(computed) ^ set(manifest.subsets)) or sorted(
            k for k in computed if computed[k] != manifest.subsets.get(k)
        )
        raise InvalidManifestError(f"subset totals disagree with {SHARDS_INDEX} for: {', '.join(bad)}",
                                   path=where)


def _read_first(*paths: Path) -> tuple[Path, bytes]:
    """The first of ``paths`` that exists, and its bytes, read at once (a journal moving into place may take
    a file between a check and a read); FileNotFoundError when none does."""
    for path in paths:
        try:
            return path, path.read_bytes()
        except FileNotFoundError:
            continue
    raise FileNotFoundError(paths[-1])
