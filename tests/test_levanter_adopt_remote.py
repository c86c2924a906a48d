"""``adopt`` of a Levanter store where it lives: a store in a bucket (moto on loopback) pinned to another prefix
or a local folder, leaving every key and ETag under the data's prefix as it was and giving every file the
SHA-256 a local adopt gives it; ``download PIN`` fetching the data from where it lives, checked against the
pin (a byte flipped in the bucket later fails it); a run killed after some files, run again, hashing only the
rest into the same pin; a later run adding cells; Ray's pin byte-identical to the local engine's; a store's
digest that the bytes contradict refused; hostile listings (keys outside the prefix, sizes missing or wrong,
pages that loop, go backwards or change between calls) answered as download answers them, or, where adopt's
one listing tells more, otherwise (`HOSTILE`); an hf:// source read
through our Hub mirror."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hostile import HostileServer
from levanter_env import make_store
from s3_env import FAST, bucket_url, moto, run_cli, s3_client  # noqa: F401 - fixtures
from shard_env import tiny_tokenizer, tree_bytes  # noqa: F401 - a fixture

from marin_data.errors import RemoteError, StoreDigestMismatchError
from marin_data.formats import open_source
from marin_data.layout import ADOPT_JOURNAL, MANIFEST, VOUCHED
from marin_data.levanter import adopt_remote
from marin_data.levanter.adopt import adopt
from marin_data.levanter.adopt_remote import adopt_store
from marin_data.retry import RetryPolicy
from marin_data.transfer import remote_verify
from marin_data.testing.mirror import running_mirror

CELLS = {"cluster=0/quality=1": 150, "cluster=1/quality=4": 120, "cluster=2/quality=4": 90}
PIN_FILES = {"manifest.json", "shards.parquet", "SHA256SUMS", "tokenizer.json", "README.md", "croissant.json",
             "vouched.json"}


@pytest.fixture(scope="session")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("remote-adopt") / "store"
    make_store(root, CELLS)
    return root


@pytest.fixture(scope="session")
def local_rows(store, tiny_tokenizer, tmp_path_factory) -> dict[str, str]:
    """path -> SHA-256 of every file, as a local adopt of a copy of the store pins it."""
    copy = tmp_path_factory.mktemp("local-adopt") / "store"
    shutil.copytree(store, copy)
    adopt(copy, tokenizer=str(tiny_tokenizer))
    return {line.split("  ")[1]: line.split("  ")[0] for line in (copy / "SHA256SUMS").read_text().splitlines()
            if line.split("  ")[1].startswith("cluster=")}


def upload(root: Path, moto: str, url: str) -> None:  # noqa: F811
    bucket, prefix = url[len("s3://"):].split("/", 1)
    client = s3_client(moto)
    for rel in tree_bytes(root):
        client.upload_file(str(root / rel), bucket, f"{prefix}/{rel}")


def keys(moto: str, url: str) -> dict[str, str]:  # noqa: F811
    """key -> ETag of every object under ``url``."""
    bucket, prefix = url[len("s3://"):].split("/", 1)
    pages = s3_client(moto).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def pinned_sums(text: str) -> dict[str, str]:
    return {line.split("  ")[1]: line.split("  ")[0] for line in text.splitlines()}


def test_a_bucket_pinned_to_another_prefix_is_untouched_and_downloads_from_where_it_lives(
        store, local_rows, tiny_tokenizer, moto, bucket_url, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MARIN_RETRY_WAIT", "0.01")  # the flipped byte below fails its retries at once
    upload(store, moto, bucket_url)
    pin = bucket_url.rsplit("/", 1)[0] + "/pin"
    before = keys(moto, bucket_url)
    done = run_cli("adopt", bucket_url, "--tokenizer", str(tiny_tokenizer), "--pin-to", pin, "--endpoint-url", moto,
                   "--work-dir", str(tmp_path / "work"))
    assert done.returncode == 0, done.stderr
    assert f"its data: {bucket_url}" in done.stdout and "24 checked against the source, 24 by md5" in done.stdout
    assert keys(moto, bucket_url) == before  # no lock, marker or temporary object under the data's prefix
    assert {k.split("/", 1)[1] for k in keys(moto, pin)} == PIN_FILES
    client, bucket = s3_client(moto), bucket_url[len("s3://"):].split("/")[0]
    sums = client.get_object(Bucket=bucket, Key="pin/SHA256SUMS")["Body"].read().decode()
    assert {p: d for p, d in pinned_sums(sums).items() if p.startswith("cluster=")} == local_rows
    manifest = json.loads(client.get_object(Bucket=bucket, Key="pin/manifest.json")["Body"].read())
    assert manifest["data"] == bucket_url and manifest["format"] == "levanter-store"
    vouched = json.loads(client.get_object(Bucket=bucket, Key=f"pin/{VOUCHED}")["Body"].read())
    assert vouched["source"] == bucket_url and {v["checked"] for v in vouched["files"].values()} == {"md5"}

    got = run_cli("download", pin, "--subset", "cluster=*/quality=4", "--to", str(tmp_path / "d"), "--endpoint-url",
                  moto)
    assert got.returncode == 0, got.stderr
    fetched = {k: v for k, v in tree_bytes(tmp_path / "d").items() if k.startswith("cluster=")}
    assert fetched == {k: v for k, v in tree_bytes(store).items() if k.startswith(("cluster=1/", "cluster=2/"))}

    assert open_source(pin, endpoint_url=moto).verify_remote(deep=True).ok

    victim = "cluster=1/quality=4/input_ids/data/c/0"
    data = bytearray((store / victim).read_bytes())
    data[10] ^= 0xFF  # a byte flipped in the bucket after pinning: same size, other bytes
    client.put_object(Bucket=bucket, Key=f"corpus/{victim}", Body=bytes(data))
    got = run_cli("download", pin, "--subset", "cluster=1/*", "--to", str(tmp_path / "d2"), "--endpoint-url", moto)
    assert got.returncode == 1 and victim in got.stderr, got.stderr
    deep = open_source(pin, endpoint_url=moto).verify_remote(deep=True)  # the bytes re-hashed where they live
    assert [p.path for p in deep.problems] == [victim]


def test_a_pin_in_a_local_folder_names_the_bucket_and_download_and_verify_take_it_from_there(
        store, local_rows, tiny_tokenizer, moto, bucket_url, tmp_path):  # noqa: F811
    upload(store, moto, bucket_url)
    report = adopt_store(bucket_url, tokenizer=str(tiny_tokenizer), pin_to=str(tmp_path / "pin"),
                         subsets=["cluster=1/*"], endpoint_url=moto)
    assert report.subsets == ("cluster=1/quality=4",) and report.data == bucket_url
    assert set(tree_bytes(tmp_path / "pin")) == PIN_FILES  # no journal or lock left
    sums = pinned_sums((tmp_path / "pin/SHA256SUMS").read_text())
    assert {p: d for p, d in sums.items() if p.startswith("cluster=")} == \
        {p: d for p, d in local_rows.items() if p.startswith("cluster=1/")}
    got = run_cli("download", str(tmp_path / "pin"), "--to", str(tmp_path / "d"), "--endpoint-url", moto)
    assert got.returncode == 0, got.stderr
    got = run_cli("verify", str(tmp_path / "pin"))
    assert got.returncode == 2 and "--remote" in got.stderr and bucket_url in got.stderr
    pinned = open_source(tmp_path / "pin", endpoint_url=moto)
    assert pinned.verify_remote(deep=True).ok  # the shards re-hashed where the data lives
    # uploaded by another tool, the bucket states only MD5s, which no local file here can stand in for
    assert {p.kind.value for p in pinned.verify_remote().problems} == {"unreadable"}
    shards = pinned.verify_remote(bucket_url, options={"endpoint_url": moto}, deep=True)  # the data's URL: shards
    assert shards.ok and shards.files_checked == sum(p.startswith("cluster=1/") for p in sums)


def test_a_killed_run_rerun_hashes_only_the_unfinished_files_and_a_later_run_adds_cells(
        store, tiny_tokenizer, moto, bucket_url, tmp_path, monkeypatch):  # noqa: F811
    upload(store, moto, bucket_url)
    whole = adopt_store(bucket_url, tokenizer=str(tiny_tokenizer), pin_to=str(tmp_path / "whole"),
                        endpoint_url=moto, policy=FAST)
    real, calls = adopt_remote.hash_file, []

    def dies_after_six(job):
        calls.append(job.info.path)
        if len(calls) > 6:
            raise KeyboardInterrupt("killed")
        return real(job)

    monkeypatch.setattr(adopt_remote, "hash_file", dies_after_six)
    pin = tmp_path / "pin"
    with pytest.raises(KeyboardInterrupt):
        adopt_store(bucket_url, tokenizer=str(tiny_tokenizer), pin_to=str(pin), subsets=["cluster=0/*",
                    "cluster=1/*"], endpoint_url=moto, policy=FAST, workers=2)
    assert not (pin / MANIFEST).exists()
    journaled = len((pin / ADOPT_JOURNAL).read_text().splitlines()) - 1
    assert 0 < journaled <= 6

    monkeypatch.setattr(adopt_remote, "hash_file", lambda job: (calls.append(job.info.path), real(job))[1])
    calls.clear()
    first = adopt_store(bucket_url, tokenizer=str(tiny_tokenizer), pin_to=str(pin), subsets=["cluster=0/*",
                        "cluster=1/*"], endpoint_url=moto, policy=FAST)
    assert first.reused == journaled and len(calls) == first.files - journaled
    calls.clear()
    added = adopt_store(bucket_url, tokenizer=str(tiny_tokenizer), pin_to=str(pin), subsets=["cluster=2/*"],
                        endpoint_url=moto, policy=FAST)
    assert added.reused == first.files and all(p.startswith("cluster=2/") for p in calls)
    assert added.manifest_sha256 == whole.manifest_sha256  # the same pin as one uninterrupted run's
    assert tree_bytes(pin) == tree_bytes(tmp_path / "whole")

    bucket = bucket_url[len("s3://"):].split("/")[0]
    s3_client(moto).put_object(Bucket=bucket, Key="corpus/cluster=0/quality=1/shard_ledger.json", Body=b"{}")
    with pytest.raises(StoreDigestMismatchError, match="changed since it was pinned"):
        adopt_store(bucket_url, tokenizer=str(tiny_tokenizer), pin_to=str(pin), endpoint_url=moto, policy=FAST)
    assert tree_bytes(pin) == tree_bytes(tmp_path / "whole")


def test_ray_gives_the_local_engines_pin(store, tiny_tokenizer, moto, bucket_url, tmp_path):  # noqa: F811
    pytest.importorskip("ray")
    upload(store, moto, bucket_url)
    local = adopt_store(bucket_url, tokenizer=str(tiny_tokenizer), pin_to=str(tmp_path / "local"), endpoint_url=moto)
    ray = adopt_store(bucket_url, tokenizer=str(tiny_tokenizer), pin_to=str(tmp_path / "ray"), endpoint_url=moto,
                      engine="ray", workers=2)
    assert ray.manifest_sha256 == local.manifest_sha256
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")


def test_bytes_that_contradict_the_stores_own_digest_are_refused_and_nothing_is_pinned(
        store, tiny_tokenizer, moto, bucket_url, tmp_path):  # noqa: F811
    upload(store, moto, bucket_url)
    bucket = bucket_url[len("s3://"):].split("/")[0]
    victim = "cluster=2/quality=4/input_ids/data/c/0"
    wrong = "0" * 64  # our sha256 metadata, which a store without ChecksumSHA256 answers on HEAD
    s3_client(moto).put_object(Bucket=bucket, Key=f"corpus/{victim}", Body=(store / victim).read_bytes(),
                               ChecksumAlgorithm="CRC32", Metadata={"sha256": wrong})
    with pytest.raises(StoreDigestMismatchError) as info:
        adopt_store(bucket_url, tokenizer=str(tiny_tokenizer), pin_to=str(tmp_path / "pin"), endpoint_url=moto,
                    policy=FAST)
    assert victim in info.value.path and info.value.expected == wrong and wrong in info.value.message
    assert not (tmp_path / "pin" / MANIFEST).exists()


@pytest.fixture(scope="module")
def hostile(store):
    with HostileServer(store) as srv:
        yield srv


HOSTILE_CELL = "cluster=1/quality=4"
# how the listing lies -> (download's exit code, adopt's). Adopt answers otherwise where its one listing makes
# it more precise for a pin: pages that change between calls cannot change its tree (it pins the tree its one
# listing showed, as an honest listing gives it), and a file whose bytes are not the size listed is a file it
# cannot vouch for (19, "changed while it was read"), where download reports a failed file or copy (1).
HOSTILE = {"outside-the-prefix": (8, 8), "no-size": (8, 8), "pages-that-loop": (23, 23), "keys-backwards": (0, 0),
           "second-page-changes": (19, 0), "ledger-listed-longer": (1, 19), "chunk-listed-shorter": (1, 19)}


def lie(srv: HostileServer, how: str) -> None:
    srv.prefix, srv.page_keys, srv.pages, srv.listed_sizes = "corpus", 5, None, {}
    grown = {"ledger-listed-longer": ("shard_ledger.json", 3), "chunk-listed-shorter": ("input_ids/data/c/0", -3)}
    if how in grown:
        path = f"{HOSTILE_CELL}/{grown[how][0]}"
        srv.listed_sizes = {path: str(len(srv.files[path]) + grown[how][1])}
    elif how == "no-size":
        srv.listed_sizes = {f"{HOSTILE_CELL}/input_ids/offsets/zarr.json": None}
    elif how == "outside-the-prefix":
        srv.prefix = "corpusx"  # every key listed now lies outside "corpus/"
    elif how != "honest":
        srv.pages = {"pages-that-loop": "loop", "keys-backwards": "backwards", "second-page-changes": "changes"}[how]
    srv.listings = 0


def cli(capsys, *argv: str) -> tuple[int, str]:
    """``marin-data ARGV`` in this process, through the entry point's error table: (exit code, stderr)."""
    from marin_data.cli import main

    with pytest.raises(SystemExit) as done:
        main(list(argv))
    return done.value.code, capsys.readouterr().err


@pytest.mark.parametrize("how", HOSTILE)
def test_hostile_listings_get_downloads_answers(hostile, local_rows, tiny_tokenizer, how, tmp_path, capsys,
                                                monkeypatch):
    monkeypatch.setattr(RetryPolicy, "wait", lambda self, retry, exc: 0.0)  # download's retries, without waits
    monkeypatch.setenv("MARIN_LIST_MAX_BYTES", str(1 << 20))  # a looping listing ends after 16 pages
    got = []
    for command in (["download", "--subset", HOSTILE_CELL, "--to", str(tmp_path / "d")],
                    ["adopt", "--subset", HOSTILE_CELL, "--tokenizer", str(tiny_tokenizer), "--pin-to",
                     str(tmp_path / "pin")]):
        lie(hostile, how)
        code, err = cli(capsys, command[0], *hostile.store_args("s3"), *command[1:])
        assert "Traceback" not in err and (code == 0 or "error: " in err), err
        got.append(code)
    lie(hostile, "honest")
    assert tuple(got) == HOSTILE[how]
    assert (tmp_path / "pin" / MANIFEST).exists() == (got[1] == 0)
    if got[1] == 0:  # the pin of the tree as an honest listing gives it
        sums = pinned_sums((tmp_path / "pin/SHA256SUMS").read_text())
        assert {p: d for p, d in sums.items() if p.startswith("cluster=")} == \
            {p: d for p, d in local_rows.items() if p.startswith(HOSTILE_CELL + "/")}


def hub_commit(endpoint: str, repo: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{endpoint}/api/datasets/{repo}/revision/main") as answer:
        return json.load(answer)["sha"]


def test_a_store_on_the_hub_is_pinned_against_its_lfs_sha256_at_the_commit_listed(
        store, local_rows, tiny_tokenizer, tmp_path, monkeypatch):
    (tmp_path / "mirror/team").mkdir(parents=True)
    shutil.copytree(store, tmp_path / "mirror/team/raw")
    real, read = adopt_remote.hash_file, []

    def moves_main_after_the_first(job):  # the repo gets a new commit once a file is hashed
        read.append(job.url)
        if len(read) == 2:
            (tmp_path / "mirror/team/raw/NEWS.md").write_text("updated meanwhile")
        return real(job)

    with running_mirror(tmp_path / "mirror") as mirror:
        first = hub_commit(mirror.url, "team/raw")
        report = adopt_store("hf://datasets/team/raw", tokenizer=str(tiny_tokenizer), pin_to=str(tmp_path / "pin"),
                             subsets=["cluster=0/*"], endpoint=mirror.url)
        jobs = []  # verify --remote --deep's jobs read the data at the commit its listing was taken at too
        monkeypatch.setattr(remote_verify, "run_job",
                            lambda job: (jobs.append((type(job).__name__, job.url)), job())[1])
        assert open_source(tmp_path / "pin", endpoint=mirror.url).verify_remote(deep=True).ok
        monkeypatch.setattr(adopt_remote, "hash_file", moves_main_after_the_first)
        with pytest.raises(RemoteError, match=first):  # the mirror keeps no old commit: refused, not mixed
            adopt_store("hf://datasets/team/raw", tokenizer=str(tiny_tokenizer), pin_to=str(tmp_path / "moved"),
                        subsets=["cluster=2/*"], endpoint=mirror.url, workers=1)
        assert hub_commit(mirror.url, "team/raw") != first
    at = f"hf://datasets/team/raw@{first}"
    assert report.data == "hf://datasets/team/raw" and report.checked.get("sha256", 0) > 0 and report.read_at == at
    assert json.loads((tmp_path / "pin" / VOUCHED).read_text())["source"] == at
    assert set(read) == {at} and not (tmp_path / "moved" / MANIFEST).exists()
    assert {job for job in jobs if job[1].startswith("hf://")} == {("HashJob", at), ("CellJob", at)}
    sums = pinned_sums((tmp_path / "pin/SHA256SUMS").read_text())
    assert {p: d for p, d in sums.items() if p.startswith("cluster=")} == \
        {p: d for p, d in local_rows.items() if p.startswith("cluster=0/")}


def test_a_pin_committed_to_a_hub_repo_downloads_its_data_from_the_folder_it_names(store, tiny_tokenizer, tmp_path):
    (tmp_path / "mirror").mkdir()
    with running_mirror(tmp_path / "mirror", writable=True, token="t") as mirror:
        hub = {"endpoint": mirror.url, "token": "t"}
        report = adopt_store(str(store), tokenizer=str(tiny_tokenizer), pin_to="hf://datasets/team/pin",
                             subsets=["cluster=2/*"], work_dir=tmp_path / "work", **hub)
        assert report.root == "hf://datasets/team/pin" and report.data == str(store)
        assert not (tmp_path / "work" / ADOPT_JOURNAL).exists()
        assert not any(p.name.startswith((".marin", "manifest")) for p in store.rglob("*"))  # the data untouched
        from marin_data.transfer.download import download

        got = download("hf://datasets/team/pin", subsets=None, dest=tmp_path / "d", progress=False, **hub)
    assert got.ok and (tmp_path / "d/cluster=2/quality=4/shard_ledger.json").read_bytes() == \
        (store / "cluster=2/quality=4/shard_ledger.json").read_bytes()
