"""How to get and check the corpus: mirrors, ``marin-data download`` and verification commands.

Every command is built from the recorded mirrors, the subset names and the manifest's sha256, so a reader
can paste it. The mirrors are those publish recorded in ``mirrors.json`` (`marin_data.corpus.mirrors`): S3
stores as ``{"url": "s3://bucket/prefix", "endpoint_url": ...}``, Hugging Face repos as
``{"url": "hf://datasets/org/name", "endpoint": ...}``, each with the ``subsets`` it holds (none listed:
every subset). A recorded endpoint becomes the download flag that store takes (`ENDPOINT_FLAGS`). When
no mirror is recorded the commands show a placeholder source, and the documents say so.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SOURCE_PLACEHOLDER", "ENDPOINT_FLAGS", "Mirror", "mirrors", "mirrors_of", "download_command",
           "verify_commands"]

SOURCE_PLACEHOLDER = "SOURCE"  # shown when no mirror is recorded: an s3:// or hf:// URL, or a local copy
ENDPOINT_FLAGS = {"endpoint_url": "--endpoint-url", "endpoint": "--endpoint"}  # mirror key -> download flag


@dataclass(frozen=True)
class Mirror:
    url: str
    endpoint: tuple[str, str] | None  # (download flag, URL) of a non-default endpoint
    subsets: tuple[str, ...] | None  # None: every subset

    def holds(self, subset: str) -> bool:
        return self.subsets is None or subset in self.subsets


def mirrors(records: Sequence[dict]) -> list[Mirror]:
    """The recorded mirrors, in the order recorded."""
    out = []
    for entry in records:
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
            continue  # an unknown mirror kind: nothing trustworthy to show
        endpoint = next(((flag, str(entry[key])) for key, flag in ENDPOINT_FLAGS.items() if entry.get(key)), None)
        subsets = entry.get("subsets")
        out.append(Mirror(url=entry["url"], endpoint=endpoint, subsets=tuple(sorted(subsets)) if subsets else None))
    return out


def mirrors_of(records: Sequence[dict], subset: str) -> list[Mirror]:
    return [m for m in mirrors(records) if m.holds(subset)]


def download_command(mirror: Mirror | None, subset: str, dest: str, manifest_sha256: str) -> str:
    """The exact ``marin-data download`` line for one subset from one mirror (or the placeholder)."""
    args = ["marin-data", "download", mirror.url if mirror else SOURCE_PLACEHOLDER]
    if mirror and mirror.endpoint:
        args += list(mirror.endpoint)
    args += ["--subset", subset, "--to", dest, "--manifest-sha256", manifest_sha256]
    return " ".join(shlex.quote(a) if a != SOURCE_PLACEHOLDER else a for a in args)


def verify_commands(dest: str, manifest_sha256: str) -> list[str]:
    """Check a local copy against the pinned manifest digest, with marin-data and with coreutils alone."""
    d = shlex.quote(dest)
    return [
        f"marin-data verify {d} --manifest-sha256 {manifest_sha256}",
        f"(cd {d} && sha256sum manifest.json)   # must print {manifest_sha256}",
        f"(cd {d} && sha256sum -c SHA256SUMS)   # the whole corpus: every shard and metadata file",
        f"(cd {d} && sha256sum -c --ignore-missing SHA256SUMS)   # after downloading some subsets",
    ]
