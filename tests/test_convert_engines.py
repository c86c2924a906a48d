"""``convert --format marin --engine ray`` from a store in a bucket: one Ray task per cell, each opening the
source again, and the corpus byte for byte the one the local engine writes."""

from __future__ import annotations

import pytest
from levanter_env import PINNED_CELLS, make_store
from s3_env import bucket_url, moto, run_cli, upload_tree  # noqa: F401 - fixtures
from shard_env import tiny_tokenizer, tree_bytes  # noqa: F401 - fixture

from marin_data.levanter.to_marin import convert_to_marin


@pytest.mark.slow
def test_convert_from_s3_on_ray_is_byte_identical_to_the_local_engine(moto, bucket_url, tiny_tokenizer,
                                                                      tmp_path):  # noqa: F811
    ray = pytest.importorskip("ray")
    make_store(tmp_path / "store", PINNED_CELLS)
    upload_tree(moto, bucket_url, tmp_path / "store")
    settings = {"tokenizer": str(tiny_tokenizer), "shard_tokens": 1500, "endpoint_url": moto}
    local = convert_to_marin(bucket_url, dest=tmp_path / "local" / "corpus", **settings)
    on_ray = convert_to_marin(bucket_url, dest=tmp_path / "ray" / "corpus", engine="ray", workers=2, **settings)
    assert not ray.is_initialized()  # the engine started its own instance and stopped it
    assert on_ray.subsets == local.subsets == tuple(sorted(PINNED_CELLS)) and on_ray.files == local.files > 2
    assert tree_bytes(tmp_path / "ray" / "corpus") == tree_bytes(tmp_path / "local" / "corpus")
    assert on_ray.manifest_sha256 == local.manifest_sha256


def test_the_ray_engine_converts_from_levanter_only(tmp_path):
    from conftest import build_corpus

    corpus = build_corpus(tmp_path / "c", {"a": [200]})
    refused = run_cli("convert", str(corpus.root), "--to", str(tmp_path / "out"), "--format", "levanter",
                      "--engine", "ray")
    assert refused.returncode == 2 and "--engine ray" in refused.stderr
