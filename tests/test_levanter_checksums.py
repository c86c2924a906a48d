"""An unpinned Levanter download is checked against every digest its store vouches for — S3's plain-MD5
ETags and ``ChecksumSHA256`` / ``ChecksumCRC32C`` (GCS's ``x-goog-hash`` parsed the same way) — and what
each file was checked against is recorded beside the copy: a byte flipped in flight fails the file by
name, a byte flipped later fails ``verify``, ``adopt`` refuses it and states per file whether its digest
was checked against the source or first seen locally, and the summary names the files checked by size
only."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import crc32c
import pytest
from levanter_env import make_store
from s3_env import FAST, bucket_url, moto, proxy, run_cli, s3_client  # noqa: F401 - fixtures
from shard_env import tree_bytes

from marin_data.errors import ShardChecksumError
from marin_data.layout import CHECKED, VOUCHED
from marin_data.levanter import adopt, detect
from marin_data.levanter.download import download_cache
from marin_data.stores.checksums import parse_goog_hash
from marin_data.stores.s3 import _head_checksums

CELL = "cluster=1/quality=4"
CHUNK = f"{CELL}/input_ids/data/c/0"


@pytest.fixture
def store(tmp_path) -> Path:
    make_store(tmp_path / "store", {CELL: 200, "cluster=2/quality=4": 120})
    return tmp_path / "store"


def _plain_client(moto: str):  # noqa: F811
    """A client that sends no checksum of its own: an object gets only its ETag (its MD5)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=moto, region_name="us-east-1",
                        config=Config(request_checksum_calculation="when_required"))


def upload(root: Path, moto: str, url: str, how: str) -> None:  # noqa: F811
    """Every file of ``root`` to ``url``: ``plain`` PUTs (ETag only), or with a SHA256 or CRC32C checksum."""
    bucket, prefix = url[len("s3://"):].split("/", 1)
    client = _plain_client(moto)
    for rel, data in tree_bytes(root).items():
        extra = {}
        if how == "sha256":
            extra = {"ChecksumAlgorithm": "SHA256", "ChecksumSHA256": base64.b64encode(hashlib.sha256(data).digest())
                     .decode()}
        elif how == "crc32c":  # botocore computes CRC32C only with awscrt: the header goes in by hand
            value = base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()

            def add(request, value=value, **_):
                request.headers["x-amz-checksum-crc32c"] = value
                request.headers["x-amz-sdk-checksum-algorithm"] = "CRC32C"

            client.meta.events.register_first("before-sign.s3.PutObject", add)
        client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=data, **extra)
        if how == "crc32c":
            client.meta.events.unregister("before-sign.s3.PutObject", add)


@pytest.mark.parametrize("how, algorithm", [("plain", "md5"), ("sha256", "sha256"), ("crc32c", "md5")])
def test_every_file_is_checked_against_the_stores_digest_and_a_byte_flipped_in_flight_fails_it_by_name(
        how, algorithm, store, moto, bucket_url, proxy, tmp_path):  # noqa: F811
    upload(store, moto, bucket_url, how)
    found = detect(bucket_url, endpoint_url=proxy.endpoint)
    done = download_cache(found, subsets=[CELL], dest=tmp_path / "d", policy=FAST, progress=False,
                          endpoint_url=proxy.endpoint)
    assert done.ok and done.size_only == ()
    record = json.loads((tmp_path / "d" / CHECKED).read_text())
    assert record["source"] == bucket_url
    entry = record["files"][CHUNK]
    assert entry["checked"] == algorithm and set(entry["vouched"]) == {"md5", *([how] if how != "plain" else [])}
    assert entry["sha256"] == hashlib.sha256((store / CHUNK).read_bytes()).hexdigest()

    from faultproxy import Fault

    proxy.add(Fault("corrupt", match="cluster%3D2/quality%3D4/input_ids/data/c/0", times=100))
    bad = download_cache(found, subsets=["cluster=2/quality=4"], dest=tmp_path / "d", policy=FAST, progress=False,
                         endpoint_url=proxy.endpoint)
    assert [p for p, _ in bad.transfer.failed] == ["cluster=2/quality=4/input_ids/data/c/0"]
    assert f"{algorithm} " in bad.transfer.failed[0][1] and "vouches for" in bad.transfer.failed[0][1] \
        or algorithm == "sha256" and "differs from the listed" in bad.transfer.failed[0][1]
    assert not (tmp_path / "d" / "cluster=2/quality=4/input_ids/data/c/0").exists()
    assert CHUNK in json.loads((tmp_path / "d" / CHECKED).read_text())["files"]  # the earlier cell's entries kept


def test_a_byte_flipped_in_the_copy_fails_verify_and_adopt_which_states_what_was_checked(
        store, moto, bucket_url, tmp_path):  # noqa: F811
    upload(store, moto, bucket_url, "plain")
    dest = tmp_path / "d"
    done = run_cli("download", bucket_url, "--endpoint-url", moto, "--subset", CELL, "--to", str(dest))
    assert done.returncode == 0, done.stderr
    assert "by md5" in done.stdout and "0 by size only" in done.stdout
    assert run_cli("verify", str(dest)).returncode == 0

    clean = (dest / CHUNK).read_bytes()
    (dest / CHUNK).write_bytes(_token_changed(dest, clean, _tokenizer(tmp_path)))
    for deep in ([], ["--deep"]):
        bad = run_cli("verify", str(dest), *deep)
        assert bad.returncode == 1 and CHUNK in bad.stdout + bad.stderr, (deep, bad.stdout, bad.stderr)
    with pytest.raises(ShardChecksumError, match="changed since"):
        adopt(dest, tokenizer=_tokenizer(tmp_path), name="copy")
    assert not (dest / "manifest.json").exists()

    (dest / CHUNK).write_bytes(clean)
    pinned = run_cli("adopt", str(dest), "--tokenizer", _tokenizer(tmp_path), "--name", "copy")
    assert pinned.returncode == 0, pinned.stderr
    assert "checked against the source, " in pinned.stdout and "by md5" in pinned.stdout
    assert "0 first seen locally" in pinned.stdout
    vouched = json.loads((dest / VOUCHED).read_text())
    assert vouched["files"][CHUNK] == {"checked": "md5", "digest": hashlib.md5(clean).hexdigest()}
    assert VOUCHED in json.loads((dest / "manifest.json").read_text())["files"]
    assert run_cli("verify", str(dest)).returncode == 0


def test_a_source_that_vouches_for_nothing_is_named_file_by_file_and_its_digests_are_first_seen_locally(
        store, tmp_path):
    dest = tmp_path / "d"
    done = run_cli("download", str(store), "--subset", CELL, "--to", str(dest))
    assert done.returncode == 0, done.stderr
    assert "none by a digest" in done.stdout and f"size only: {CELL}/shard_ledger.json" in done.stdout
    record = json.loads((dest / CHECKED).read_text())["files"]
    assert {e["checked"] for e in record.values()} == {"size-only"}
    assert f"{len(record)} by size only" in done.stdout
    assert done.stdout.count("  size only: ") == min(len(record), 10)

    (dest / CHUNK).write_bytes(b"\0" + (dest / CHUNK).read_bytes()[1:])  # a later flip is found all the same
    assert run_cli("verify", str(dest)).returncode == 1

    built = run_cli("adopt", str(store), "--tokenizer", _tokenizer(tmp_path), "--name", "built")
    assert built.returncode == 0, built.stderr
    assert "0 checked against the source" in built.stdout and "first seen locally: " in built.stdout
    assert not (store / VOUCHED).exists()  # never downloaded: the pin is as it always was


def test_gcs_x_goog_hash_and_s3_head_answers_become_hex_digests():
    md5 = hashlib.md5(b"x").digest()
    crc = crc32c.crc32c(b"x").to_bytes(4, "big")
    header = f"crc32c={base64.b64encode(crc).decode()}, md5={base64.b64encode(md5).decode()}, sha1=zz"
    assert parse_goog_hash(header) == {"crc32c": crc.hex(), "md5": md5.hex()}
    assert parse_goog_hash("crc32c=not base64!") == {} and parse_goog_hash(None) == {}
    gcs = {"ETag": '"composite-etag"', "ResponseMetadata": {"HTTPHeaders": {"x-goog-hash": header}}}
    assert dict(_head_checksums(gcs)) == {"crc32c": crc.hex(), "md5": md5.hex()}
    kms = {"ETag": f'"{md5.hex()}"', "ServerSideEncryption": "aws:kms"}
    assert _head_checksums(kms) == ()  # an SSE-KMS object's ETag is no MD5
    multipart = {"ETag": f'"{md5.hex()}-3"', "ChecksumCRC32C": "AAAAAA==-3"}
    assert _head_checksums(multipart) == ()


def _token_changed(dest: Path, data: bytes, tokenizer: str) -> bytes:
    """``data`` (the chunk file CHUNK) with one bit flipped inside its first stored frame such that it still
    decodes, to another token id inside the vocabulary: what a reader would take for the file. The chunk
    file's crc32c'd index does not cover it, so only a digest can tell."""
    import numpy as np

    from marin_data.levanter.cache import open_cache
    from marin_data.levanter.chunkfile import decode_inner, read_index, stored_frames
    from marin_data.raw.tokenizer import load_tokenizer
    from marin_data.stores.local import LocalStore

    meta = open_cache(LocalStore(dest), CELL).parts[0].data
    vocab = load_tokenizer(tokenizer).info.vocab_size
    _, start, n = stored_frames(read_index(data[-meta.index_bytes:], len(data), meta, CHUNK))[0]
    ref, out = np.empty(meta.inner, meta.dtype), np.empty(meta.inner, meta.dtype)
    decode_inner(memoryview(data[start:start + n]), meta, CHUNK, out=ref)
    for k in range(n - 1, 16, -1):
        frame = bytearray(data[start:start + n])
        frame[k] ^= 0x01
        try:
            decode_inner(memoryview(bytes(frame)), meta, CHUNK, out=out)
        except Exception:
            continue
        if (out != ref).any() and 0 <= out.min() and out.max() < vocab:
            return data[:start] + bytes(frame) + data[start + n:]
    raise AssertionError("no bit flips to another valid token")


def _tokenizer(tmp_path: Path) -> str:
    from shard_env import train_tiny

    path = tmp_path / "tokenizer.json"
    return str(path if path.exists() else train_tiny(path))
