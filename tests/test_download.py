"""download from S3 (moto over HTTP) and from local paths: plan, record, skip, trust, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from s3_env import FAST, bucket_url, copy_corpus, fault_corpus, moto, proxy, run_cli, s3_client  # noqa: F401

from marin_data.corpus.index import read_shard_index, write_shard_index
from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.record import read_download_record
from marin_data.corpus.verify import verify_corpus
from marin_data.errors import ManifestHashMismatchError, RemoteError, UnsafePathError
from marin_data.layout import CARD, CROISSANT, DATASHEET, FIGURES, MANIFEST, PARTIAL_SUFFIX, RECORD, SHARDS_INDEX
from marin_data.transfer.download import download
from marin_data.transfer.publish_s3 import publish


@pytest.fixture
def published(moto, bucket_url, fault_corpus, tmp_path):
    """(url, local root, manifest sha256) of the fault corpus published to a fresh bucket."""
    root = copy_corpus(fault_corpus, tmp_path / "src")
    report = publish(root, to=bucket_url, endpoint_url=moto)
    return bucket_url, root, report.manifest_sha256


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_download_one_subset_keeps_the_root_of_trust_and_records_what_it_fetched(moto, published, tmp_path):
    url, src, digest = published
    dest = tmp_path / "dest"
    report = download(url, subsets=["a"], dest=dest, manifest_sha256=digest, endpoint_url=moto, policy=FAST)
    assert report.ok and report.skipped == () and SHARDS_INDEX in report.fetched  # nothing was there before
    corpus = load_corpus(dest, manifest_sha256=digest)  # manifest, index, tokenizer verbatim
    a_shards = {s.path for s in corpus.shards if s.subset == "a"}
    assert _tree(dest) == a_shards | set(corpus.manifest.files) | {MANIFEST, RECORD}  # no lock file left
    assert (dest / MANIFEST).read_bytes() == (src / MANIFEST).read_bytes()
    record = read_download_record(dest)
    assert record.subsets == ("a",) and record.manifest_sha256 == digest and record.source == url
    assert json.loads((dest / RECORD).read_text())["subsets"] == ["a"]
    assert verify_corpus(dest, subsets=["a"]).ok
    assert report.bytes_fetched == sum(r.bytes for r in corpus.manifest.files.values()) + sum(
        s.bytes for s in corpus.shards if s.subset == "a")


def test_a_second_run_fetches_nothing_and_adding_a_subset_extends_the_record(moto, published, proxy, tmp_path):
    url, _, _ = published
    dest = tmp_path / "dest"
    download(url, subsets=["a"], dest=dest, endpoint_url=moto, policy=FAST)
    again = download(url, subsets=["a"], dest=dest, endpoint_url=proxy.endpoint, policy=FAST)
    assert again.fetched == () and again.bytes_fetched == 0
    assert not any("/data/" in p for p in proxy.served)  # only manifest and index were read
    more = download(url, subsets=["b"], dest=dest, endpoint_url=proxy.endpoint, policy=FAST)
    assert {p.split("/")[1] for p in more.fetched} == {"b"}
    assert read_download_record(dest).subsets == ("a", "b")


def test_dry_run_plans_files_bytes_and_tokens_and_writes_nothing(moto, published, fault_corpus, tmp_path):
    url, _, _ = published
    report = download(url, subsets=["b"], dest=tmp_path / "dest", endpoint_url=moto, dry_run=True)
    b = [s for s in fault_corpus.shards if s.subset == "b"]
    assert report.dry_run and not (tmp_path / "dest").exists()
    assert report.plan.tokens == sum(s.tokens for s in b)
    assert {f.path for f in report.plan.files} == {s.path for s in b} | set(fault_corpus.manifest.files)
    done = run_cli("download", url, "--subset", "b", "--to", str(tmp_path / "d2"), "--dry-run", "--endpoint-url",
                   moto)
    assert done.returncode == 0, done.stderr
    assert all(s.path in done.stdout for s in b) and "Would fetch" in done.stdout
    assert not (tmp_path / "d2").exists()


def test_a_manifest_not_matching_the_pin_is_refused_before_anything_is_written(moto, published, tmp_path):
    url, _, digest = published
    with pytest.raises(ManifestHashMismatchError):
        download(url, subsets=["a"], dest=tmp_path / "dest", manifest_sha256="0" * 64, endpoint_url=moto)
    assert not (tmp_path / "dest").exists()
    done = run_cli("download", url, "--to", str(tmp_path / "dest"), "--manifest-sha256", "1" * 64,
                   "--endpoint-url", moto)
    assert done.returncode == 2 and "pinned" in done.stderr


def test_a_pinned_manifest_falls_back_to_a_mirror_whose_copy_matches(moto, published, fault_corpus, tmp_path):
    url, src, digest = published
    tampered = copy_corpus(fault_corpus, tmp_path / "tampered")
    manifest = json.loads((tampered / MANIFEST).read_text())
    (tampered / MANIFEST).write_text(json.dumps({**manifest, "version": "tampered"}))  # another digest
    report = download(tampered, subsets=["a"], dest=tmp_path / "dest", mirrors=[url], manifest_sha256=digest,
                      endpoint_url=moto, policy=FAST)
    assert report.ok and report.plan.manifest_sha256 == digest


def _tamper(corpus_root: Path, *, files: dict | None = None, index_path: str | None = None) -> None:
    manifest = json.loads((corpus_root / MANIFEST).read_text())
    if index_path is not None:
        rows = read_shard_index(corpus_root / SHARDS_INDEX)
        rows[0] = rows[0]._replace(path=index_path)
        write_shard_index(corpus_root / SHARDS_INDEX, rows)
        from marin_data.fileio.atomic import sha256_file

        digest, size = sha256_file(corpus_root / SHARDS_INDEX)
        manifest["files"][SHARDS_INDEX] = {"bytes": size, "sha256": digest}
    manifest["files"].update(files or {})
    (corpus_root / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("where", ["manifest", "index"])
def test_a_manifest_naming_paths_outside_the_corpus_is_refused(fault_corpus, tmp_path, where):
    src = copy_corpus(fault_corpus, tmp_path / "src")
    if where == "manifest":
        _tamper(src, files={"../../escaped": {"bytes": 1, "sha256": "0" * 64}})
    else:
        _tamper(src, index_path="../../escaped.parquet")
    with pytest.raises(UnsafePathError):
        download(src, subsets=None, dest=tmp_path / "deep" / "dest", policy=FAST)
    assert not (tmp_path / "deep").exists() and not list(tmp_path.glob("escaped*"))
    done = run_cli("download", str(src), "--to", str(tmp_path / "deep" / "dest"))
    assert done.returncode == 2 and "unsafe path" in done.stderr


def test_bad_urls_and_missing_buckets_give_a_clear_error_and_their_own_exit_code(moto, tmp_path):
    for source in ("s3://Bad_Bucket_Name/x", "ftp://example.org/corpus", "s3://no-such-bucket-here/c"):
        with pytest.raises(RemoteError):
            download(source, subsets=None, dest=tmp_path / "d", endpoint_url=moto, policy=FAST)
    done = run_cli("download", "ftp://example.org/corpus", "--to", str(tmp_path / "d"))
    assert done.returncode == 8 and "unsupported URL scheme" in done.stderr
    done = run_cli("download", "s3://no-such-bucket-here/c", "--to", str(tmp_path / "d"), "--endpoint-url", moto)
    assert done.returncode == 8 and "NoSuchBucket" in done.stderr
    assert not (tmp_path / "d").exists()


def test_anonymous_requests_are_unsigned_and_requester_pays_is_sent(moto, published, proxy, tmp_path):
    url, _, _ = published
    bucket = url.split("/")[2]
    s3_client(moto).put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Statement": [{
        "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/*"}]}))
    report = download(url, subsets=["a"], dest=tmp_path / "d", endpoint_url=proxy.endpoint, anonymous=True,
                      requester_pays=True, policy=FAST)
    assert report.ok
    gets = [r for r in proxy.log if r.method == "GET"]
    assert gets and all("Authorization" not in r.headers for r in gets)
    assert all(r.headers.get("x-amz-request-payer") == "requester" for r in gets)


@pytest.mark.parametrize("writeback_chunk", [None, 64 << 10], ids=["default", "early-writeback-every-64KiB"])
def test_a_wrong_file_under_a_final_name_is_replaced_and_a_short_one_resumed(moto, published, proxy, tmp_path,
                                                                               monkeypatch, writeback_chunk):
    if writeback_chunk is not None:  # the test shards are smaller than the default chunk: make every one cross it
        monkeypatch.setattr("marin_data.transfer.partial.WRITEBACK_CHUNK", writeback_chunk)
    url, src, _ = published
    dest = tmp_path / "dest"
    download(url, subsets=["a"], dest=dest, endpoint_url=moto, policy=FAST)
    a0, a1 = sorted(p for p in _tree(dest) if p.startswith("data/a/"))
    good0 = (dest / a0).read_bytes()
    (dest / a0).write_bytes(good0[: len(good0) // 3])  # short: its prefix is good, resumed
    (dest / a1).write_bytes(b"x" * (dest / a1).stat().st_size)  # same size, wrong bytes: fetched again
    report = download(url, subsets=["a"], dest=dest, endpoint_url=proxy.endpoint, policy=FAST)
    assert report.ok and set(report.fetched) == {a0, a1}
    assert proxy.requests(a0)[0].range == f"bytes={len(good0) // 3}-"
    assert proxy.served[f"/{url.split('/')[2]}/corpus/{a0}"] == len(good0) - len(good0) // 3
    assert verify_corpus(dest, subsets=["a"]).ok
    assert not list(dest.rglob(f"*{PARTIAL_SUFFIX}"))


def info_cli(capsys, *args: str) -> str:
    """``marin-data info ARGS`` in this process; its stdout."""
    from marin_data.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["info", *args])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_any_subset_brings_the_documentation_and_info_marks_what_the_copy_holds(make_corpus, tmp_path, capsys):
    from marin_data.formats.datasheet import write_datasheet

    corpus = make_corpus({"a": [20], "b/c": [10]})
    written = write_datasheet(corpus.root)
    dest = tmp_path / "copy"
    report = download(corpus.root, subsets=["b/c"], dest=dest, workers=2, progress=False)
    assert report.ok and DATASHEET in report.fetched and report.notes == ()
    for doc in (DATASHEET, CARD, CROISSANT, *FIGURES):
        assert (dest / doc).read_bytes() == (corpus.root / doc).read_bytes(), doc
    assert written.manifest_sha256 in (dest / DATASHEET).read_text() and verify_corpus(dest, progress=False).ok
    table = info_cli(capsys, str(dest))
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.startswith(("a ", "b/c "))}
    assert rows["a"][-1] == "no" and rows["b/c"][-1] == "yes" and "holds 1 of 2 subsets" in table
    doc = json.loads(info_cli(capsys, str(dest), "--json"))
    assert doc["partial"] and {k: s["present"] for k, s in doc["subsets"].items()} == {"a": False, "b/c": True}
    assert "here" not in info_cli(capsys, str(corpus.root))  # a whole corpus has nothing to mark


def test_a_datasheet_stating_another_manifest_is_left_out_and_said_so(make_corpus, tmp_path):
    corpus = make_corpus({"a": [5]})
    (corpus.root / DATASHEET).parent.mkdir()
    (corpus.root / DATASHEET).write_text("manifest sha256: " + "0" * 64 + "\n")  # a datasheet of another version
    report = download(corpus.root, subsets=None, dest=tmp_path / "copy", workers=2, progress=False)
    assert report.ok and not (tmp_path / "copy" / DATASHEET).exists()
    assert report.notes == (f"{corpus.root}/{DATASHEET} states another manifest sha256: not kept",)


def test_the_datasheet_falls_back_to_a_mirror_like_any_file(make_corpus, moto, bucket_url, proxy, tmp_path):
    """The source fails the datasheet after its retries: the mirror's copy is taken; when the mirror holds
    none, the download still succeeds and says what it could not fetch; only every store failing fails it."""
    from faultproxy import Fault

    from marin_data.formats.datasheet import write_datasheet

    corpus = make_corpus({"a": [5]})
    write_datasheet(corpus.root)
    publish(corpus.root, to=bucket_url, endpoint_url=moto)
    proxy.add(Fault("status", match=DATASHEET, status=500, times=100))
    report = download(bucket_url, subsets=None, dest=tmp_path / "d", mirrors=[str(corpus.root)],
                      endpoint_url=proxy.endpoint, policy=FAST, progress=False)
    assert report.ok and DATASHEET in report.fetched
    assert (tmp_path / "d" / DATASHEET).read_bytes() == (corpus.root / DATASHEET).read_bytes()

    bare = make_corpus({"a": [5]}).root  # the same data, no documentation
    (bare / DATASHEET).unlink(missing_ok=True)
    report = download(bucket_url, subsets=None, dest=tmp_path / "n", mirrors=[str(bare)],
                      endpoint_url=proxy.endpoint, policy=FAST, progress=False)
    assert report.ok and not (tmp_path / "n" / DATASHEET).exists()
    assert len(report.notes) == 1 and report.notes[0].startswith(f"{DATASHEET}: not fetched (")

    report = download(bucket_url, subsets=None, dest=tmp_path / "f", endpoint_url=proxy.endpoint, policy=FAST,
                      progress=False)
    assert [p for p, _ in report.failed] == [DATASHEET]
