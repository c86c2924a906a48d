"""The content digests a store vouches for, in one form, and the hashing that checks them.

A store states a file's digest its own way: the Hub's tree listing an LFS file's hex SHA-256, S3 a
base64 ``ChecksumSHA256`` / ``ChecksumCRC32C`` / ``ChecksumCRC32`` (HeadObject with ``ChecksumMode``)
and an ETag that is the object's MD5 when it was uploaded in one part (no ``-``), GCS (through its S3
endpoint) an ``x-goog-hash: crc32c=<b64>,md5=<b64>`` header. Each becomes ``algorithm -> lowercase hex``
here (`from_base64`, `etag_md5`, `parse_goog_hash`), so a download checks them all the same way: a
`Hasher` computes, while the bytes stream, the SHA-256 (always: it is what a copy is recorded by) and
every other digest the store gave, and `mismatch` names the first that differs. CRC32C comes from the
``crc32c`` package (already the chunk files' checksum), CRC32 from ``zlib``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import os
import zlib
from collections.abc import Iterable, Mapping

import crc32c

from marin_data.fileio.atomic import read_pieces

__all__ = ["STRENGTH", "Hasher", "file_digests", "from_base64", "etag_md5", "parse_goog_hash", "strongest", "mismatch"]

# The digests a download can check, strongest first: what a record names as "checked".
STRENGTH = ("sha256", "md5", "crc32c", "crc32")
_SIZES = {"sha256": 32, "md5": 16, "crc32c": 4, "crc32": 4}
_HEX32 = re.compile(r"[0-9a-f]{32}")


def from_base64(algorithm: str, value: object) -> str | None:
    """The hex digest of a base64 header value of ``algorithm``; None when absent, a multipart composite
    (``...-N``) or not a digest of that algorithm's size."""
    if not isinstance(value, str) or not value or "-" in value:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == _SIZES[algorithm] else None


def etag_md5(etag: object) -> str | None:
    """An S3 ETag as the object's MD5: only a plain 32-hex value (a single-part upload without SSE-KMS says
    so; a multipart one ends in ``-<parts>`` and is no content hash). None otherwise."""
    if not isinstance(etag, str):
        return None
    value = etag.strip().strip('"').lower()
    return value if _HEX32.fullmatch(value) else None


def parse_goog_hash(header: object) -> dict[str, str]:
    """GCS's ``x-goog-hash`` (``crc32c=AAAAAA==,md5=...``, possibly one header per value joined by commas)
    as ``{"crc32c": hex, "md5": hex}``; unknown or malformed entries are left out."""
    out: dict[str, str] = {}
    if not isinstance(header, str):
        return out
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        name = name.strip().lower()
        if name in ("crc32c", "md5"):
            digest = from_base64(name, value.strip())
            if digest is not None:
                out[name] = digest
    return out


def strongest(algorithms: Iterable[str]) -> str | None:
    """The strongest of ``algorithms`` (`STRENGTH` order); None for none."""
    have = set(algorithms)
    return next((a for a in STRENGTH if a in have), None)


class Hasher:
    """SHA-256 and every other algorithm of ``also`` over the same bytes, fed in order (``update``)."""

    def __init__(self, also: Iterable[str] = ()):
        also = set(also)
        self.sha256 = hashlib.sha256()
        self._md5 = hashlib.md5(usedforsecurity=False) if "md5" in also else None
        self._crc32c = 0 if "crc32c" in also else None
        self._crc32 = 0 if "crc32" in also else None

    def update(self, data) -> None:
        self.sha256.update(data)
        if self._md5 is not None:
            self._md5.update(data)
        if self._crc32c is not None:
            self._crc32c = crc32c.crc32c(data, self._crc32c)
        if self._crc32 is not None:
            self._crc32 = zlib.crc32(data, self._crc32)

    def hexdigests(self) -> dict[str, str]:
        """``algorithm -> hex`` of everything hashed so far."""
        out = {"sha256": self.sha256.hexdigest()}
        if self._md5 is not None:
            out["md5"] = self._md5.hexdigest()
        if self._crc32c is not None:
            out["crc32c"] = f"{self._crc32c:08x}"
        if self._crc32 is not None:
            out["crc32"] = f"{self._crc32:08x}"
        return out


def mismatch(expected: Mapping[str, str], got: Mapping[str, str]) -> str | None:
    """The first algorithm (strongest first) whose expected digest differs from the computed one; None if
    every expected digest matches."""
    return next((a for a in STRENGTH if a in expected and got.get(a) != expected[a]), None)


def file_digests(path: str | os.PathLike | int, also: Iterable[str] = ()) -> tuple[dict[str, str], int]:
    """``(algorithm -> hex, size)`` of a file (a path, or an open descriptor, which it closes): its SHA-256
    and the digests of ``also``, in one bounded pass."""
    h, size = Hasher(also), 0
    for piece in read_pieces(path):
        h.update(piece)
        size += len(piece)
    return h.hexdigests(), size
