"""A corpus under an S3 prefix (AWS or any S3-compatible store), through botocore — imported only here.

Content hashes (docs/design.md, "The chain of trust"): every file is stored with ONE
``put_object`` carrying ``ChecksumAlgorithm="SHA256"`` and ``ChecksumSHA256``, so S3 keeps a full-object
SHA-256 that ``HeadObject(ChecksumMode="ENABLED")`` returns without reading data. A multipart upload would
only ever get a composite ``<digest>-<parts>`` value, so `head` refuses those. The hex digest also goes into
user metadata ``sha256``, the fallback for stores that drop or reject checksum headers (``s3_compat``).
An ETag is never marin's content hash, but a plain one (32 hex digits, no ``-``: a single-part upload) is
the object's MD5, which an unpinned download checks (`marin_data.stores.checksums`); so are the
``ChecksumSHA256`` / ``ChecksumCRC32C`` / ``ChecksumCRC32`` HeadObject returns (asked only for objects whose
listing names such an algorithm: `vouched`) and, through GCS's S3-compatible endpoint (told by its
``x-goog-*`` headers), ``x-goog-hash``'s crc32c and md5, never its ETags (a composite object's is no MD5).

botocore's own retries are off: `marin_data.retry` is the one retry loop, and it honours ``Retry-After``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from marin_data.fileio.untrusted_paths import safe_relpath
from marin_data.errors import MarinDataError, NoSuchBucketError, RemoteError, RetryableRemoteError, TooSlowError, shown
from marin_data.retry import parse_retry_after, status_error
from marin_data.stores.base import READ_CHUNK, ObjectInfo, ReadStream, Store, body_span, range_header
from marin_data.stores.checksums import etag_md5, from_base64, parse_goog_hash
from marin_data.stores.limits import ListingBudget, RequestClock

__all__ = ["S3Store", "SINGLE_PUT_LIMIT", "parse_s3_url"]

SINGLE_PUT_LIMIT = 5 << 30  # S3 refuses a single PUT over 5 GiB
IDLE_TIMEOUT = 60  # seconds without a byte before a read gives up
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# The full-object checksums HeadObject(ChecksumMode="ENABLED") may return that a download can check.
_HEAD_CHECKSUMS = {"sha256": "ChecksumSHA256", "crc32c": "ChecksumCRC32C", "crc32": "ChecksumCRC32"}


@functools.cache
def _data_loader(data_path: str | None):
    """botocore's loader of service models and endpoint rules, one per process (per ``data_path``): each new
    session would otherwise read and parse S3's again, about 0.2 s of CPU a store, two thirds of a small
    publish's time. A loader only caches what it read; botocore shares one among a session's clients."""
    from botocore.loaders import create_loader

    return create_loader(data_path)


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ``("bucket", "some/prefix")``; `RemoteError` if malformed."""
    parts = urlsplit(url)
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if parts.scheme != "s3" or not _BUCKET.match(bucket) or parts.query or parts.fragment:
        raise RemoteError("not an S3 URL: expected s3://bucket/prefix with a valid bucket name", path=url)
    if prefix:
        safe_relpath(prefix, where=url)
    return bucket, prefix


class S3Store(Store):
    """Files under ``s3://bucket/prefix``.

    Args:
        bucket, prefix: where the corpus root is.
        endpoint_url: an S3-compatible endpoint (MinIO, R2, a local moto server); None for AWS.
        profile: an AWS named profile; None uses the default credential chain.
        anonymous: send unsigned requests (public buckets, no credentials needed).
        requester_pays: send ``RequestPayer="requester"`` (the caller's account pays the transfer).
        s3_compat: for stores that reject the newer checksum headers: botocore computes and validates
            checksums only where an operation requires them, ``put`` sends no checksum headers, and the
            SHA-256 lives in the ``sha256`` user metadata alone.
        max_connections: size of the HTTP connection pool; at least the number of worker threads.
    """

    max_put_bytes = SINGLE_PUT_LIMIT

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 profile: str | None = None, anonymous: bool = False, requester_pays: bool = False,
                 s3_compat: bool = False, max_connections: int = 16):
        import botocore
        import botocore.session
        from botocore.config import Config

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.endpoint_url = endpoint_url
        self.s3_compat = s3_compat
        self._gcs = (urlsplit(endpoint_url or "").hostname or "").endswith("storage.googleapis.com")
        self._payer = {"RequestPayer": "requester"} if requester_pays else {}
        config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},  # marin_data.retry retries, once
            max_pool_connections=max(1, max_connections),
            connect_timeout=10,
            read_timeout=IDLE_TIMEOUT,
            signature_version=botocore.UNSIGNED if anonymous else None,
            # We hash every byte ourselves; botocore validating too would hash downloads twice.
            response_checksum_validation="when_required",
            request_checksum_calculation="when_required" if s3_compat else "when_supported",
            s3={"addressing_style": "path"} if endpoint_url else None,
        )
        with _mapped_errors(self.url):
            # botocore's session, not boto3's: boto3 adds only resources and s3transfer (~50 ms of imports
            # per process) on top of the same client.
            session = botocore.session.Session(profile=profile)
            session.register_component("data_loader", _data_loader(session.get_config_variable("data_path")))
            region = session.get_config_variable("region") or os.environ.get("AWS_REGION") or "us-east-1"
            self.client = session.create_client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
        self.client.meta.events.register("before-call.s3.HeadBucket", _no_region_probe)

    @classmethod
    def from_url(cls, url: str, **options) -> S3Store:
        bucket, prefix = parse_s3_url(url)
        return cls(bucket, prefix, **options)

    def _key(self, path: str) -> str:
        path = safe_relpath(path, where=self.url)
        return f"{self.prefix}/{path}" if self.prefix else path

    def mirror_record(self) -> dict:
        return {"url": self.url, **({"endpoint_url": self.endpoint_url} if self.endpoint_url else {})}

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object under the prefix, over ListObjectsV2's continuation pages; the listing as a whole is
        bounded (`ListingBudget`: keys and their bytes), though botocore parses each page whole."""
        root = f"{self.prefix}/" if self.prefix else ""
        budget = ListingBudget(self.describe(prefix))
        with _mapped_errors(self.describe(prefix), self.endpoint_url):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=root + (prefix.strip("/") + "/" if prefix else ""), **self._payer)
            for page in pages:
                self._gcs = self._gcs or _answered_by_gcs(page)
                contents = page.get("Contents", [])
                budget.take(entries=len(contents), nbytes=sum(len(o.get("Key", "")) for o in contents), page=True)
                for obj in contents:
                    if not obj.get("Key", "").startswith(root):
                        raise RemoteError(f"the listing answered {shown(obj.get('Key'))}, outside {shown(root)}",
                                          path=self.describe(prefix))
                    size = obj.get("Size")
                    if type(size) is not int or size < 0:  # no size, or one no file has: nothing to fetch against
                        raise RemoteError(f"malformed listing entry: {shown(obj['Key'])} with size {shown(size)}",
                                          path=self.describe(prefix))
                    yield self._listed(obj["Key"][len(root):], size, obj)

    def _listed(self, path: str, size: int, obj: dict) -> ObjectInfo:
        """A listing entry: its ETag's MD5 where it is one, and the checksums it names but does not give
        (``ChecksumAlgorithm``). Through GCS, whose listing names none and whose ETag is no MD5 for a composite
        object (nor said to be one), the ETag is not taken: ``x-goog-hash``'s crc32c and md5 are asked."""
        if self._gcs:
            return ObjectInfo(path, size, unfetched=("crc32c", "md5"))
        md5 = etag_md5(obj.get("ETag"))
        named = [str(a).lower() for a in obj.get("ChecksumAlgorithm") or () if str(a).lower() in _HEAD_CHECKSUMS]
        return ObjectInfo(path, size, checksums=(("md5", md5),) if md5 else (), unfetched=tuple(named))

    def vouched(self, info: ObjectInfo) -> ObjectInfo:
        """``info`` with the checksums its listing named, from one HEAD (none when it named none)."""
        if not info.unfetched:
            return info
        head = self.head(info.path)
        if head is None or head.size != info.size:  # gone or replaced since the listing: its size is checked
            return info
        return head

    def head(self, path: str) -> ObjectInfo | None:
        with _mapped_errors(self.describe(path)):
            try:
                r = self.client.head_object(Bucket=self.bucket, Key=self._key(path), ChecksumMode="ENABLED",
                                            **self._payer)
            except self.client.exceptions.ClientError as e:
                if _status(e) == 404:
                    return None
                raise
        sha, source = _full_object_sha256(r.get("ChecksumSHA256"), r.get("ChecksumType")), "checksum"
        if sha is None:  # our metadata, as S3 returns it or as GCS does (``x-goog-meta-*``)
            headers = r.get("ResponseMetadata", {}).get("HTTPHeaders", {})
            meta = str((r.get("Metadata") or {}).get("sha256") or headers.get("x-goog-meta-sha256") or "").lower()
            sha, source = (meta, "metadata") if _HEX64.match(meta) else (None, None)
        size = r.get("ContentLength")
        if type(size) is not int or size < 0:
            raise RetryableRemoteError(f"HEAD answered without a usable Content-Length ({size!r})",
                                       path=self.describe(path))
        return ObjectInfo(path, size, sha, source, checksums=_head_checksums(r))

    def read(self, path: str, start: int = 0, end: int | None = None) -> ReadStream:
        where = self.describe(path)
        wanted = range_header(start, end)
        clock = RequestClock(where)
        with _mapped_errors(where, self.endpoint_url):
            r = self.client.get_object(Bucket=self.bucket, Key=self._key(path),
                                       **({"Range": wanted} if wanted else {}), **self._payer)
        body = r["Body"]
        begin, stop = body_span(r["ResponseMetadata"]["HTTPStatusCode"], r.get("ContentRange"), start, end, where,
                                body.close)

        def pieces() -> Iterator[bytes]:
            # One socket read at a time, each waiting at most what the clock has left: botocore's own reads
            # wait for a whole chunk, which a server sending a byte now and then never completes.
            raw = body._raw_stream  # urllib3's response under botocore's StreamingBody
            with _mapped_errors(where):
                while True:
                    conn = raw.connection  # None once the body is complete and the connection released
                    if conn is not None and conn.sock is not None:
                        conn.sock.settimeout(max(0.001, min(IDLE_TIMEOUT, clock.remaining())))
                    piece = raw.read1(READ_CHUNK)
                    if not piece:
                        return
                    yield piece

        return ReadStream(pieces(), start=begin, stop=stop, close=body.close, clock=clock)

    def put(self, path: str, src: Path, *, sha256: str, size: int) -> None:
        checksum = {} if self.s3_compat else {
            "ChecksumAlgorithm": "SHA256",
            "ChecksumSHA256": base64.b64encode(bytes.fromhex(sha256)).decode(),
        }
        with _mapped_errors(self.describe(path), self.endpoint_url), open(src, "rb") as body:
            self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=body, ContentLength=size,
                                   Metadata={"sha256": sha256}, **checksum, **self._payer)


def _no_region_probe(**_) -> tuple:
    """The answer to botocore's HeadBucket probe, which it sends to find a bucket's region when a redirect
    names none. The probe's own redirect would probe again, without end (a redirect loop recursing into a
    RecursionError); marin never asks HeadBucket itself, and AWS names the region in its redirects. So the
    probe finds no region, and the redirect is reported as it came (`RemoteError`)."""
    from botocore.awsrequest import AWSResponse

    return AWSResponse(None, 400, {}, None), {"Error": {"Code": "NoRegionProbe", "Message": "not probed"},
                                              "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}}}


def _full_object_sha256(value: str | None, checksum_type: str | None) -> str | None:
    """Hex SHA-256 from a ``ChecksumSHA256`` header, or None if absent or a multipart composite."""
    if not value or "-" in value or checksum_type == "COMPOSITE":
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def _head_checksums(r: dict) -> tuple[tuple[str, str], ...]:
    """The digests other than the SHA-256 a HeadObject answer vouches for: its full-object checksums, its ETag
    as an MD5 (not for SSE-KMS or SSE-C objects, whose ETag is no MD5) and GCS's ``x-goog-hash`` (from GCS,
    the only MD5 taken: a composite object's ETag is none, and its hash header names a crc32c alone)."""
    found = {a: from_base64(a, r.get(field)) for a, field in _HEAD_CHECKSUMS.items() if a != "sha256"}
    if r.get("ChecksumType") == "COMPOSITE":
        found = {}
    encrypted = r.get("ServerSideEncryption") == "aws:kms" or r.get("SSECustomerAlgorithm")
    gcs = _answered_by_gcs(r)
    found["md5"] = None if encrypted or gcs else etag_md5(r.get("ETag"))
    headers = r.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    found.update(parse_goog_hash(headers.get("x-goog-hash")))
    return tuple((a, v) for a, v in sorted(found.items()) if v)


def _answered_by_gcs(r: dict) -> bool:
    """Whether a parsed answer came from Google Cloud Storage's S3-compatible (XML) API: every answer it
    sends carries ``x-goog-*`` (or ``x-guploader-uploadid``) headers, whatever endpoint name reached it."""
    headers = r.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return any(k.lower().startswith(("x-goog-", "x-guploader-")) for k in headers)


def _status(e: Exception) -> int | None:
    return getattr(e, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")


@contextlib.contextmanager
def _mapped_errors(where: str, endpoint_url: str | None = None) -> Iterator[None]:
    """Turn boto/urllib3/socket failures into `RemoteError` / `RetryableRemoteError` naming ``where`` (an
    ``s3://`` URL; ``endpoint_url``, where known, goes into `NoSuchBucketError`'s hint)."""
    import http.client

    import botocore.exceptions as bx
    import urllib3.exceptions as ux
    from botocore.parsers import ResponseParserError  # an answer that is not the XML or JSON S3 sends

    try:
        yield
    except MarinDataError:
        raise
    except bx.ClientError as e:
        err = e.response.get("Error", {})
        headers = e.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        if err.get("Code") == "NoSuchBucket":
            raise NoSuchBucketError(f"NoSuchBucket: {err.get('Message', '') or e}", path=where,
                                    bucket=urlsplit(where).netloc, endpoint_url=endpoint_url) from e
        message = f"{err.get('Code', 'error')}: {err.get('Message', '') or e}"
        if 300 <= (_status(e) or 0) < 400:
            message += f" (a redirect to {str(headers.get('location'))[:200]!r}: an S3 endpoint's are not followed)"
        raise status_error(message, status=_status(e), path=where,
                           retry_after=parse_retry_after(headers.get("retry-after"))) from e
    except (bx.NoCredentialsError, bx.PartialCredentialsError) as e:
        raise RemoteError(f"{e}: configure AWS credentials or a --profile, or pass --anonymous for a public "
                          "bucket", path=where) from e
    except (bx.HTTPClientError, bx.ConnectionError, bx.IncompleteReadError, bx.ResponseStreamingError,
            bx.ChecksumError, ux.HTTPError, OSError, ResponseParserError, http.client.HTTPException) as e:
        timeout = isinstance(e, (bx.ReadTimeoutError, bx.ConnectTimeoutError, ux.TimeoutError, TimeoutError))
        raise (TooSlowError if timeout else RetryableRemoteError)(f"{type(e).__name__}: {e}", path=where) from e
    except bx.BotoCoreError as e:  # bad profile, bad parameter, bad endpoint: retrying will not help
        raise RemoteError(f"{type(e).__name__}: {e}", path=where) from e
    except ValueError as e:  # botocore's parser met a field it cannot read (a <Size> that is no number)
        raise RemoteError(f"malformed answer: {shown(str(e))}", path=where) from e
