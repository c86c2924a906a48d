"""A Levanter store pinned in place by ``adopt`` is a corpus: every Levanter file byte-identical, verify
(hashes + structure), publish to S3 (moto on loopback) and to the Hub (our mirror, driven by the real
``huggingface_hub`` client), pinned ``download --subset 'cluster=*/quality=4'``, ``serve`` and ``info``; and
the commands that need no pin (``info``, ``show --tokenizer``, ``verify``) on an unpinned store read
locally, over ``s3://`` and over ``hf://``. The datasheet of a pinned store goes beside it, stating its manifest."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from levanter_env import BOS, VOCAB, make_cache, make_store
from s3_env import bucket_url, moto, s3_client  # noqa: F401
from shard_env import tiny_tokenizer, tree_bytes  # noqa: F401
from test_datasheet import md_tables, num
from test_datasheet_levanter import CELLS as CELLS_TABLE

from marin_data.corpus.manifest import load_corpus
from marin_data.levanter.pinned import LEVANTER_CACHE, LEVANTER_STORE
from marin_data.corpus.records import META, OFFSETS, SHARD
from marin_data.corpus.verify import ProblemKind, verify_corpus
from marin_data.errors import CacheCheckError, CacheUnfinishedError, CorpusConflictError
from marin_data.layout import DATASHEET, FIGURES, HEATMAP
from marin_data.levanter.adopt import adopt
from marin_data.levanter.verify import verify_source
from marin_data.testing.mirror import running_mirror
from marin_data.transfer.download import download
from marin_data.transfer.publish_hf import publish_hf
from marin_data.transfer.publish_s3 import publish

CELLS = {"cluster=0/quality=0": 40, "cluster=0/quality=4": 50, "cluster=1/quality=4": 30, "cluster=1/quality=2": 70}
TOKEN = "t"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marin_data", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def store(tmp_path) -> Path:
    make_store(tmp_path / "store", {k: v for k, v in CELLS.items() if k != "cluster=1/quality=4"})
    make_cache(tmp_path / "store/cluster=1/quality=4", 30, seed=9, layout="sharded", parts=2, dtype="int64",
               stats=True)  # a sharded, int64 cell among consolidated int32 ones
    return tmp_path / "store"


@pytest.fixture
def pinned(store, tiny_tokenizer) -> Path:
    before = tree_bytes(store)
    report = adopt(store, tokenizer=str(tiny_tokenizer), name="marin-store")
    after = tree_bytes(store)
    assert {k: v for k, v in after.items() if k in before} == before  # every Levanter file byte-identical
    assert set(after) - set(before) == {"manifest.json", "shards.parquet", "SHA256SUMS", "tokenizer.json",
                                        "README.md", "croissant.json"}  # no lock file left
    assert report.subsets == tuple(sorted(CELLS))
    return store


def test_adopt_lists_every_file_of_each_cell_under_its_subset(pinned):
    corpus = load_corpus(pinned)
    assert corpus.manifest.format == LEVANTER_STORE
    rows = {s.path: s for s in corpus.shards}
    files = {p for p in tree_bytes(pinned) if p.startswith("cluster=")}
    assert set(rows) == files
    cell = "cluster=1/quality=4"
    kinds = {s.path[len(cell) + 1:]: s.kind for s in corpus.shards if s.subset == cell}
    assert kinds["part-00000-of-00002/input_ids/data/c/0"] == SHARD
    assert kinds["part-00001-of-00002/input_ids/offsets/c/0"] == OFFSETS
    assert kinds["part-00001-of-00002/.success"] == kinds["shard_ledger.json"] == kinds[".stats.json"] == META
    for name, info in corpus.manifest.subsets.items():  # documents and tokens add up over the data chunk files
        shards = [s for s in corpus.shards if s.subset == name and s.kind == SHARD]
        assert info.docs == (30 if name == cell else CELLS[name]) == sum(s.docs for s in shards)
        assert info.shards == len(shards) > 1 and info.tokens == sum(s.tokens for s in shards)
    assert verify_corpus(pinned).ok
    assert cli("info", pinned).returncode == 0
    done = cli("show", pinned, "--subset", "cluster=1/quality=4", "--row", 29, "--json")  # its own tokenizer
    assert done.returncode == 0 and json.loads(done.stdout)["id"] == "cluster=1/quality=4:29", done.stderr
    sums = subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=pinned, capture_output=True, text=True)
    assert sums.returncode == 0, sums.stdout  # coreutils alone checks every Levanter file


def test_verify_on_a_pinned_store_hashes_and_checks_structure(pinned):
    assert verify_source(pinned, tokens=True, expect_bos=BOS).ok
    done = cli("verify", pinned, "--subset", "cluster=*/quality=4", "--expect-bos", BOS)
    assert done.returncode == 0, done.stderr
    chunk = pinned / "cluster=0/quality=4/input_ids/data/c/1"
    data = bytearray(chunk.read_bytes())
    data[3] ^= 1
    chunk.write_bytes(bytes(data))
    found = {(p.path, p.kind) for p in verify_source(pinned).problems}
    assert ("cluster=0/quality=4/input_ids/data/c/1", ProblemKind.MODIFIED) in found
    done = cli("verify", pinned)
    assert done.returncode == 1 and "cluster=0/quality=4/input_ids/data/c/1" in done.stdout
    (pinned / "cluster=1/quality=4/extra").write_bytes(b"x")  # a file nothing lists, in a chosen cell
    found = {(p.path, p.kind) for p in verify_source(pinned, subsets=["cluster=1/*"]).problems}
    assert found == {("cluster=1/quality=4/extra", ProblemKind.UNLISTED)}


def test_adopt_refuses_a_defective_cache_and_writes_nothing(store, tiny_tokenizer):
    (store / "cluster=1/quality=4/part-00001-of-00002/.success").unlink()
    before = tree_bytes(store)
    with pytest.raises(CacheUnfinishedError, match=r"\.success"):
        adopt(store, tokenizer=str(tiny_tokenizer))
    ledger = store / "cluster=0/quality=0/shard_ledger.json"
    ledger.write_text(json.dumps({**json.loads(ledger.read_text()), "total_num_rows": 1}))
    (store / "cluster=1/quality=4/part-00001-of-00002/.success").write_bytes(b"")
    with pytest.raises(CacheCheckError, match="offsets"):
        adopt(store, tokenizer=str(tiny_tokenizer))
    assert set(tree_bytes(store)) == set(before) | {"cluster=1/quality=4/part-00001-of-00002/.success"}
    done = cli("adopt", store, "--tokenizer", tiny_tokenizer)
    assert done.returncode == 21 and "cluster=0/quality=0" in done.stderr


def test_a_single_cache_is_one_subset_at_the_corpus_root(tmp_path, tiny_tokenizer):
    make_cache(tmp_path / "train", 80, dtype="int64")
    done = cli("show", tmp_path / "train", "--tokenizer", tiny_tokenizer, "--row", 79, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["id"] == "79"
    assert cli("show", tmp_path / "train", "-n", 1).returncode == 2  # a cache carries no tokenizer
    done = cli("adopt", tmp_path / "train", "--tokenizer", tiny_tokenizer, "--name", "fineweb-10M")
    assert done.returncode == 0, done.stderr
    corpus = load_corpus(tmp_path / "train")
    assert (corpus.manifest.format, list(corpus.manifest.subsets)) == (LEVANTER_CACHE, ["fineweb-10M"])
    assert {s.path for s in corpus.shards} >= {"shard_ledger.json", "input_ids/data/c/0"}
    assert verify_source(tmp_path / "train", tokens=True).ok
    with pytest.raises(CorpusConflictError):
        adopt(tmp_path / "train", tokenizer=str(tiny_tokenizer))
    make_store(tmp_path / "repo", {"train": 10})
    (tmp_path / "repo/README.md").write_text("a Hub repo's own card")
    assert verify_source(tmp_path / "repo").ok  # the card of a repo of caches is no stray file
    with pytest.raises(CorpusConflictError, match="README.md already there"):
        adopt(tmp_path / "repo", tokenizer=str(tiny_tokenizer))
    assert (tmp_path / "repo/README.md").read_text() == "a Hub repo's own card"


def test_publish_to_s3_and_download_a_glob_of_cells_pinned(pinned, moto, bucket_url, tmp_path):
    digest = load_corpus(pinned).manifest_sha256
    publish(pinned, to=bucket_url, endpoint_url=moto)
    dest = tmp_path / "dl"
    report = download(bucket_url, subsets=["cluster=*/quality=4"], dest=dest, manifest_sha256=digest,
                      endpoint_url=moto, progress=False)
    assert report.ok
    got = {p for p in tree_bytes(dest) if p.startswith("cluster=")}
    want = {p for p in tree_bytes(pinned) if p.startswith(("cluster=0/quality=4/", "cluster=1/quality=4/"))}
    assert got == want
    assert verify_source(dest, tokens=True, expect_bos=BOS).ok  # the downloaded cells are whole caches
    done = cli("info", bucket_url, "--endpoint-url", moto, "--manifest-sha256", digest)
    assert done.returncode == 0 and "cluster=1/quality=4" in done.stdout


def test_publish_to_the_hub_serve_and_download_through_huggingface_hub(pinned, tmp_path):
    from huggingface_hub import HfApi

    (tmp_path / "mirror").mkdir()
    with running_mirror(tmp_path / "mirror", writable=True, token=TOKEN) as mirror:
        publish_hf(pinned, to="hf://datasets/team/store", endpoint=mirror.url, token=TOKEN, progress=False)
        sub = "cluster=1/quality=4/part-00001-of-00002/.success"
        api = HfApi(endpoint=mirror.url, token=TOKEN)
        files = set(api.list_repo_files("team/store", repo_type="dataset"))
        assert sub in files and "cluster=0/quality=4/input_ids/data/c/1" in files
        got = api.hf_hub_download("team/store", "cluster=0/quality=4/input_ids/data/c/1", repo_type="dataset",
                                  cache_dir=tmp_path / "hub")
        assert Path(got).read_bytes() == (pinned / "cluster=0/quality=4/input_ids/data/c/1").read_bytes()
        dest = tmp_path / "dl"
        assert download("hf://datasets/team/store", subsets=["cluster=1/quality=4"], dest=dest, endpoint=mirror.url,
                        progress=False).ok
        assert verify_source(dest).ok and (dest / sub).exists()


@pytest.mark.slow  # nine CLI processes against three stores
def test_info_show_and_verify_an_unpinned_store_over_s3_and_the_hub(store, moto, bucket_url, tiny_tokenizer,
                                                                   tmp_path):
    bucket, prefix = bucket_url[len("s3://"):].split("/", 1)
    client = s3_client(moto)
    for rel in tree_bytes(store):
        client.upload_file(str(store / rel), bucket, f"{prefix}/{rel}")
    (tmp_path / "mirror/team").mkdir(parents=True)
    shutil.copytree(store, tmp_path / "mirror/team/raw")
    with running_mirror(tmp_path / "mirror") as mirror:
        for url, flags in ((store, ()), (bucket_url, ("--endpoint-url", moto)),
                           ("hf://datasets/team/raw", ("--endpoint", mirror.url))):
            done = cli("info", url, *flags, "--json")
            assert done.returncode == 0, done.stderr
            info = json.loads(done.stdout)
            assert info["kind"] == "store" and info["subsets"]["cluster=0/quality=4"]["docs"] == 50
            done = cli("show", url, *flags, "--subset", "cluster=1/quality=4", "--tokenizer", tiny_tokenizer, "-n",
                       "2", "--json")
            assert done.returncode == 0, done.stderr
            assert [json.loads(x)["id"] for x in done.stdout.splitlines()] == ["cluster=1/quality=4:0",
                                                                               "cluster=1/quality=4:1"]
            done = cli("verify", url, *flags, "--deep", "--tokenizer", tiny_tokenizer, "--expect-bos", BOS)
            assert done.returncode == 0, done.stdout + done.stderr
        client.delete_object(Bucket=bucket, Key=f"{prefix}/cluster=0/quality=4/input_ids/offsets/zarr.json")
        done = cli("verify", bucket_url, "--endpoint-url", moto)
        assert done.returncode == 1 and "cluster=0/quality=4/input_ids/offsets/zarr.json" in done.stdout
    assert VOCAB == 400


def test_a_parquet_corpus_is_written_without_the_new_fields(make_corpus):
    """Existing corpora keep their manifest bytes (and so their pinned sha256): `format` and the index's
    `kind` column are written only when not the default."""
    import pyarrow.parquet as pq

    corpus = make_corpus({"a": [5, 5]})
    assert "format" not in json.loads((corpus.root / "manifest.json").read_bytes())
    assert "kind" not in pq.read_schema(corpus.root / "shards.parquet").names
    assert {s.kind for s in corpus.shards} == {SHARD}


def test_the_datasheet_of_a_pinned_store_is_written_beside_it_stating_its_manifest(pinned, tiny_tokenizer):
    before = {p: b for p, b in tree_bytes(pinned).items() if p.startswith("cluster=")}
    assert cli("datasheet", pinned, "--tokenizer", tiny_tokenizer).returncode == 2  # it has its own
    done = cli("datasheet", pinned)
    assert done.returncode == 0, done.stderr
    corpus = load_corpus(pinned)
    text = (pinned / DATASHEET).read_text()
    assert f"Manifest sha256 `{corpus.manifest_sha256}`" in text and corpus.manifest_sha256 in done.stdout
    assert corpus.manifest_sha256 == hashlib.sha256((pinned / "manifest.json").read_bytes()).hexdigest()
    assert {"README.md", "croissant.json", *FIGURES, HEATMAP} <= set(corpus.manifest.files)
    rows = {r[0].strip("`"): r for r in md_tables(text)[CELLS_TABLE]}
    for name, info in corpus.manifest.subsets.items():  # the table is the manifest's, checked against the ledgers
        assert [num(c) for c in rows[name][1:5]] == [info.docs, info.tokens, info.bytes, info.shards]
    assert rows["cluster=1/quality=4"][6:9] == ["sharded", "int64", "blosc lz4 clevel 5"]
    assert verify_source(pinned).ok  # the generated files are listed, the datasheet is the one unlisted file
    assert {p: b for p, b in tree_bytes(pinned).items() if p.startswith("cluster=")} == before
    again = cli("datasheet", pinned)
    assert again.returncode == 0 and "wrote" not in again.stdout  # re-running changes nothing
