"""Publishing a new version over an old one is atomic for readers, on S3 (a real moto server) and on the Hub
(`marin-data serve` and the real huggingface_hub client): a publish killed at any upload or commit leaves a
reader pinned to the old manifest reading the old version, and an unpinned reader one whole version, also
over a copy the previous version of marin published; a copy caught half-published gets its own message."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path

import pytest
from huggingface_hub import CommitOperationDelete, HfApi, hf_hub_download
from s3_env import FAST, moto, run_cli, s3_client  # noqa: F401 - moto is a fixture
from shard_env import tiny_tokenizer, write_jsonl  # noqa: F401 - tiny_tokenizer is a fixture

import marin_data.transfer.publish_s3 as publish_s3
from marin_data.corpus.build import shard_subset
from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.verify import verify_corpus
from marin_data.errors import CorpusConflictError, ManifestHashMismatchError, PublishInProgressError
from marin_data.layout import BY_SHA256, MANIFEST, SHARDS_INDEX, SUMS
from marin_data.loader.remote.stream import open_remote_corpus
from marin_data.stores import open_store
from marin_data.stores.s3 import parse_s3_url
from marin_data.testing.local_s3 import create_bucket
from marin_data.testing.mirror import running_mirror
from marin_data.transfer.download import download
from marin_data.transfer.publish_hf import publish_hf
from marin_data.transfer.publish_s3 import publish
from marin_data.transfer.remote_corpus import remote_info, remote_show
from marin_data.transfer.remote_verify import verify_remote

TOKEN = "t0ken"


class Killed(BaseException):
    """The publishing process died here: nothing after it runs (not an error any handler catches)."""


TEXTS = {"prose": [f"document {i}: the quick brown fox jumps over the lazy dog {i} times" for i in range(30)],
         "code": [f"def f{i}(x):\n    return x + {i}\n" for i in range(12)]}


def shard(root: Path, subset: str, texts: list[str], tokenizer: Path) -> None:
    inputs = write_jsonl(root.parent / f"{root.name}-{subset}.jsonl",
                         [{"id": f"{subset}-{i}", "text": t} for i, t in enumerate(texts)])
    shard_subset([inputs], subset=subset, tokenizer=str(tokenizer), out=root, workers=1, shard_tokens=200)


@pytest.fixture(scope="module")
def versions(tmp_path_factory, tiny_tokenizer):  # noqa: F811
    """Two versions of one corpus: the second appends the subset ``code``; ``prose``'s shards are unchanged."""
    root = tmp_path_factory.mktemp("versions")
    shard(root / "v1", "prose", TEXTS["prose"], tiny_tokenizer)
    shutil.copytree(root / "v1", root / "v2")
    shard(root / "v2", "code", TEXTS["code"], tiny_tokenizer)
    v1, v2 = load_corpus(root / "v1"), load_corpus(root / "v2")
    assert len(v1.shards) > 1 and set(v1.shards) < set(v2.shards)
    assert v1.manifest_sha256 != v2.manifest_sha256
    return v1, v2


def fresh_url(moto) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    create_bucket(moto, name)
    return f"s3://{name}/corpus"


def forget_content_names(moto, url: str) -> None:
    """Make the copy at ``url`` what the previous version of marin published: the corpus layout alone."""
    bucket, prefix = parse_s3_url(url)
    client = s3_client(moto)
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/{BY_SHA256}/"):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=obj["Key"])


class DyingStore:
    """A store whose process dies before its ``n+1``-th put (and every later one); records the puts."""

    def __init__(self, store, n: float) -> None:
        self.store, self.n, self.puts = store, n, []

    def __getattr__(self, name):
        return getattr(self.store, name)

    def put(self, path, src, *, sha256, size):
        if len(self.puts) >= self.n:
            raise Killed(path)
        self.puts.append(path)
        self.store.put(path, src, sha256=sha256, size=size)


def publish_dying(root: Path, url: str, moto, monkeypatch, n: float) -> list[str]:
    """Publish ``root`` to ``url`` with one worker, dying after ``n`` puts; the puts done."""
    stores = []

    def dying_store(*args, **kwargs):
        stores.append(DyingStore(open_store(*args, **kwargs), n))
        return stores[-1]

    with monkeypatch.context() as m:
        m.setattr(publish_s3, "open_store", dying_store)
        try:
            publish(root, to=url, endpoint_url=moto, workers=1, policy=FAST)
        except Killed:
            pass
    return stores[0].puts


def read_every_way(url: str, old, new, tmp: Path, *, all_readers: bool = True, **options) -> str:
    """Read the copy at ``url`` as the readers do; return the manifest sha256 an unpinned reader got.
    Pinned to ``old``, a download gets ``old``; unpinned, one whole version. With ``all_readers`` also info,
    show and the loader's remote path, pinned and not."""
    pinned = download(url, subsets=["prose"], dest=tmp / "pinned", manifest_sha256=old.manifest_sha256,
                      policy=FAST, **options)
    assert pinned.ok and verify_corpus(tmp / "pinned").ok
    assert load_corpus(tmp / "pinned").manifest_sha256 == old.manifest_sha256
    unpinned = download(url, subsets=None, dest=tmp / "unpinned", policy=FAST, **options)
    assert unpinned.ok and verify_corpus(tmp / "unpinned").ok
    got = load_corpus(tmp / "unpinned").manifest_sha256
    assert got in (old.manifest_sha256, new.manifest_sha256)
    if all_readers:
        assert remote_info(url, **options).manifest_sha256 == got
        assert remote_info(url, manifest_sha256=old.manifest_sha256, **options).subsets.keys() == {"prose"}
        assert remote_show(url, subset="prose", n=1, **options)[0].text == TEXTS["prose"][0]  # its tokenizer
        store = open_store(url, **options)
        loaded = open_remote_corpus([store], meta_dir=tmp / "meta", manifest_sha256=old.manifest_sha256,
                                    policy=FAST)
        assert loaded.manifest_sha256 == old.manifest_sha256
        assert open_remote_corpus([store], meta_dir=tmp / "meta", policy=FAST).manifest_sha256 == got
    shutil.rmtree(tmp)
    return got


@pytest.mark.slow
@pytest.mark.parametrize("published_by", ["this version", "the previous version"])
def test_a_publish_killed_after_any_put_leaves_the_old_pin_and_one_whole_version(moto, versions, tmp_path,
                                                                                 monkeypatch, published_by):
    old, new = versions
    whole = publish_dying(new.root, fresh_url(moto), moto, monkeypatch, float("inf"))  # over nothing: a trace
    flip = whole.index(MANIFEST)
    assert flip < len(whole) - 1  # the plain names come after it
    for n in range(len(whole) + 8):  # the kept files of an older copy add puts: go on until a run completes
        url = fresh_url(moto)
        publish(old.root, to=url, endpoint_url=moto, policy=FAST)
        if published_by == "the previous version":
            forget_content_names(moto, url)
        puts = publish_dying(new.root, url, moto, monkeypatch, n)
        flipped = MANIFEST in puts
        around_the_flip = flipped != (MANIFEST in puts[:-1]) or (not flipped and len(puts) >= flip)
        got = read_every_way(url, old, new, tmp_path / f"read{n}", all_readers=around_the_flip, endpoint_url=moto)
        assert got == (new.manifest_sha256 if flipped else old.manifest_sha256), (n, puts)
        if len(puts) < n:  # this run was not killed: every point has been tried
            break
    else:
        pytest.fail("the publish never completed")
    assert verify_remote(new.root, url, endpoint_url=moto).ok
    stale = {p.path for p in verify_remote(old.root, url, endpoint_url=moto).problems}
    assert stale == {MANIFEST, SHARDS_INDEX, SUMS}  # the plain names serve the new version; its copies are whole


def half_publish_the_old_way(moto, old, new) -> str:
    """A copy the previous version of marin was publishing ``new`` over when it was killed: the index and
    SHA256SUMS already replaced, the manifest not yet."""
    url = fresh_url(moto)
    publish(old.root, to=url, endpoint_url=moto, policy=FAST)
    forget_content_names(moto, url)
    bucket, prefix = parse_s3_url(url)
    for name in (SHARDS_INDEX, SUMS):
        s3_client(moto).put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=(new.root / name).read_bytes())
    return url


def test_a_half_published_copy_says_so_and_exits_20(moto, versions, tmp_path):
    old, new = versions
    url = half_publish_the_old_way(moto, old, new)
    with pytest.raises(PublishInProgressError, match="shards.parquet is not the one manifest.json lists"):
        download(url, subsets=None, dest=tmp_path / "dl", policy=FAST, endpoint_url=moto)
    assert not (tmp_path / "dl" / MANIFEST).exists()
    for command in (["download", url, "--subset", "prose", "--to", str(tmp_path / "cli")], ["info", url]):
        out = run_cli(*command, "--endpoint-url", moto)
        assert out.returncode == 25, out.stderr
        assert "being published" in out.stderr and "--mirror" in out.stderr and "credentials" not in out.stderr
    publish(new.root, to=url, endpoint_url=moto, policy=FAST)  # the next publish finishes it
    assert download(url, subsets=None, dest=tmp_path / "after", policy=FAST, endpoint_url=moto).ok


def test_a_pin_the_store_keeps_no_manifest_of_is_refused_naming_where_it_looked(moto, versions, tmp_path):
    old, new = versions
    url = fresh_url(moto)
    publish(new.root, to=url, endpoint_url=moto, policy=FAST)
    with pytest.raises(ManifestHashMismatchError, match=f"keeps no manifest of that digest.*{BY_SHA256}"):
        download(url, subsets=None, dest=tmp_path / "dl", manifest_sha256=old.manifest_sha256, policy=FAST,
                 endpoint_url=moto)


def test_a_shard_rewritten_under_the_same_path_is_refused_before_anything_is_sent(moto, versions, tmp_path,
                                                                                 tiny_tokenizer):  # noqa: F811
    old, _ = versions
    shard(tmp_path / "other", "prose", [t.upper() for t in TEXTS["prose"]], tiny_tokenizer)  # same paths, other bytes
    other = load_corpus(tmp_path / "other")
    url = fresh_url(moto)
    publish(old.root, to=url, endpoint_url=moto, policy=FAST)
    bucket, prefix = parse_s3_url(url)
    before = s3_client(moto).list_objects_v2(Bucket=bucket, Prefix=prefix)["KeyCount"]
    with pytest.raises(CorpusConflictError, match="data/prose/part-0000.\\.parquet.*readers of that version"):
        publish(other.root, to=url, endpoint_url=moto, policy=FAST)
    assert s3_client(moto).list_objects_v2(Bucket=bucket, Prefix=prefix)["KeyCount"] == before
    assert load_corpus(download(url, subsets=None, dest=tmp_path / "dl", policy=FAST, endpoint_url=moto).dest
                       ).manifest_sha256 == old.manifest_sha256


# --- the Hub ---------------------------------------------------------------------------------------------


def hub_reads_one_version(mirror, repo: str, cache: Path) -> str:
    """What the huggingface_hub client reads at ``main``: the manifest and the index it lists agree."""
    files = {name: Path(hf_hub_download(repo, name, repo_type="dataset", endpoint=mirror.url, cache_dir=cache))
             for name in (MANIFEST, SHARDS_INDEX)}
    manifest = json.loads(files[MANIFEST].read_bytes())
    assert hashlib.sha256(files[SHARDS_INDEX].read_bytes()).hexdigest() == manifest["files"][SHARDS_INDEX]["sha256"]
    return hashlib.sha256(files[MANIFEST].read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("published_by", ["this version", "the previous version"])
def test_a_hub_publish_killed_after_any_commit_leaves_the_old_pin_and_one_whole_version(versions, tmp_path,
                                                                                       monkeypatch, published_by):
    old, new = versions
    (tmp_path / "mirror").mkdir()
    commit = HfApi.create_commit
    with running_mirror(tmp_path / "mirror", writable=True, token=TOKEN) as mirror:
        api = HfApi(endpoint=mirror.url, token=TOKEN)
        for n in range(12):
            repo = f"team/v{n}"
            publish_hf(old.root, to=f"hf://datasets/{repo}", endpoint=mirror.url, token=TOKEN, progress=False)
            if published_by == "the previous version":
                api.create_commit(repo, [CommitOperationDelete(f.path) for f in api.list_repo_tree(
                    repo, BY_SHA256, repo_type="dataset", recursive=True) if hasattr(f, "size")],
                    repo_type="dataset", commit_message="the layout of the previous version")
            done = []

            def dying_commit(self, *args, **kwargs):
                if len(done) >= n:  # noqa: B023 - this attempt's
                    raise Killed("commit")
                done.append(1)  # noqa: B023
                return commit(self, *args, **kwargs)

            monkeypatch.setattr(HfApi, "create_commit", dying_commit)
            try:
                publish_hf(new.root, to=f"hf://datasets/{repo}", endpoint=mirror.url, token=TOKEN, commit_files=2,
                           progress=False)
                completed = True
            except Killed:
                completed = False
            monkeypatch.setattr(HfApi, "create_commit", commit)
            got = read_every_way(f"hf://datasets/{repo}", old, new, tmp_path / f"read{n}", endpoint=mirror.url)
            assert hub_reads_one_version(mirror, repo, tmp_path / f"hub{n}") == got
            root = {old.manifest_sha256: old.root, new.manifest_sha256: new.root}[got]
            assert verify_remote(root, f"hf://datasets/{repo}", endpoint=mirror.url).ok  # the mirror's ids agree
            if completed:
                assert got == new.manifest_sha256
                break
        else:
            pytest.fail("the publish never completed")


def test_the_mirror_lends_a_shard_index_its_hashes_only_when_it_is_the_one_the_manifest_lists(versions, tmp_path):
    """A repo folder caught between two versions (its index of another version than its manifest, one that
    claims other bytes for a shard) is served with the shard's true LFS sha256, not the index's claim."""
    from marin_data.corpus.index import write_shard_index

    old, _ = versions
    repo = tmp_path / "mirror" / "team" / "between"
    shutil.copytree(old.root, repo)
    claimed = [s._replace(sha256="0" * 64) for s in old.shards]
    write_shard_index(repo / SHARDS_INDEX, claimed)
    with running_mirror(tmp_path / "mirror") as mirror:
        tree = HfApi(endpoint=mirror.url).list_repo_tree("team/between", repo_type="dataset", recursive=True)
        served = {e.path: e.lfs.sha256 for e in tree if getattr(e, "lfs", None)}
    assert {s.path: served[s.path] for s in old.shards} == {s.path: s.sha256 for s in old.shards}
