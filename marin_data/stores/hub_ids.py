"""How the Hugging Face Hub names file contents: git blob SHA-1, Git LFS pointers, and which files are LFS.

Shared by the mirror (`marin_data.mirror`), HF publishing and the HF store, so that a file has the same id
wherever it is computed (docs/design.md, "The chain of trust": the LFS oid is the sha256 of the content, regular files are identified
by their git blob SHA-1).

- A *regular* file's id is ``sha1(b"blob <size>\\0" + content)``: what ``git hash-object`` prints, and the
  ``ETag`` / tree ``oid`` the Hub reports for it.
- An *LFS* file is stored in git as a small pointer text; the tree ``oid`` is the blob SHA-1 of that
  pointer, while ``lfs.oid`` (and the ``X-Linked-Etag`` header) is the sha256 of the content itself.

Which files are LFS is decided by `is_lfs` from the path, the size and the first bytes, the same inputs
the Hub's ``preupload`` endpoint gets, so a file classified when uploaded is classified alike when served.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from marin_data.corpus.commit import MAX_FILES_PER_FOLDER, MAX_FILES_PER_REPO  # the Hub's limits, re-exported

__all__ = [
    "LFS_SAMPLE_BYTES",
    "REGULAR_MAX_BYTES",
    "MAX_FILES_PER_FOLDER",
    "MAX_FILES_PER_REPO",
    "git_blob_sha1",
    "git_blob_sha1_file",
    "lfs_pointer",
    "is_lfs",
    "HfUrl",
    "parse_hf_url",
]

LFS_SAMPLE_BYTES = 512  # what `huggingface_hub` sends to `preupload` as a file's sample
REGULAR_MAX_BYTES = 10 << 20  # the Hub stores text files above 10 MiB in LFS too

# Binary formats that never belong in a git blob, whatever their size (the Hub's default .gitattributes).
_LFS_SUFFIXES = frozenset(
    ".7z .arrow .avro .bin .bz2 .ckpt .flac .gif .gz .h5 .jpeg .jpg .lz4 .mp3 .mp4 .msgpack .npy .npz .onnx "
    ".orc .parquet .pdf .pickle .pkl .png .pt .pth .safetensors .tar .tfrecord .tgz .wav .webp .xz .zip .zst "
    ".zstd".split()
)


def git_blob_sha1(data: bytes) -> str:
    """The git blob id of ``data`` (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git_blob_sha1_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The git blob id of a file, read in bounded chunks."""
    size = os.path.getsize(path)
    h = hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The Git LFS pointer text stored in git for a file with this content hash and size."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def is_lfs(path: str, size: int, sample: bytes) -> bool:
    """Whether a file is stored in LFS: a binary format by suffix, large, or binary content (a NUL byte).

    Args:
        path: the file's path in the repo.
        size: its size in bytes; empty files are always regular (the Hub cannot store them in LFS).
        sample: its first bytes (the first `LFS_SAMPLE_BYTES` are looked at, as the Hub does).
    """
    if size == 0:
        return False
    return (
        PurePosixPath(path).suffix.lower() in _LFS_SUFFIXES
        or size > REGULAR_MAX_BYTES
        or b"\0" in sample[:LFS_SAMPLE_BYTES]
    )


_HF_URL = re.compile(r"^hf://datasets/([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@([^/]+))?/?$")


@dataclass(frozen=True)
class HfUrl:
    """A dataset repo named by ``hf://datasets/org/name[@revision]`` (the form ``HfFileSystem`` reads)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"hf://datasets/{self.repo_id}" + (f"@{self.revision}" if self.revision else "")


def parse_hf_url(url: str) -> HfUrl:
    """Parse ``hf://datasets/org/name[@revision]``; raise ValueError naming the expected form otherwise."""
    m = _HF_URL.match(url)
    if not m or ".." in m.group(1):
        raise ValueError(f"not a Hugging Face dataset URL: {url!r} (expected hf://datasets/org/name[@revision])")
    return HfUrl(m.group(1), m.group(2))
