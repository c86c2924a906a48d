"""``marin-data trace --store s3://...`` on caches uploaded to a local S3 server (moto), and ``hf://...`` through a
Hub mirror: the same answers as from local disk; from S3, reading the ledgers, the offsets' shard indexes and
inner chunks in ranges, and never a byte of token data or a listing."""

from __future__ import annotations

from pathlib import Path

import yaml
from levanter_env import make_store
from s3_env import bucket_url, moto, proxy, s3_client  # noqa: F401 - fixtures
from shard_env import tiny_tokenizer, tree_bytes  # noqa: F401 - a fixture

from marin_data.levanter.order.trace import open_trace
from marin_data.testing.mirror import running_mirror

CELLS = {"cluster=0/quality=1": 700, "cluster=1/quality=1": 300}


def run_yaml(tmp_path: Path) -> str:
    config = {"data": {"components": {
        "a": {"type": "cached", "flat_cache": True, "cache_dir": "gs://bucket/store/cluster=0/quality=1"},
        "b": {"type": "cached", "flat_cache": True, "cache_dir": "gs://bucket/store/cluster=1/quality=1"}},
        "train_weights": {"a": 0.7, "b": 0.3}, "mixture_block_size": 16, "shuffle": True},
        "trainer": {"seed": 3, "train_batch_size": 8, "num_train_steps": 40}, "model": {"max_seq_len": 16}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def test_a_store_on_s3_traces_as_on_disk_in_ranges_without_token_data(tmp_path, moto, bucket_url,  # noqa: F811
                                                                       proxy):  # noqa: F811
    root = tmp_path / "store"
    make_store(root, CELLS)
    bucket, prefix = bucket_url[len("s3://"):].split("/", 1)
    for rel in tree_bytes(root):
        s3_client(moto).upload_file(str(root / rel), bucket, f"{prefix}/{rel}")
    local = open_trace(run_yaml(tmp_path), store=str(root))
    remote = open_trace(run_yaml(tmp_path), store=bucket_url, endpoint_url=proxy.endpoint)
    for step in (0, 5, 39):
        assert remote.step(step) == local.step(step)
    assert remote.document("cluster=1/quality=1:17") == local.document("cluster=1/quality=1:17")
    gets = proxy.requests("/", "GET")
    assert gets and not any("input_ids/data/c/" in r.path for r in gets)  # no token data
    assert not any("list-type" in r.path or r.path.rstrip("/").endswith(bucket) for r in gets)  # no listing
    offsets = [r for r in gets if "input_ids/offsets/c/" in r.path]
    assert offsets and all(r.range for r in offsets)  # shard indexes and inner chunks, never a whole file


def test_a_store_on_a_hub_mirror_traces_as_on_disk(tmp_path):
    root = tmp_path / "mirror" / "team" / "store"
    make_store(root, CELLS)
    local = open_trace(run_yaml(tmp_path), store=str(root))
    with running_mirror(tmp_path / "mirror") as mirror:
        remote = open_trace(run_yaml(tmp_path), store="hf://datasets/team/store", endpoint=mirror.url)
        for step in (0, 5, 39):
            assert remote.step(step) == local.step(step)
        assert remote.document("cluster=0/quality=1:3") == local.document("cluster=0/quality=1:3")


def test_a_pinned_store_on_s3_names_cell_sha256_and_license_as_on_disk(tmp_path, moto, bucket_url,  # noqa: F811
                                                                       tiny_tokenizer):  # noqa: F811
    from marin_data.levanter import adopt

    root = tmp_path / "store"
    make_store(root, CELLS)
    adopt(root, tokenizer=str(tiny_tokenizer), license="ODC-By-1.0")
    bucket, prefix = bucket_url[len("s3://"):].split("/", 1)
    for rel in tree_bytes(root):
        s3_client(moto).upload_file(str(root / rel), bucket, f"{prefix}/{rel}")
    local = open_trace(run_yaml(tmp_path), store=str(root)).step(4)
    remote = open_trace(run_yaml(tmp_path), store=bucket_url, endpoint_url=moto).step(4)
    assert remote == local
    assert all(s["license"] == "ODC-By-1.0" and s["shards"][0]["sha256"] for s in remote["batch"])
