"""`marin-data serve --writable --token T`: HfApi publishes to the mirror; every other write is refused.

``huggingface_hub`` with ``hf_xet`` installed uploads through Xet unless ``HF_HUB_DISABLE_XET`` is set (it never
asks the server), so the clients here run with it set, as the mirror's 501 on the Xet token endpoint tells users.
"""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, constants, snapshot_download
from huggingface_hub.errors import HfHubHTTPError
from test_mirror import REPO, corpus_files, make_root, raw_request

from marin_data.corpus.verify import verify_corpus
from marin_data.testing.mirror import running_mirror

TOKEN = "s3cret-token"


@pytest.fixture(autouse=True)
def no_xet(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)


@pytest.fixture
def source(tmp_path) -> Path:
    return make_root(tmp_path / "src")


@pytest.fixture
def writable(tmp_path):
    (tmp_path / "mirror").mkdir()
    with running_mirror(tmp_path / "mirror", writable=True, token=TOKEN) as mirror:
        yield mirror


def test_upload_folder_publishes_a_corpus_that_downloads_identical_and_verifies(writable, source, tmp_path):
    api = HfApi(endpoint=writable.url, token=TOKEN)
    api.create_repo("team/copy", repo_type="dataset")
    (source / ".marin.lock").write_bytes(b"")  # hidden files are ignored, as a .gitignore would
    first = api.upload_folder(folder_path=source, repo_id="team/copy", repo_type="dataset")
    again = api.upload_folder(folder_path=source, repo_id="team/copy", repo_type="dataset")
    assert first.oid == again.oid == api.dataset_info("team/copy").sha  # nothing re-sent: same content, same id
    assert api.create_repo("team/copy", repo_type="dataset", exist_ok=True).repo_id == "team/copy"

    local = Path(snapshot_download("team/copy", repo_type="dataset", cache_dir=tmp_path / "dl",
                                   endpoint=writable.url))
    files = corpus_files(source)
    assert corpus_files(local) == files
    assert all(filecmp.cmp(source / f, local / f, shallow=False) for f in files)
    assert verify_corpus(local).ok
    assert not list((tmp_path / "mirror" / ".mirror-uploads").rglob("*.*"))  # staged objects were consumed
    assert not (tmp_path / "mirror" / "team/copy/.marin.lock").exists()


def test_create_commit_adds_regular_and_lfs_files_and_deletes(writable, source):
    api = HfApi(endpoint=writable.url, token=TOKEN)
    api.create_repo("team/ops", repo_type="dataset")
    shard = "data/a/part-00000.parquet"
    api.create_commit("team/ops", repo_type="dataset", commit_message="add", operations=[
        CommitOperationAdd("notes/hello.txt", b"hello\n"),
        CommitOperationAdd(shard, source / shard),
        CommitOperationAdd("copy.parquet", source / shard),  # same LFS object at a second path
    ])
    entries = {e.path: e for e in api.list_repo_tree("team/ops", repo_type="dataset", recursive=True)}
    assert entries["notes/hello.txt"].lfs is None and entries[shard].lfs is not None
    assert entries["copy.parquet"].lfs.sha256 == entries[shard].lfs.sha256
    api.create_commit("team/ops", repo_type="dataset", commit_message="rm", operations=[
        CommitOperationDelete("notes/hello.txt"), CommitOperationDelete("data/", is_folder=True)])
    assert [e.path for e in api.list_repo_tree("team/ops", repo_type="dataset", recursive=True)] == ["copy.parquet"]
    assert not (writable.app.repos.root / "team/ops/notes").exists()  # no empty folders left behind


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_writes_without_the_token_are_refused(writable, source, token):
    api = HfApi(endpoint=writable.url, token=token or False)
    with pytest.raises(HfHubHTTPError) as err:
        api.create_repo("team/x", repo_type="dataset")
    assert err.value.response.status_code == 401
    HfApi(endpoint=writable.url, token=TOKEN).create_repo("team/x", repo_type="dataset")
    with pytest.raises(HfHubHTTPError) as err:
        api.upload_folder(folder_path=source, repo_id="team/x", repo_type="dataset")
    assert err.value.response.status_code == 401
    assert list((writable.app.repos.root / "team/x").iterdir()) == []


def test_a_read_only_mirror_refuses_every_write(source, tmp_path):
    with running_mirror(source.parent.parent) as mirror:
        api = HfApi(endpoint=mirror.url, token=TOKEN)
        with pytest.raises(HfHubHTTPError) as err:
            api.create_repo("team/new", repo_type="dataset")
        assert err.value.response.status_code == 403
        with pytest.raises(HfHubHTTPError) as err:
            api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=REPO, repo_type="dataset")
        assert err.value.response.status_code == 403
    assert not (source.parent.parent / "team").exists() and not (source / "x.txt").exists()


def test_lfs_upload_urls_check_signature_size_and_sha256(writable, source):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    HfApi(endpoint=writable.url, token=TOKEN).create_repo("team/lfs", repo_type="dataset")
    data = (source / "data/a/part-00000.parquet").read_bytes()
    import hashlib

    oid = hashlib.sha256(data).hexdigest()
    batch = httpx2.post(f"{writable.url}/datasets/team/lfs.git/info/lfs/objects/batch", headers=auth,
                        json={"operation": "upload", "objects": [{"oid": oid, "size": len(data)}]}).json()
    href = batch["objects"][0]["actions"]["upload"]["href"]
    assert httpx2.put(href.replace("sig=", "sig=0"), content=data).status_code == 403  # forged signature
    assert httpx2.put(href, content=data[:-1] + b"!").status_code == 400  # wrong bytes
    assert httpx2.put(href, content=data + b"!").status_code == 400  # too many bytes
    commit = "\n".join(json.dumps(line) for line in [
        {"key": "header", "value": {"summary": "s"}},
        {"key": "lfsFile", "value": {"path": "x.parquet", "algo": "sha256", "oid": oid, "size": len(data)}}])
    url = f"{writable.url}/api/datasets/team/lfs/commit/main"
    refused = httpx2.post(url, headers=auth, content=commit)
    assert refused.status_code == 422 and "never uploaded" in refused.json()["error"]
    assert httpx2.put(href, content=data).status_code == 200
    assert httpx2.post(url, headers=auth, content=commit).status_code == 200
    assert (writable.app.repos.root / "team/lfs/x.parquet").read_bytes() == data


@pytest.mark.parametrize("path", ["../escape.txt", "a/../../escape.txt", "/abs.txt", ".git/config", "a//b"])
def test_commits_cannot_write_outside_the_repo_or_hidden_paths(writable, path):
    HfApi(endpoint=writable.url, token=TOKEN).create_repo("team/safe", repo_type="dataset")
    body = "\n".join(json.dumps(line) for line in [
        {"key": "header", "value": {"summary": "s"}},
        {"key": "file", "value": {"path": path, "content": "eA==", "encoding": "base64"}}])
    r = httpx2.post(f"{writable.url}/api/datasets/team/safe/commit/main",
                    headers={"Authorization": f"Bearer {TOKEN}"}, content=body)
    assert r.status_code == 400
    root = writable.app.repos.root
    assert [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()] == []


def test_the_xet_token_endpoint_tells_clients_to_use_lfs(writable):
    status, headers, body = raw_request(writable.url, "GET", "/api/datasets/team/any/xet-write-token/main")
    assert status == 501 and "HF_HUB_DISABLE_XET=1" in json.loads(body)["error"]
    assert not [k for k in headers if k.startswith("x-xet")]
