"""publish and verify_remote against a real S3 server (moto over HTTP on 127.0.0.1)."""

from __future__ import annotations

import base64
import hashlib

import pytest
from conftest import build_corpus
from s3_env import bucket_url, copy_corpus, fault_corpus, moto, proxy, run_cli, s3_client  # noqa: F401

from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.mirrors import read_mirrors
from marin_data.corpus.verify import ProblemKind
from marin_data.errors import ObjectTooLargeError, StaleDatasheetError, TransferFailedError
from marin_data.layout import MANIFEST, MIRRORS
from marin_data.stores.s3 import parse_s3_url
from marin_data.transfer.publish_s3 import publish
from marin_data.transfer.remote_verify import verify_remote
from marin_data.transfer.versions import content_path


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    """One shard over 8 MB (where boto3's upload_file would go multipart) and a small subset."""
    return build_corpus(tmp_path_factory.mktemp("big") / "corpus", {"big": [14000], "small/x": [300]},
                        doc_tokens=(400, 600), seed=1)


def _objects(moto, url):
    bucket, prefix = parse_s3_url(url)
    pages = s3_client(moto).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return {o["Key"][len(prefix) + 1:]: o["Size"] for page in pages for o in page.get("Contents", [])}


def test_big_shard_gets_a_full_object_sha256_checksum_and_metadata(moto, bucket_url, big_corpus, tmp_path):
    root = copy_corpus(big_corpus, tmp_path / "c")
    big = next(s for s in big_corpus.shards if s.subset == "big")
    assert big.bytes > 8 << 20
    report = publish(root, to=bucket_url, endpoint_url=moto)
    bucket, prefix = parse_s3_url(bucket_url)
    head = s3_client(moto).head_object(Bucket=bucket, Key=f"{prefix}/{big.path}", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(bytes.fromhex(big.sha256)).decode()
    assert "-" not in head["ChecksumSHA256"]
    assert head["Metadata"]["sha256"] == big.sha256
    assert head["ContentLength"] == big.bytes
    # Every file is up, byte-identical manifest included, and that manifest is the root of trust.
    expected = {s.path: s.bytes for s in big_corpus.shards} | {p: r.bytes for p, r in load_corpus(root).manifest.files.items()}
    expected[MANIFEST] = (root / MANIFEST).stat().st_size
    listed = {**{p: r.sha256 for p, r in load_corpus(root).manifest.files.items()}, MANIFEST: report.manifest_sha256}
    expected |= {content_path(sha, p): expected[p] for p, sha in listed.items()}  # each also by its content
    assert _objects(moto, bucket_url) == expected
    remote_manifest = s3_client(moto).get_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST}")["Body"].read()
    assert remote_manifest == (root / MANIFEST).read_bytes()
    assert hashlib.sha256(remote_manifest).hexdigest() == report.manifest_sha256
    assert report.manifest_sha256 == big_corpus.manifest_sha256  # publishing never changes the root of trust
    assert read_mirrors(root) == [{"url": bucket_url, "endpoint_url": moto, "subsets": ["big", "small/x"]}]
    assert MIRRORS not in expected  # kept local: the record of where it went is not part of the corpus


def test_republishing_skips_every_file_and_keeps_the_manifest_digest(moto, bucket_url, fault_corpus, tmp_path):
    root = copy_corpus(fault_corpus, tmp_path / "c")
    first = publish(root, to=bucket_url, endpoint_url=moto)
    again = publish(root, to=bucket_url, endpoint_url=moto)
    assert again.uploaded == () and again.bytes_uploaded == 0
    assert len(again.skipped) == len(first.uploaded)
    assert again.manifest_sha256 == first.manifest_sha256


def test_manifest_is_uploaded_after_every_file_it_names_with_one_put_per_file(moto, bucket_url, fault_corpus, proxy,
                                                                             tmp_path):
    root = copy_corpus(fault_corpus, tmp_path / "c")
    publish(root, to=bucket_url, endpoint_url=proxy.endpoint, workers=4)
    puts = [r.path for r in proxy.log if r.method == "PUT"]
    flip = next(i for i, p in enumerate(puts) if p.endswith("/" + MANIFEST) and "/by-sha256/" not in p)
    listed = load_corpus(root).manifest.files
    assert {p.rpartition("/corpus/")[2] for p in puts[:flip]} >= {s.path for s in fault_corpus.shards} | {
        content_path(r.sha256, p) for p, r in listed.items()}  # readers read the listed files by content
    assert {p.rpartition("/corpus/")[2] for p in puts[flip + 1:]} == set(listed)  # then their plain names
    assert len(puts) == len(set(puts)) == len(_objects(moto, bucket_url))  # no multipart: one PUT per file
    assert all(r.headers.get("x-amz-checksum-sha256") for r in proxy.log if r.method == "PUT")


def test_a_file_over_the_single_put_limit_is_refused_before_anything_is_sent(moto, bucket_url, fault_corpus,
                                                                             tmp_path):
    root = copy_corpus(fault_corpus, tmp_path / "c")
    before = (root / MANIFEST).read_bytes()
    largest = max(fault_corpus.shards, key=lambda s: s.bytes)
    with pytest.raises(ObjectTooLargeError, match="single upload") as e:
        publish(root, to=bucket_url, endpoint_url=moto, single_put_limit=largest.bytes - 1)
    assert e.value.path == largest.path
    assert _objects(moto, bucket_url) == {}
    assert (root / MANIFEST).read_bytes() == before


def test_a_local_file_that_no_longer_matches_is_not_published(moto, bucket_url, fault_corpus, tmp_path):
    root = copy_corpus(fault_corpus, tmp_path / "c")
    shard = root / fault_corpus.shards[0].path
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(TransferFailedError) as e:
        publish(root, to=bucket_url, endpoint_url=moto)
    assert [p for p, _ in e.value.failures] == [fault_corpus.shards[0].path]
    assert "no longer matches" in str(e.value)
    objects = _objects(moto, bucket_url)
    assert fault_corpus.shards[0].path not in objects and MANIFEST not in objects


def test_s3_compat_mode_sends_no_checksum_headers_and_relies_on_metadata(moto, bucket_url, fault_corpus, proxy,
                                                                        tmp_path):
    root = copy_corpus(fault_corpus, tmp_path / "c")
    publish(root, to=bucket_url, endpoint_url=proxy.endpoint, s3_compat=True)
    puts = [r for r in proxy.log if r.method == "PUT"]
    assert puts and not any(k.lower().startswith("x-amz-checksum") or k.lower() == "x-amz-sdk-checksum-algorithm"
                            for r in puts for k in r.headers)
    report = verify_remote(root, bucket_url, endpoint_url=moto)
    assert report.ok, report.problems


def test_verify_remote_reports_modified_missing_resized_and_unverifiable_objects(moto, bucket_url, fault_corpus,
                                                                                tmp_path):
    root = copy_corpus(fault_corpus, tmp_path / "c")
    publish(root, to=bucket_url, endpoint_url=moto)
    ok = verify_remote(root, bucket_url, endpoint_url=moto)
    listed = len(fault_corpus.manifest.files) + 1  # and the manifest; each also checked by its content name
    assert ok.ok and ok.files_checked == len(fault_corpus.shards) + 2 * listed
    bucket, prefix = parse_s3_url(bucket_url)
    s3 = s3_client(moto)
    a0, a1, b0, b1 = (s.path for s in fault_corpus.shards)
    same_size = (root / a0).read_bytes()[::-1]
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{a0}", Body=same_size, ChecksumAlgorithm="SHA256")
    s3.delete_object(Bucket=bucket, Key=f"{prefix}/{a1}")
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{b0}", Body=b"short")
    _multipart_without_checksums(moto, bucket, f"{prefix}/{b1}", (root / b1).read_bytes())
    report = verify_remote(root, bucket_url, endpoint_url=moto)
    kinds = {p.path: p.kind for p in report.problems}
    assert kinds == {a0: ProblemKind.MODIFIED, a1: ProblemKind.MISSING, b0: ProblemKind.TRUNCATED,
                     b1: ProblemKind.UNREADABLE}
    only_b = verify_remote(root, bucket_url, endpoint_url=moto, subsets=["b"])  # b's shards and the metadata
    assert only_b.files_checked == 2 + 2 * listed and len(only_b.problems) == 2


def _multipart_without_checksums(endpoint: str, bucket: str, key: str, body: bytes) -> None:
    """Upload ``body`` in one part of a multipart upload, with no checksum and no metadata: the store vouches
    for nothing (its ETag ends in ``-1``, no MD5)."""
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      config=Config(request_checksum_calculation="when_required"))
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=body)["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload,
                                 MultipartUpload={"Parts": [{"ETag": etag, "PartNumber": 1}]})


def test_cli_publish_prints_the_manifest_sha256_and_refuses_bad_urls(moto, bucket_url, fault_corpus, tmp_path):
    root = copy_corpus(fault_corpus, tmp_path / "c")
    done = run_cli("publish", str(root), "--to", bucket_url, "--endpoint-url", moto)
    assert done.returncode == 0, done.stderr
    digest = hashlib.sha256((root / MANIFEST).read_bytes()).hexdigest()
    assert f"manifest sha256: {digest}" in done.stdout
    assert read_mirrors(root)[0]["url"] == bucket_url
    bad = run_cli("publish", str(root), "--to", "s3://Not_A_Bucket/x", "--endpoint-url", moto)
    assert bad.returncode == 8 and "not an S3 URL" in bad.stderr


def test_a_failed_publish_records_no_mirror_and_a_missing_bucket_is_one_refusal(moto, bucket_url, fault_corpus,
                                                                                tmp_path):
    root = copy_corpus(fault_corpus, tmp_path / "c")
    before = (root / MANIFEST).read_bytes()
    missing = run_cli("publish", str(root), "--to", "s3://no-such-bucket-here/x", "--endpoint-url", moto)
    assert missing.returncode == 8, missing.stderr
    assert missing.stderr.count("NoSuchBucket") == 1 and "--mirror" not in missing.stderr
    assert f"create it first: aws s3 mb s3://no-such-bucket-here --endpoint-url {moto}\n" in missing.stderr
    assert (root / MANIFEST).read_bytes() == before and read_mirrors(root) == []
    publish(root, to=bucket_url, endpoint_url=moto)
    assert [m["url"] for m in read_mirrors(root)] == [bucket_url]  # the failed target never shows up
    assert (root / MANIFEST).read_bytes() == before



def test_the_unlisted_datasheet_is_published_and_one_stating_another_digest_is_refused(moto, bucket_url,
                                                                                       fault_corpus, tmp_path):
    from marin_data.layout import UNLISTED

    (datasheet,) = UNLISTED
    root = copy_corpus(fault_corpus, tmp_path / "c")
    (root / datasheet).parent.mkdir(parents=True, exist_ok=True)
    (root / datasheet).write_text(f"manifest sha256 {'0' * 64}\n")  # written for another manifest
    with pytest.raises(StaleDatasheetError):
        publish(root, to=bucket_url, endpoint_url=moto)
    assert _objects(moto, bucket_url) == {} and read_mirrors(root) == []
    (root / datasheet).write_text(f"manifest sha256 {fault_corpus.manifest_sha256}\n")  # `marin-data datasheet`
    first = publish(root, to=bucket_url, endpoint_url=moto)
    assert datasheet in first.uploaded and first.manifest_sha256 == fault_corpus.manifest_sha256
    assert _objects(moto, bucket_url)[datasheet] == (root / datasheet).stat().st_size
