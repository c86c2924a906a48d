"""`marin-data publish --to hf://...` against `marin-data serve --writable` on loopback (the real HfApi client)."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import build_corpus
from huggingface_hub import HfApi, snapshot_download
from test_mirror import corpus_files

from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.mirrors import read_mirrors
from marin_data.corpus.verify import verify_corpus
from marin_data.errors import ObjectTooLargeError, ShardChecksumError
from marin_data.layout import BY_SHA256, MANIFEST, MIRRORS
from marin_data.testing.mirror import running_mirror
from marin_data.transfer.publish_hf import plan_repos, publish_hf
from marin_data.transfer.versions import content_path

TOKEN = "t0ken"
SUBSETS = {"a": [20, 30], "b/c": [20], "d": [5, 5, 5]}


@pytest.fixture
def mirror(tmp_path):
    (tmp_path / "mirror").mkdir()
    with running_mirror(tmp_path / "mirror", writable=True, token=TOKEN) as m:
        yield m


def download(mirror, repo_id: str, dest: Path) -> Path:
    return Path(snapshot_download(repo_id, repo_type="dataset", cache_dir=dest, endpoint=mirror.url))


def test_publish_then_download_is_identical_and_a_rerun_sends_nothing(mirror, tmp_path):
    corpus = build_corpus(tmp_path / "src", SUBSETS)
    (corpus.root / "README.md").write_text("---\nlicense: cc0-1.0\n---\n# card\n")  # the card goes too
    report = publish_hf(corpus.root, to="hf://datasets/team/c", endpoint=mirror.url, token=TOKEN,
                        commit_files=3, progress=False)
    assert report.repos == ("hf://datasets/team/c",) and report.skipped == ()
    # 6 shards and 4 content copies by 3, then the manifest with the plain metadata files and the card
    assert report.commits == 5 and report.uploaded[-1] == MANIFEST
    assert report.manifest_sha256 == corpus.manifest_sha256 == load_corpus(corpus.root).manifest_sha256
    assert read_mirrors(corpus.root) == [{"url": "hf://datasets/team/c", "subsets": sorted(SUBSETS),
                                          "endpoint": mirror.url}]

    local = download(mirror, "team/c", tmp_path / "dl")
    listed = {**{p: r.sha256 for p, r in corpus.manifest.files.items()}, MANIFEST: corpus.manifest_sha256}
    copies = sorted(content_path(sha, p) for p, sha in listed.items())  # each also by its content, for old pins
    assert [f for f in corpus_files(local) if f.startswith(BY_SHA256 + "/")] == copies
    assert [f for f in corpus_files(local) if f not in copies] == [f for f in corpus_files(corpus.root)
                                                                   if f != MIRRORS]  # that stays local
    assert all(filecmp.cmp(corpus.root / f, local / f, shallow=False) for f in corpus_files(local) if f not in copies)
    assert all(filecmp.cmp(corpus.root / p, local / content_path(sha, p), shallow=False) for p, sha in listed.items())
    assert load_corpus(local).manifest_sha256 == report.manifest_sha256

    sha = HfApi(endpoint=mirror.url).dataset_info("team/c").sha
    again = publish_hf(corpus.root, to="hf://datasets/team/c", endpoint=mirror.url, token=TOKEN, progress=False)
    assert (again.uploaded, again.commits, len(again.skipped)) == ((), 0, len(report.uploaded))
    assert HfApi(endpoint=mirror.url).dataset_info("team/c").sha == sha


def test_an_interrupted_publish_resumes_without_resending(mirror, tmp_path):
    corpus = build_corpus(tmp_path / "src", SUBSETS)
    api = HfApi(endpoint=mirror.url, token=TOKEN)
    api.create_repo("team/r", repo_type="dataset")
    done = ["data/a/part-00000.parquet", "data/d/part-00001.parquet"]  # what a killed run had committed
    from huggingface_hub import CommitOperationAdd, constants

    before, constants.HF_HUB_DISABLE_XET = constants.HF_HUB_DISABLE_XET, True
    try:
        api.create_commit("team/r", [CommitOperationAdd(p, str(corpus.root / p)) for p in done], repo_type="dataset",
                          commit_message="partial")
    finally:
        constants.HF_HUB_DISABLE_XET = before
    report = publish_hf(corpus.root, to="hf://datasets/team/r", endpoint=mirror.url, token=TOKEN, progress=False)
    assert sorted(report.skipped) == sorted(done) and not set(done) & set(report.uploaded)
    assert verify_corpus(download(mirror, "team/r", tmp_path / "dl")).ok


def test_subsets_are_split_across_repos_as_the_pinned_manifest_says(mirror, tmp_path):
    corpus = build_corpus(tmp_path / "src", SUBSETS, max_files_per_repo=10)  # room for 9 metadata files first
    assert corpus.manifest.repos == {"a": 2, "b/c": 1, "d": 2}
    report = publish_hf(corpus.root, to="hf://datasets/team/s", endpoint=mirror.url, token=TOKEN,
                        max_files_per_repo=10, progress=False)
    assert report.repos == ("hf://datasets/team/s", "hf://datasets/team/s-part2")
    assert report.manifest_sha256 == corpus.manifest_sha256  # the split is in the manifest, decided before
    mirrors = {m["url"]: m["subsets"] for m in read_mirrors(corpus.root)}
    assert mirrors == {"hf://datasets/team/s": ["b/c"], "hf://datasets/team/s-part2": ["a", "d"]}
    api = HfApi(endpoint=mirror.url)
    for url, subsets in mirrors.items():
        repo = url.removeprefix("hf://datasets/")
        files = [e.path for e in api.list_repo_tree(repo, repo_type="dataset", recursive=True) if hasattr(e, "size")]
        assert len(files) <= 10
        shards = {f for f in files if f.startswith("data/")}
        assert shards == {s.path for s in corpus.shards if s.subset in subsets}
        assert (MANIFEST in files) == (repo == "team/s")
    from marin_data.transfer.download import download as fetch

    got = fetch("hf://datasets/team/s", subsets=["d"], dest=tmp_path / "dl", endpoint=mirror.url,
                manifest_sha256=corpus.manifest_sha256)  # found in the part repo through the pinned manifest
    assert got.ok and verify_corpus(tmp_path / "dl").ok


def test_limits_the_manifest_split_does_not_meet_are_refused_before_any_upload(mirror, tmp_path):
    corpus = build_corpus(tmp_path / "src", SUBSETS)
    with pytest.raises(ObjectTooLargeError, match="repo team/x would hold 14 files"):  # 10 and 4 content copies
        plan_repos(corpus, "team/x", max_files_per_repo=9)
    with pytest.raises(ObjectTooLargeError, match="fewer than 3 per folder"):
        plan_repos(corpus, "team/x", max_files_per_folder=3)


def test_a_shard_that_left_the_manifest_is_not_published_nor_the_manifest(mirror, tmp_path):
    corpus = build_corpus(tmp_path / "src", SUBSETS)
    shard = corpus.root / corpus.shards[-1].path
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardChecksumError):
        publish_hf(corpus.root, to="hf://datasets/team/bad", endpoint=mirror.url, token=TOKEN, progress=False)
    files = [e.path for e in HfApi(endpoint=mirror.url).list_repo_tree("team/bad", repo_type="dataset",
                                                                        recursive=True)]
    assert MANIFEST not in files and corpus.shards[-1].path not in files


def test_cli_publish_to_hf_and_flag_checks(mirror, tmp_path):
    corpus = build_corpus(tmp_path / "src", SUBSETS)
    cli = [sys.executable, "-m", "marin_data", "publish", str(corpus.root)]
    out = subprocess.run([*cli, "--to", "hf://datasets/team/cli", "--endpoint", mirror.url, "--token", TOKEN],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "manifest sha256: " + load_corpus(corpus.root).manifest_sha256 in out.stdout
    assert "%|" not in out.stderr and "it/s" not in out.stderr  # no progress bars in a log, the Hub's neither
    wrong = subprocess.run([*cli, "--to", "hf://datasets/team/cli2", "--endpoint", mirror.url, "--token", "nope"],
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 8 and "401" in wrong.stderr  # RemoteError: check the credentials
    assert [m["url"] for m in read_mirrors(corpus.root)] == ["hf://datasets/team/cli"]  # not the refused one
    mixed = subprocess.run([*cli, "--to", "hf://datasets/team/cli", "--profile", "p"], capture_output=True,
                           text=True, timeout=60)
    assert mixed.returncode == 2 and "--profile" in mixed.stderr
