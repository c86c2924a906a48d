"""A loopback proxy in front of moto that answers the way Google Cloud Storage's S3-compatible (XML) API does,
for tests only (`GcsProxy`, a `faultproxy.FaultProxy`: its faults still apply).

What it changes, as GCS differs from S3:
- objects: no ``x-amz-checksum-*`` headers (GCS keeps no SHA-256), ``x-goog-hash: crc32c=…,md5=…`` over the
  whole object instead, user metadata as ``x-goog-meta-*`` (which botocore does not read as ``Metadata``),
  ``x-goog-stored-content-length`` and ``x-guploader-uploadid`` on every answer;
- composite objects (keys containing one of ``composite``): an ETag of 32 hex digits that is no MD5, a
  ``x-goog-hash`` naming a crc32c alone, ``x-goog-component-count``;
- ListObjectsV2: no ``ChecksumAlgorithm``, no ``Owner``, the ``encoding-type`` asked for ignored (keys come
  raw, no ``EncodingType`` echoed), pages of at most `PAGE_KEYS` keys whatever ``max-keys`` asked, and
  continuation tokens of its own form (opaque to the client, unwrapped here before moto sees them).
"""

from __future__ import annotations

import base64
import hashlib
import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import crc32c
from faultproxy import FaultProxy

__all__ = ["GcsProxy", "PAGE_KEYS"]

PAGE_KEYS = 3
_TOKEN = "gcs-"


class GcsProxy(FaultProxy):
    """``with GcsProxy(moto, composite=("c/1",)) as gcs: ... gcs.endpoint ...``"""

    def __init__(self, upstream: str, *, composite: tuple[str, ...] = ()):
        self.composite, self.upstream_url = composite, upstream
        super().__init__(upstream)

    def rewrite_request(self, method: str, target: str, headers: dict) -> tuple[str, dict]:
        parts = urlsplit(target)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if query.get("list-type") != "2":
            return target, headers
        query.pop("encoding-type", None)  # GCS ignores it: keys come back as they are
        query["max-keys"] = str(min(int(query.get("max-keys", 1000)), PAGE_KEYS))
        token = query.get("continuation-token")
        if token is not None:
            assert token.startswith(_TOKEN), f"a continuation token GCS never gave: {token!r}"
            query["continuation-token"] = base64.urlsafe_b64decode(token[len(_TOKEN):]).decode()
        return f"{parts.path}?{urlencode(query)}", headers

    def rewrite_response(self, method: str, target: str, status: int, headers: list[tuple[str, str]],
                         body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        parts = urlsplit(target)
        listing = "list-type=2" in parts.query
        out = [("x-guploader-uploadid", "gcs-proxy")]
        if listing and status == 200:
            return status, [*out, *_plain(headers)], self._listing(body)
        if status not in (200, 206) or parts.query or method not in ("GET", "HEAD"):
            return status, [*out, *headers], body
        whole = body if status == 200 and method == "GET" else self._whole(parts.path)
        composite = any(c in parts.path for c in self.composite)
        hashes = [f"crc32c={base64.b64encode(crc32c.crc32c(whole).to_bytes(4, 'big')).decode()}"]
        if not composite:
            hashes.append(f"md5={base64.b64encode(hashlib.md5(whole).digest()).decode()}")
        out += [("x-goog-hash", ",".join(hashes)), ("x-goog-stored-content-length", str(len(whole)))]
        for k, v in _plain(headers):
            if k.lower().startswith("x-amz-meta-"):
                out.append(("x-goog-meta-" + k[len("x-amz-meta-"):], v))
            elif k.lower() == "etag" and composite:
                out += [("ETag", f'"{_not_md5(whole)}"'), ("x-goog-component-count", "2")]
            else:
                out.append((k, v))
        return status, out, body

    def _whole(self, path: str) -> bytes:
        """The whole object at ``path``, from moto (a HEAD or a ranged GET states the whole object's hash),
        asked with a request of our own (the client's signature covers only its own request)."""
        import boto3

        bucket, _, key = unquote(path).lstrip("/").partition("/")
        client = boto3.client("s3", endpoint_url=self.upstream_url, region_name="us-east-1")
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def _listing(self, body: bytes) -> bytes:
        text = body.decode()
        text = re.sub(r"<(ChecksumAlgorithm|ChecksumType|Owner|EncodingType)>.*?</\1>", "", text, flags=re.S)
        for tag in ("NextContinuationToken", "ContinuationToken"):
            text = re.sub(rf"<{tag}>(.*?)</{tag}>", lambda m, t=tag: f"<{t}>{_wrap(m[1])}</{t}>", text)
        for key in re.findall(r"<Key>(.*?)</Key>", text):
            if any(c in key for c in self.composite):
                text = re.sub(rf"(<Key>{re.escape(key)}</Key>.*?<ETag>)(.*?)(</ETag>)",
                              lambda m: f"{m[1]}&quot;{'0' * 32}&quot;{m[3]}", text, count=1, flags=re.S)
        return text.encode()


def _plain(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` without what GCS never sends: S3's checksum headers."""
    return [(k, v) for k, v in headers if not k.lower().startswith("x-amz-checksum")]


def _wrap(token: str) -> str:
    return _TOKEN + base64.urlsafe_b64encode(token.encode()).decode()


def _not_md5(data: bytes) -> str:
    """32 hex digits that look like an MD5 and are not this object's."""
    return hashlib.md5(b"composite" + data).hexdigest()
