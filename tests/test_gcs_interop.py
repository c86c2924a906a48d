"""Google Cloud Storage through our S3 store (``--endpoint-url https://storage.googleapis.com``, HMAC keys),
played by `gcs_proxy.GcsProxy` in front of moto: no ``ChecksumSHA256``, ``x-goog-hash`` crc32c and md5
instead, ETags that are no MD5 for composite objects, metadata as ``x-goog-meta-*``, and listings without
``ChecksumAlgorithm``, ``Owner`` or ``EncodingType``, in small pages under GCS's own continuation tokens.
Listing, downloads (unpinned and pinned), ``verify --remote`` and ``--deep`` work through it, and a byte
flipped in the bucket is caught by the store's crc32c or md5."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil

import crc32c
import pytest
from faultproxy import Fault
from gcs_proxy import PAGE_KEYS, GcsProxy
from levanter_env import PINNED_CELLS, make_store, pinned_store  # noqa: F401 - fixture
from s3_env import FAST, bucket_url, moto, rewrite_keeping_metadata, upload_tree  # noqa: F401
from shard_env import tiny_tokenizer, tree_bytes  # noqa: F401 - fixture

from marin_data.formats import open_source
from marin_data.layout import CHECKED
from marin_data.levanter import detect
from marin_data.levanter.download import download_cache
from marin_data.stores.s3 import S3Store, parse_s3_url
from marin_data.transfer.download import download
from marin_data.transfer.publish_s3 import publish
from marin_data.transfer.remote_verify import verify_remote

CELL, OTHER = sorted(PINNED_CELLS)
CHUNK = f"{CELL}/input_ids/data/c/0"  # an object GCS keeps an MD5 for
COMPOSITE = f"{CELL}/input_ids/data/c/1"  # a composite object: a crc32c alone


@pytest.fixture
def gcs(moto):  # noqa: F811
    with GcsProxy(moto, composite=("input_ids/data/c/1",)) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("gcs") / "store"
    make_store(root, PINNED_CELLS)
    return root


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def test_the_s3_store_lists_in_gcs_pages_and_takes_its_hashes_never_its_etags(store, moto, bucket_url, gcs):  # noqa: F811
    upload_tree(moto, bucket_url, store)
    s3 = S3Store.from_url(bucket_url, endpoint_url=gcs.endpoint)
    listed = list(s3.list())
    assert sorted(o.path for o in listed) == sorted(tree_bytes(store))  # raw keys ('='), every page
    pages = [r for r in gcs.log if r.path == "/" + parse_s3_url(bucket_url)[0]]
    assert len(pages) >= len(listed) // PAGE_KEYS
    assert all(o.checksums == () and set(o.unfetched) == {"crc32c", "md5"} for o in listed)
    by_path = {o.path: o for o in listed}
    plain, composite = s3.vouched(by_path[CHUNK]), s3.vouched(by_path[COMPOSITE])
    data, joined = (store / CHUNK).read_bytes(), (store / COMPOSITE).read_bytes()
    assert plain.sha256 is None
    assert dict(plain.checksums) == {"md5": hashlib.md5(data).hexdigest(), "crc32c": f"{crc32c.crc32c(data):08x}"}
    assert dict(composite.checksums) == {"crc32c": f"{crc32c.crc32c(joined):08x}"}  # its ETag is no MD5


def test_an_unpinned_download_checks_md5_and_crc32c_and_a_flipped_byte_fails_its_file(store, moto, bucket_url, gcs,
                                                                                     tmp_path):  # noqa: F811
    upload_tree(moto, bucket_url, store)
    found = detect(bucket_url, endpoint_url=gcs.endpoint)
    done = download_cache(found, subsets=[CELL], dest=tmp_path / "d", policy=FAST, progress=False,
                          endpoint_url=gcs.endpoint)
    assert done.ok and done.size_only == ()
    record = json.loads((tmp_path / "d" / CHECKED).read_text())["files"]
    assert record[CHUNK]["checked"] == "md5" and record[COMPOSITE]["checked"] == "crc32c"

    gcs.add(Fault("corrupt", match="cluster%3D2/quality%3D4/input_ids/data/c/1", times=100))
    bad = download_cache(found, subsets=[OTHER], dest=tmp_path / "d", policy=FAST, progress=False,
                         endpoint_url=gcs.endpoint)
    assert [p for p, _ in bad.transfer.failed] == [f"{OTHER}/input_ids/data/c/1"]
    assert "crc32c" in bad.transfer.failed[0][1]


def test_a_pinned_store_verifies_and_downloads_and_a_flipped_byte_is_caught_by_crc32c_and_md5(
        moto, bucket_url, gcs, pinned_store, tmp_path):  # noqa: F811
    root = shutil.copytree(pinned_store, tmp_path / "pin")
    publish(root, to=bucket_url, endpoint_url=moto)
    pin = open_source(bucket_url, endpoint_url=gcs.endpoint)
    assert verify_remote(root, bucket_url, endpoint_url=gcs.endpoint).ok  # x-goog-meta-sha256, and md5 vs local
    assert pin.verify_remote().ok and pin.verify_remote(deep=True).ok
    assert download(bucket_url, subsets=[CELL], dest=tmp_path / "d", policy=FAST, progress=False,
                    endpoint_url=gcs.endpoint).ok

    for path in (CHUNK, COMPOSITE):
        rewrite_keeping_metadata(moto, bucket_url, path)
    found = {p.path: p.message for p in verify_remote(root, bucket_url, endpoint_url=gcs.endpoint).problems}
    assert set(found) == {CHUNK, COMPOSITE}
    assert "the store's md5" in found[CHUNK] and "the store's crc32c" in found[COMPOSITE]
    assert pin.verify_remote().ok  # without a local copy, only the (old) metadata speaks
    assert {p.path for p in pin.verify_remote(deep=True).problems} == {CHUNK, COMPOSITE}
    again = download(bucket_url, subsets=[CELL], dest=tmp_path / "d2", policy=FAST, progress=False,
                     endpoint_url=gcs.endpoint)
    assert not again.ok and {f for f, _ in again.failed} == {CHUNK, COMPOSITE}
