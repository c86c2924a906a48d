"""`marin-data verify CORPUS --remote URL`: the published copy checked from the store's own checksums."""

from __future__ import annotations

import json

from s3_env import bucket_url, copy_corpus, fault_corpus, moto, run_cli, s3_client  # noqa: F401 - fixtures

from marin_data.stores.s3 import parse_s3_url
from marin_data.testing.mirror import running_mirror
from marin_data.transfer.publish_hf import publish_hf
from marin_data.transfer.publish_s3 import publish

TOKEN = "t0ken"


def test_verify_remote_s3_passes_then_names_the_modified_object(moto, bucket_url, fault_corpus, tmp_path):
    root = copy_corpus(fault_corpus, tmp_path / "c")
    publish(root, to=bucket_url, endpoint_url=moto)
    ok = run_cli("verify", str(root), "--remote", bucket_url, "--endpoint-url", moto, "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["problems"] == []
    bucket, prefix = parse_s3_url(bucket_url)
    shard = fault_corpus.shards[0].path
    s3_client(moto).put_object(Bucket=bucket, Key=f"{prefix}/{shard}", Body=(root / shard).read_bytes()[::-1],
                               ChecksumAlgorithm="SHA256")
    bad = run_cli("verify", str(root), "--remote", bucket_url, "--endpoint-url", moto)
    assert bad.returncode == 1
    assert f"modified  {shard}" in bad.stdout


def test_verify_remote_hf_uses_the_mirror_endpoint(fault_corpus, tmp_path):
    root = copy_corpus(fault_corpus, tmp_path / "c")
    (tmp_path / "mirror").mkdir()
    with running_mirror(tmp_path / "mirror", writable=True, token=TOKEN) as m:
        publish_hf(root, to="hf://datasets/team/c", endpoint=m.url, token=TOKEN, progress=False)
        ok = run_cli("verify", str(root), "--remote", "hf://datasets/team/c", "--endpoint", m.url)
        assert ok.returncode == 0, ok.stderr + ok.stdout
        shard = fault_corpus.shards[-1].path
        (tmp_path / "mirror" / "team" / "c" / shard).unlink()
        bad = run_cli("verify", str(root), "--remote", "hf://datasets/team/c", "--endpoint", m.url)
        assert bad.returncode == 1 and f"missing  {shard}" in bad.stdout


def test_store_flags_without_remote_and_cache_flags_with_remote_are_usage_errors(fault_corpus, tmp_path):
    root = str(fault_corpus.root)
    assert run_cli("verify", root, "--endpoint-url", "http://127.0.0.1:1").returncode == 2
    assert run_cli("verify", root, "--remote", "s3://b/p", "--expect-bos", "1").returncode == 2
    assert run_cli("verify", root, "--remote", "s3://b/p", "--engine", "ray").returncode == 2
    assert run_cli("verify", root, "--remote", "s3://b/p", "--endpoint", "http://127.0.0.1:1").returncode == 2
