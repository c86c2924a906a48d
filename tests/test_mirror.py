"""`marin-data serve`, read side: unmodified huggingface_hub / datasets clients against a mirror on loopback.

The clients take ``endpoint=`` in process; where a library reads ``HF_ENDPOINT`` at import (``datasets``, the
``hf`` CLI) it runs in a subprocess. Raw requests go through ``http.client`` so that paths reach the server
exactly as written (an HTTP library would normalise ``..`` away before sending).
"""

from __future__ import annotations

import filecmp
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import build_corpus
from shard_env import tiny_tokenizer  # noqa: F401 - a fixture
from huggingface_hub import HfApi, HfFileSystem, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

from marin_data.cli import main as marin_data_main
from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.verify import verify_corpus
from marin_data.testing.mirror import running_mirror

REPO = "marin/tiny"
SUBSETS = {"a": [40, 30], "b/c": [20]}
CARD = "---\nlicense: cc0-1.0\nconfigs:\n- config_name: a\n  data_files: data/a/*.parquet\n---\n# tiny\n"
HF_ENV = {"HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def make_root(root: Path) -> Path:
    """A mirror root holding the corpus ``marin/tiny`` with a dataset card; returns the corpus folder."""
    built = build_corpus(root / REPO, SUBSETS)
    (built.root / "README.md").write_text(CARD)
    commit_corpus(built.root, built.manifest, built.shards, extra_files=["README.md"])  # the card is listed too
    return built.root


def corpus_files(corpus: Path) -> list[str]:
    """The files a repo serves: hidden ones (``.marin.lock``, ``.cache/``) are never part of it."""
    rel = (p.relative_to(corpus) for p in corpus.rglob("*") if p.is_file())
    return sorted(r.as_posix() for r in rel if not any(part.startswith(".") for part in r.parts))


def raw_request(url: str, method: str, path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    """Send ``path`` byte for byte (no client-side normalisation); return (status, headers, body)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def hf_subprocess(url: str, code: str, tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_ENDPOINT=url, HF_HOME=str(tmp_path / "hf_home"), **HF_ENV)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One read-only mirror for the module (tests here never write to it); tiny pages to exercise paging."""
    root = tmp_path_factory.mktemp("mirror")
    corpus = make_root(root)
    with running_mirror(root, page_size=4) as mirror:
        yield mirror, corpus


def flip_byte(path: Path, offset: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.unlink()  # the cache may hold a symlink to a read-only blob: replace the file
    path.write_bytes(bytes(data))


def test_snapshot_download_is_byte_identical_and_verify_catches_flipped_bytes(served, tmp_path):
    mirror, corpus = served
    api = HfApi(endpoint=mirror.url)
    local = Path(snapshot_download(REPO, repo_type="dataset", cache_dir=tmp_path / "cache", endpoint=mirror.url))
    files = corpus_files(corpus)
    assert corpus_files(local) == files
    assert all(filecmp.cmp(corpus / f, local / f, shallow=False) for f in files)

    ok = api.verify_repo_checksums(REPO, repo_type="dataset", cache_dir=tmp_path / "cache")
    assert (ok.checked_count, ok.mismatches, ok.missing_paths) == (len(files), [], [])

    shard = "data/a/part-00001.parquet"
    flip_byte(local / shard, 100)
    flip_byte(local / "README.md", 3)
    bad = api.verify_repo_checksums(REPO, repo_type="dataset", cache_dir=tmp_path / "cache")
    assert {(m["path"], m["algorithm"]) for m in bad.mismatches} == {(shard, "sha256"), ("README.md", "git-sha1")}


def test_hf_cache_verify_cli_passes_then_fails_on_a_flipped_shard_byte(served, tmp_path):
    mirror, corpus = served
    local = tmp_path / "local"
    snapshot_download(REPO, repo_type="dataset", local_dir=local, endpoint=mirror.url)
    env = dict(os.environ, HF_ENDPOINT=mirror.url, HF_HOME=str(tmp_path / "hf_home"), **HF_ENV)
    hf = [str(Path(sys.executable).parent / "hf"), "cache", "verify", REPO, "--repo-type", "dataset",
          "--local-dir", str(local)]
    assert subprocess.run(hf, env=env, capture_output=True, text=True, timeout=120).returncode == 0
    flip_byte(local / "data/b/c/part-00000.parquet", 50)
    failed = subprocess.run(hf, env=env, capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0 and "data/b/c/part-00000.parquet" in failed.stdout + failed.stderr


def test_a_local_dir_copy_verifies_with_the_hub_clients_bookkeeping_skipped_and_said_once(served, tmp_path, capsys):
    mirror, corpus = served
    local = tmp_path / "local"
    snapshot_download(REPO, repo_type="dataset", local_dir=local, endpoint=mirror.url)  # `hf download --local-dir`
    assert (local / ".cache/huggingface").is_dir()
    with pytest.raises(SystemExit) as exit_:
        marin_data_main(["verify", str(local)])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.count(".cache/huggingface") == 1 and "unlisted" not in out
    assert out.splitlines()[0].startswith("ignored  .cache/huggingface/  huggingface_hub's own bookkeeping")
    (local / ".cache/stray.parquet").write_bytes(b"x")  # only the Hub client's own folder is skipped
    assert verify_corpus(local, progress=False).problems[0].path == ".cache/stray.parquet"


def test_single_file_download_and_metadata_headers(served, tmp_path):
    mirror, corpus = served
    shard = next(s for s in build_index(corpus) if s["subset"] == "b/c")
    path = hf_hub_download(REPO, shard["path"], repo_type="dataset", cache_dir=tmp_path, endpoint=mirror.url)
    assert Path(path).read_bytes() == (corpus / shard["path"]).read_bytes()
    meta = get_hf_file_metadata(hf_hub_url(REPO, shard["path"], repo_type="dataset", endpoint=mirror.url))
    info = HfApi(endpoint=mirror.url).dataset_info(REPO)
    assert (meta.etag, meta.size, meta.commit_hash) == (shard["sha256"], shard["bytes"], info.sha)
    assert len(info.sha) == 40 and {s.rfilename for s in info.siblings} == set(corpus_files(corpus))


def build_index(corpus: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(corpus / "shards.parquet").to_pylist()


def test_head_and_range_requests_carry_the_hub_headers(served):
    mirror, corpus = served
    shard = build_index(corpus)[0]
    url = f"/datasets/{REPO}/resolve/main/{shard['path']}"
    data = (corpus / shard["path"]).read_bytes()
    status, h, body = raw_request(mirror.url, "HEAD", url)
    assert status == 200 and body == b""
    assert h["x-linked-etag"] == f'"{shard["sha256"]}"' and h["etag"] == f'"{shard["sha256"]}"'
    assert h["x-linked-size"] == h["content-length"] == str(len(data))
    assert h["accept-ranges"] == "bytes" and len(h["x-repo-commit"]) == 40
    assert not [k for k in h if k.startswith("x-xet")]

    for rng, want in [("bytes=10-19", data[10:20]), ("bytes=-7", data[-7:]), (f"bytes={len(data) - 3}-", data[-3:])]:
        status, h, body = raw_request(mirror.url, "GET", url, {"Range": rng})
        assert (status, body) == (206, want), rng
        assert h["content-range"].endswith(f"/{len(data)}") and h["content-length"] == str(len(want))
    status, h, _ = raw_request(mirror.url, "GET", url, {"Range": f"bytes={len(data)}-"})
    assert status == 416 and h["content-range"] == f"bytes */{len(data)}"

    status, h, body = raw_request(mirror.url, "GET", f"/datasets/{REPO}/resolve/main/README.md")
    git = subprocess.run(["git", "hash-object", "--stdin"], input=CARD.encode(), capture_output=True, check=True)
    assert (status, body) == (200, CARD.encode())
    assert h["etag"] == f'"{git.stdout.decode().strip()}"' and "x-linked-etag" not in h


def test_tree_listing_is_paginated_and_carries_lfs_sha256_and_git_blob_ids(served):
    mirror, corpus = served
    status, h, body = raw_request(mirror.url, "GET", f"/api/datasets/{REPO}/tree/main?recursive=true")
    assert status == 200 and len(json.loads(body)) == 4 and 'rel="next"' in h["link"]

    entries = {e.path: e for e in HfApi(endpoint=mirror.url).list_repo_tree(REPO, repo_type="dataset",
                                                                             recursive=True)}
    assert {p for p, e in entries.items() if hasattr(e, "blob_id")} == set(corpus_files(corpus))
    assert {"data", "data/a", "data/b", "data/b/c"} <= set(entries)
    for shard in build_index(corpus):
        assert (entries[shard["path"]].lfs.sha256, entries[shard["path"]].size) == (shard["sha256"], shard["bytes"])
    for name in ("README.md", "manifest.json", "SHA256SUMS"):
        git = subprocess.run(["git", "hash-object", str(corpus / name)], capture_output=True, text=True, check=True)
        assert entries[name].lfs is None and entries[name].blob_id == git.stdout.strip()
    top = [e.path for e in HfApi(endpoint=mirror.url).list_repo_tree(REPO, "data/b", repo_type="dataset")]
    assert top == ["data/b/c"]


def test_hffilesystem_lists_globs_and_reads_ranges(served):
    mirror, corpus = served
    fs = HfFileSystem(endpoint=mirror.url, skip_instance_cache=True)
    base = f"datasets/{REPO}"
    assert sorted(fs.ls(base, detail=False)) == sorted(f"{base}/{p}" for p in os.listdir(corpus))
    assert fs.glob(f"{base}/data/**/*.parquet") == [f"{base}/{s['path']}" for s in
                                                    sorted(build_index(corpus), key=lambda s: s["path"])]
    shard = build_index(corpus)[1]
    assert fs.info(f"{base}/{shard['path']}")["lfs"].sha256 == shard["sha256"]
    data = (corpus / shard["path"]).read_bytes()
    with fs.open(f"{base}/{shard['path']}", block_size=1000) as f:
        f.seek(123)
        assert f.read(2500) == data[123:2623]
    (info,) = HfApi(endpoint=mirror.url).get_paths_info(REPO, [shard["path"], "no/such"], repo_type="dataset")
    assert info.lfs.sha256 == shard["sha256"]


def test_missing_repo_revision_and_file_raise_the_hub_errors(served, tmp_path):
    mirror, _ = served
    api = HfApi(endpoint=mirror.url)
    with pytest.raises(RepositoryNotFoundError):
        api.dataset_info("marin/nope")
    with pytest.raises(RevisionNotFoundError):
        api.dataset_info(REPO, revision="0" * 40)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "no/such/file", repo_type="dataset", cache_dir=tmp_path, endpoint=mirror.url)
    status, h, _ = raw_request(mirror.url, "HEAD", f"/datasets/{REPO}/resolve/main/no/such/file")
    assert (status, h["x-error-code"]) == (404, "EntryNotFound") and h["x-repo-commit"] == api.dataset_info(REPO).sha
    assert raw_request(mirror.url, "GET", "/api/datasets/marin/nope/tree/main")[1]["x-error-code"] == "RepoNotFound"
    assert raw_request(mirror.url, "GET", f"/api/datasets/{REPO}/tree/v2")[1]["x-error-code"] == "RevisionNotFound"


def test_traversal_attempts_and_escaping_symlinks_are_refused(tmp_path):
    root = tmp_path / "root"
    corpus = make_root(root)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    (corpus / "leak.txt").symlink_to(secret)  # a file symlink leaving ROOT
    (root / "marin" / "outside").symlink_to(tmp_path, target_is_directory=True)  # a repo leaving ROOT
    (corpus / ".git").mkdir()
    (corpus / ".git" / "config").write_text("TOP SECRET")
    attempts = [
        f"/datasets/{REPO}/resolve/main/../../../secret.txt",
        f"/datasets/{REPO}/resolve/main/%2e%2e/%2e%2e/%2e%2e/secret.txt",
        f"/datasets/{REPO}/resolve/main/..%2f..%2f..%2fsecret.txt",
        f"/datasets/{REPO}/resolve/main/%2F{tmp_path}/secret.txt",
        f"/datasets/{REPO}/resolve/main//{tmp_path}/secret.txt",
        f"/datasets/{REPO}/resolve/main/data/%00/x",
        f"/datasets/{REPO}/resolve/main/leak.txt",
        f"/datasets/{REPO}/resolve/main/.git/config",
        "/datasets/marin/outside/resolve/main/secret.txt",
        "/datasets/marin/%2e%2e/resolve/main/secret.txt",
        f"/api/datasets/{REPO}/tree/main/%2e%2e",
        f"/api/datasets/{REPO}/tree/main/..%2F..",
        "/api/datasets/marin/outside/tree/main",
    ]
    with running_mirror(root) as mirror:
        for path in attempts:
            status, _, body = raw_request(mirror.url, "GET", path)
            assert status in (400, 404) and b"TOP SECRET" not in body, path
        listed = [e.path for e in HfApi(endpoint=mirror.url).list_repo_tree(REPO, repo_type="dataset", recursive=True)]
        assert "leak.txt" not in listed and not any(p.startswith(".") for p in listed)
        assert "marin/outside" not in [d.id for d in HfApi(endpoint=mirror.url).list_datasets()]


def test_commit_id_is_a_pure_function_of_the_content(tmp_path):
    root = tmp_path / "root"
    corpus = make_root(root)
    with running_mirror(root) as first:
        sha = HfApi(endpoint=first.url).dataset_info(REPO).sha
    with running_mirror(root) as second:  # a fresh server, cold caches: the same id
        api = HfApi(endpoint=second.url)
        assert api.dataset_info(REPO).sha == sha
        flip_byte(corpus / "README.md", 5)  # in place: seen when the file is next served
        with pytest.raises(RevisionNotFoundError):
            hf_hub_download(REPO, "README.md", repo_type="dataset", revision=sha, cache_dir=tmp_path / "c",
                            endpoint=second.url)
        new = api.dataset_info(REPO).sha
        assert new != sha and len(new) == 40
        (corpus / "extra.txt").write_text("new file")  # a new file: seen through the folder's mtime
        assert api.dataset_info(REPO).sha not in (sha, new)


def test_concurrent_clients_get_the_right_bytes(served):
    mirror, corpus = served
    shards = build_index(corpus)
    errors: list[str] = []

    def fetch(i: int) -> None:
        shard = shards[i % len(shards)]
        start = (i * 97) % shard["bytes"]
        status, _, body = raw_request(mirror.url, "GET", f"/datasets/{REPO}/resolve/main/{shard['path']}",
                                      {"Range": f"bytes={start}-"})
        if status != 206 or body != (corpus / shard["path"]).read_bytes()[start:]:
            errors.append(f"{i}: {status}")

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and not any(t.is_alive() for t in threads)


def test_model_urls_serve_a_tokenizer_repo(served, tmp_path):
    mirror, corpus = served
    path = hf_hub_download(REPO, "tokenizer.json", cache_dir=tmp_path, endpoint=mirror.url)
    assert Path(path).read_bytes() == (corpus / "tokenizer.json").read_bytes()


def test_shard_resolves_a_tokenizer_repo_id_through_the_mirror(tiny_tokenizer, tmp_path):
    """`marin-data shard --tokenizer org/name` with HF_ENDPOINT at the mirror: a model repo holding only a
    real tokenizer.json."""
    (tmp_path / "root/acme/bpe").mkdir(parents=True)
    shutil.copyfile(tiny_tokenizer, tmp_path / "root/acme/bpe/tokenizer.json")
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": str(i), "text": f"document number {i}"}) + "\n" for i in range(5)))
    code = ("from marin_data.cli import main\n"
            f"main(['shard', {str(docs)!r}, '--subset', 's', '--tokenizer', 'acme/bpe', '--out', {str(tmp_path / 'c')!r}])")
    with running_mirror(tmp_path / "root") as mirror:
        out = hf_subprocess(mirror.url, code, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "c/tokenizer.json").read_bytes() == tiny_tokenizer.read_bytes()
    assert json.loads((tmp_path / "c/manifest.json").read_text())["tokenizer"]["name"] == "acme/bpe"


@pytest.mark.slow
def test_datasets_loads_a_subset_through_the_mirror(served, tmp_path):
    mirror, corpus = served
    code = (
        "import datasets, json\n"
        f"a = datasets.load_dataset('parquet', data_files='hf://datasets/{REPO}/data/a/*.parquet', split='train',"
        f" cache_dir={str(tmp_path / 'ds')!r})\n"
        f"c = datasets.load_dataset({REPO!r}, data_files='data/b/c/*.parquet', split='train',"
        f" cache_dir={str(tmp_path / 'ds')!r})\n"
        "print(json.dumps([a.num_rows, c.num_rows, a[0]['id'], len(a[0]['tokens'])]))\n"
    )
    out = hf_subprocess(mirror.url, code, tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows_a, rows_c, first_id, first_len = json.loads(out.stdout.strip().splitlines()[-1])
    import pyarrow.parquet as pq

    first = pq.read_table(corpus / "data/a/part-00000.parquet").slice(0, 1).to_pylist()[0]
    assert (rows_a, rows_c) == (sum(SUBSETS["a"]), sum(SUBSETS["b/c"]))
    assert (first_id, first_len) == (first["id"], len(first["tokens"]))


def test_cli_serve_refuses_a_token_without_writable_and_writable_without_token(tmp_path):
    for args in (["--writable"], ["--token", "t"]):
        out = subprocess.run([sys.executable, "-m", "marin_data", "serve", str(tmp_path), *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "--writable" in out.stderr
