"""hf:// as a store: `marin-data download hf://...` and `verify --remote hf://...` through `marin-data serve`,
with S3 and HF copies as fallbacks of each other, and a download killed mid-run that resumes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import build_corpus
from faultproxy import FaultProxy
from s3_env import FAST, bucket_url, copy_corpus, fault_corpus, kill_and_resume, moto, s3_client  # noqa: F401

from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.verify import ProblemKind, verify_corpus
from marin_data.errors import RemoteError
from marin_data.layout import MANIFEST
from marin_data.stores import open_store
from marin_data.testing.mirror import running_mirror
from marin_data.transfer.download import download
from marin_data.transfer.publish_hf import publish_hf
from marin_data.transfer.publish_s3 import publish
from marin_data.transfer.remote_verify import verify_remote

TOKEN = "t"
SUBSETS = {"a": [30, 20], "b/c": [20], "d": [5, 5, 5]}
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def mirror(tmp_path):
    (tmp_path / "mirror").mkdir()
    with running_mirror(tmp_path / "mirror", writable=True, token=TOKEN) as m:
        yield m


@pytest.fixture
def split(mirror, tmp_path):
    """A corpus published across three repos (team/c, team/c-part2, team/c-part3)."""
    corpus = build_corpus(tmp_path / "src", SUBSETS, max_files_per_repo=5)
    assert corpus.manifest.repos == {"a": 2, "b/c": 2, "d": 3}
    report = publish_hf(corpus.root, to="hf://datasets/team/c", endpoint=mirror.url, token=TOKEN, progress=False)
    assert len(report.repos) == 3
    return load_corpus(corpus.root)


def flip(path: Path, offset: int = 7) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.unlink()
    path.write_bytes(bytes(data))


def test_download_subsets_of_a_split_corpus_and_verify(mirror, split, tmp_path):
    dest = tmp_path / "dl"
    report = download("hf://datasets/team/c", subsets=["b/c", "d"], dest=dest, endpoint=mirror.url, progress=False)
    assert report.ok and {f.path for f in report.plan.files if f.subset} == {
        s.path for s in split.shards if s.subset in ("b/c", "d")}
    assert verify_corpus(dest, subsets=["b/c", "d"]).ok
    assert (dest / MANIFEST).read_bytes() == (split.root / MANIFEST).read_bytes()
    store = open_store("hf://datasets/team/c", endpoint=mirror.url)
    assert "README.md" not in {o.path for o in store.list()}  # the part repos' cards are not corpus files

    out = subprocess.run([sys.executable, "-m", "marin_data", "download", "hf://datasets/team/c", "--subset", "a",
                          "--to", str(dest), "--endpoint", mirror.url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert verify_corpus(dest, subsets=["a", "b/c", "d"]).ok


def test_a_pinned_revision_is_read_and_an_unknown_one_refused(mirror, split, tmp_path):
    sha = open_store("hf://datasets/team/c", endpoint=mirror.url)._commit("team/c")
    assert download(f"hf://datasets/team/c@{sha}", subsets=["a"], dest=tmp_path / "d1", endpoint=mirror.url,
                    progress=False).ok
    with pytest.raises(RemoteError, match="RevisionNotFound"):
        download("hf://datasets/team/c@v9", subsets=["a"], dest=tmp_path / "d2", endpoint=mirror.url, progress=False)


def test_verify_remote_compares_lfs_sha256_and_git_blob_ids_without_downloading(mirror, split):
    clean = verify_remote(split.root, "hf://datasets/team/c", endpoint=mirror.url)
    listed = len(split.manifest.files) + 1  # and the manifest; each also checked by its content name
    assert clean.ok and clean.files_checked == len(split.shards) + 2 * listed
    served = mirror.app.repos.root
    flip(served / "team/c-part3/data/d/part-00001.parquet")
    flip(served / "team/c/tokenizer.json")
    (served / "team/c-part2/data/a/part-00000.parquet").unlink()
    problems = {p.path: p.kind for p in verify_remote(split.root, "hf://datasets/team/c", endpoint=mirror.url).problems}
    assert problems == {"data/d/part-00001.parquet": ProblemKind.MODIFIED, "tokenizer.json": ProblemKind.MODIFIED,
                        "data/a/part-00000.parquet": ProblemKind.MISSING}


@pytest.mark.slow
def test_hf_and_s3_copies_are_fallbacks_of_each_other(mirror, moto, bucket_url, tmp_path):  # noqa: F811
    corpus = build_corpus(tmp_path / "src", SUBSETS)
    publish_hf(corpus.root, to="hf://datasets/team/both", endpoint=mirror.url, token=TOKEN, progress=False)
    publish(corpus.root, to=bucket_url, endpoint_url=moto, progress=False)
    publish_hf(corpus.root, to="hf://datasets/team/both", endpoint=mirror.url, token=TOKEN, progress=False)
    shard = corpus.shards[0].path
    flip(mirror.app.repos.root / "team/both" / shard)  # the HF copy of one shard rots
    bucket, prefix = bucket_url.removeprefix("s3://").split("/", 1)
    other = corpus.shards[-1].path
    s3_client(moto).delete_object(Bucket=bucket, Key=f"{prefix}/{other}")  # the S3 copy loses another

    opts = {"endpoint": mirror.url, "endpoint_url": moto, "policy": FAST, "progress": False}
    from_hf = download("hf://datasets/team/both", subsets=None, dest=tmp_path / "a", mirrors=[bucket_url], **opts)
    from_s3 = download(bucket_url, subsets=None, dest=tmp_path / "b", mirrors=["hf://datasets/team/both"], **opts)
    assert from_hf.ok and from_s3.ok
    assert verify_corpus(tmp_path / "a", subsets=list(SUBSETS)).ok and verify_corpus(tmp_path / "b",
                                                                                     subsets=list(SUBSETS)).ok


@pytest.mark.slow
def test_a_killed_download_resumes_without_refetching_finished_files(mirror, fault_corpus, tmp_path):  # noqa: F811
    src = load_corpus(copy_corpus(fault_corpus, tmp_path / "src"))
    publish_hf(src.root, to="hf://datasets/team/big", endpoint=mirror.url, token=TOKEN, progress=False)
    shards = list(load_corpus(src.root).shards)
    dest = tmp_path / "d"
    with FaultProxy(mirror.url) as proxy:
        kill_and_resume(["hf://datasets/team/big", "--endpoint", proxy.endpoint], proxy, dest, shards,
                        lambda: download("hf://datasets/team/big", subsets=None, dest=dest, endpoint=proxy.endpoint,
                                         policy=FAST, progress=False))
    assert verify_corpus(dest, subsets=list(src.manifest.subsets)).ok
