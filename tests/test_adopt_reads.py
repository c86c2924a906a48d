"""``adopt`` of a store reads each file as few times as its checks allow: a ledger or ``zarr.json`` once (opened
once, pinned from the bytes the checks read), an offsets chunk file twice (checked, then its documents counted),
a data chunk file's index once (the checks' read goes with its hashing job) and the file once, ``.stats.json``
never where the listing shows none; the pin is the one a local adopt gives. A metadata file whose bytes
contradict the store's digest is read again by its job and refused."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest
from s3_env import FAST, bucket_url, moto, s3_client  # noqa: F401 - fixtures
from shard_env import tiny_tokenizer, tree_bytes  # noqa: F401 - a fixture
from test_levanter_adopt_remote import local_rows, store, upload  # noqa: F401 - fixtures

from marin_data.errors import StoreDigestMismatchError
from marin_data.levanter.adopt_reads import CheckedReads
from marin_data.levanter.adopt_remote import adopt_store
from marin_data.stores.local import LocalStore


def test_each_file_is_read_as_few_times_as_the_checks_allow(store, local_rows, tiny_tokenizer, tmp_path,  # noqa: F811
                                                            monkeypatch):
    data = shutil.copytree(store, tmp_path / "store")
    reads, real = Counter(), LocalStore.read

    def counted(self, path, start=0, end=None):
        name = "/".join(path.split("/")[-3 if "/c/" in path else -1:])  # offsets/c/0, data/c/3, zarr.json
        reads[(name, start == 0 and end is None)] += 1
        return real(self, path, start, end)

    monkeypatch.setattr(LocalStore, "read", counted)
    adopt_store(str(data), tokenizer=str(tiny_tokenizer), pin_to=str(tmp_path / "pin"), subsets=["cluster=0/*"])
    sums = dict(reversed(line.split("  ")) for line in (tmp_path / "pin/SHA256SUMS").read_text().splitlines())
    assert {p: d for p, d in sums.items() if p.startswith("cluster=")} == \
        {p: d for p, d in local_rows.items() if p.startswith("cluster=0/")}
    assert reads[("shard_ledger.json", True)] == 1 and reads[("zarr.json", True)] == 2  # data's and offsets'
    assert reads[("offsets/c/0", True)] == 2 and not any(name == ".stats.json" for name, _ in reads)
    chunks = [name for name, _ in reads if name.startswith("data/c/")]
    assert chunks and all(reads[(c, True)] == 1 and reads[(c, False)] == 1 for c in chunks)


def test_reads_that_disagree_or_stop_early_give_no_digests(tmp_path):
    (tmp_path / "a").write_bytes(b"first")
    (tmp_path / "b").write_bytes(b"0123456789")
    (tmp_path / "c").write_bytes(bytes(3 << 20))
    reads = CheckedReads(LocalStore(tmp_path))
    with reads.read("a") as stream:
        assert b"".join(stream) == b"first"
    assert reads.digests("a")["md5"] == "8b04d5e3775d298e78455efc5ca404d5"
    (tmp_path / "a").write_bytes(b"other")  # the same size, other bytes: read again, they disagree
    with reads.read("a") as stream:
        b"".join(stream)
    assert reads.digests("a") is None
    with reads.read("b", 6, 10) as stream:
        b"".join(stream)
    assert reads.tail("b", 10, 4) == b"6789" and reads.tail("b", 10, 5) == b""
    with reads.read("c") as stream:
        next(iter(stream))  # stopped early: pinned by its job instead
    assert reads.digests("c") is None


def test_a_metadata_file_contradicting_its_store_digest_is_read_again_and_refused(
        store, tiny_tokenizer, moto, bucket_url, tmp_path):  # noqa: F811
    upload(store, moto, bucket_url)
    bucket = bucket_url[len("s3://"):].split("/")[0]
    victim = "cluster=2/quality=4/shard_ledger.json"
    s3_client(moto).put_object(Bucket=bucket, Key=f"corpus/{victim}", Body=(store / victim).read_bytes(),
                               ChecksumAlgorithm="CRC32", Metadata={"sha256": "0" * 64})
    with pytest.raises(StoreDigestMismatchError) as info:
        adopt_store(bucket_url, tokenizer=str(tiny_tokenizer), pin_to=str(tmp_path / "pin"), endpoint_url=moto,
                    subsets=["cluster=2/*"], policy=FAST)
    assert victim in info.value.path and not (tmp_path / "pin/manifest.json").exists()
    assert tree_bytes(tmp_path / "pin").keys() <= {".marin-adopt.jsonl"}
