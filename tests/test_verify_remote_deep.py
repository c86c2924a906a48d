"""``verify PIN --remote [--deep]``: a published pin checked where it is stored. Plain ``--remote`` trusts the
store's checksums; ``--deep`` re-hashes every byte (and checks a pinned Levanter store's cells), so an object
rewritten with its old checksum metadata kept is caught by ``--deep`` only. The Ray engine finds exactly what
the local one does."""

from __future__ import annotations

import shutil
import sys

import pytest
from levanter_env import pinned_store  # noqa: F401 - fixture
from s3_env import bucket_url, copy_corpus, fault_corpus, moto, run_cli, s3_client  # noqa: F401 - fixtures
from s3_env import rewrite_keeping_metadata
from shard_env import tiny_tokenizer  # noqa: F401 - fixture

from marin_data.formats import open_source
from marin_data.stores.s3 import parse_s3_url
from marin_data.transfer.publish_s3 import publish

CELL = "cluster=1/quality=4"
CHUNK = f"{CELL}/input_ids/data/c/0"


def _remote(url: str, endpoint: str, **kw):
    return open_source(url, endpoint_url=endpoint).verify_remote(**kw)


def test_deep_catches_a_byte_flipped_under_the_old_checksum_metadata_and_plain_remote_does_not(moto, bucket_url,
                                                                                     fault_corpus, tmp_path):
    root = copy_corpus(fault_corpus, tmp_path / "c")
    publish(root, to=bucket_url, endpoint_url=moto)
    shard = fault_corpus.shards[1].path
    rewrite_keeping_metadata(moto, bucket_url, shard)

    plain = run_cli("verify", bucket_url, "--remote", "--endpoint-url", moto)
    assert plain.returncode == 0, plain.stderr + plain.stdout  # the store's word: the old sha256 metadata
    against_local = run_cli("verify", str(root), "--remote", bucket_url, "--endpoint-url", moto)
    assert against_local.returncode == 1 and f"modified  {shard}" in against_local.stdout  # its ETag's MD5
    deep = run_cli("verify", bucket_url, "--remote", "--deep", "--endpoint-url", moto)
    assert deep.returncode == 1, deep.stderr
    assert f"modified  {shard}" in deep.stdout and "OK" not in deep.stdout
    assert "FAILED: deep," in deep.stdout
    deep_local = run_cli("verify", str(root), "--remote", bucket_url, "--deep", "--endpoint-url", moto)
    assert deep_local.returncode == 1 and f"modified  {shard}" in deep_local.stdout


def test_deep_counts_every_listed_file_and_its_copies_by_content(moto, bucket_url, fault_corpus, tmp_path):
    root = copy_corpus(fault_corpus, tmp_path / "c")
    publish(root, to=bucket_url, endpoint_url=moto)
    plain, deep = _remote(bucket_url, moto), _remote(bucket_url, moto, deep=True)
    assert plain.ok and deep.ok and deep.deep
    assert deep.files_checked == plain.files_checked  # shards, metadata, manifest, and the by-sha256 copies
    listed = sum(s.bytes for s in fault_corpus.shards)
    assert deep.bytes_checked > listed  # every shard's bytes read, and the metadata files'
    one = _remote(bucket_url, moto, deep=True, subsets=["a"])
    assert one.subsets == ("a",) and one.files_checked == deep.files_checked - 2


def test_deep_on_a_pinned_store_hashes_every_file_and_checks_every_cell(moto, bucket_url, pinned_store, tmp_path):
    publish(shutil.copytree(pinned_store, tmp_path / "store"), to=bucket_url, endpoint_url=moto)
    assert _remote(bucket_url, moto, deep=True).ok
    bucket, prefix = parse_s3_url(bucket_url)
    s3_client(moto).delete_object(Bucket=bucket, Key=f"{prefix}/{CELL}/shard_ledger.json")
    rewrite_keeping_metadata(moto, bucket_url, CHUNK)
    assert _remote(bucket_url, moto).ok is False  # the ledger's absence shows in the listing; the chunk does not
    found = {(p.path, p.kind.value) for p in _remote(bucket_url, moto, deep=True).problems}
    assert (CHUNK, "modified") in found and (f"{CELL}/shard_ledger.json", "missing") in found
    assert any(kind == "bad_cache_file" and path.startswith(CELL) for path, kind in found)  # the cell's check


def test_remote_without_url_on_local_data_and_engine_without_deep_are_usage_errors(fault_corpus):
    root = str(fault_corpus.root)
    local = run_cli("verify", root, "--remote")
    assert local.returncode == 2 and "is on this machine" in local.stderr
    assert run_cli("verify", "s3://b/p", "--remote", "--engine", "ray").returncode == 2
    assert run_cli("verify", "s3://b/p", "--remote", "--expect-bos", "1").returncode == 2


@pytest.mark.slow
def test_deep_on_ray_finds_what_the_local_engine_finds(moto, bucket_url, pinned_store, tmp_path):
    ray = pytest.importorskip("ray")
    publish(shutil.copytree(pinned_store, tmp_path / "store"), to=bucket_url, endpoint_url=moto)
    rewrite_keeping_metadata(moto, bucket_url, CHUNK)
    bucket, prefix = parse_s3_url(bucket_url)
    s3_client(moto).delete_object(Bucket=bucket, Key=f"{prefix}/cluster=2/quality=4/shard_ledger.json")
    local = _remote(bucket_url, moto, deep=True, workers=2)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    on_ray = _remote(bucket_url, moto, deep=True, engine="ray", workers=2)
    assert not ray.is_initialized()  # the engine started its own instance and stopped it
    assert [p.to_json() for p in on_ray.problems] == [p.to_json() for p in local.problems]
    assert (on_ray.files_checked, on_ray.bytes_checked, on_ray.workers) == (local.files_checked,
                                                                            local.bytes_checked, 2)
    assert {p.kind.value for p in local.problems} >= {"modified", "missing", "bad_cache_file"}
