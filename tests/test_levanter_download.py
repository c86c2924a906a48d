"""``download`` of a Levanter store nothing pins (Marin's own store as it is published): chosen cells only,
byte for byte, resumed after a dropped connection, each file at its listed size, then the copy's structure
checked; a cell unfinished at the source is refused before anything is fetched, and ``publish`` refuses an
unpinned store by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostile import HostileServer
from levanter_env import make_store
from s3_env import FAST, bucket_url, moto, proxy, run_cli, s3_client  # noqa: F401 - fixtures
from shard_env import tree_bytes

from marin_data.errors import CacheUnfinishedError
from marin_data.layout import CHECKED, LOCK_NAME
from marin_data.levanter import adopt, detect
from marin_data.levanter.download import download_cache
from marin_data.levanter.ledger import LEDGER

CELLS = {"cluster=0/quality=1": 300, "cluster=1/quality=4": 200, "cluster=2/quality=4": 120}
CHOSEN = {c for c in CELLS if c.endswith("quality=4")}


@pytest.fixture
def store(tmp_path) -> Path:
    make_store(tmp_path / "store", CELLS)
    return tmp_path / "store"


def upload(root: Path, moto: str, url: str) -> None:  # noqa: F811
    """Every file of ``root`` to ``url`` with plain uploads, as a store nobody published with marin."""
    bucket, prefix = url[len("s3://"):].split("/", 1)
    for rel in tree_bytes(root):
        s3_client(moto).upload_file(str(root / rel), bucket, f"{prefix}/{rel}")


def chosen_files(store: Path) -> dict[str, bytes]:
    return {rel: b for rel, b in tree_bytes(store).items() if rel.startswith(tuple(f"{c}/" for c in CHOSEN))}


def copied(dest: Path) -> dict[str, bytes]:
    """The files of a download, without the lock file every writer of a folder leaves and the record of what
    each file was checked against."""
    return {rel: b for rel, b in tree_bytes(dest).items() if rel not in (LOCK_NAME, CHECKED)}


def test_chosen_cells_arrive_byte_for_byte_resume_after_a_drop_and_their_structure_is_checked(
        store, moto, bucket_url, proxy, tmp_path):  # noqa: F811
    from faultproxy import Fault

    upload(store, moto, bucket_url)
    proxy.add(Fault("drop", match="cluster%3D1/quality%3D4/input_ids/data/c/0", fraction=0.5))
    found = detect(bucket_url, endpoint_url=proxy.endpoint)
    done = download_cache(found, subsets=["cluster=*/quality=4"], dest=tmp_path / "d", policy=FAST,
                          progress=False, endpoint_url=proxy.endpoint)
    assert done.ok and done.checks is not None and done.checks.ok and done.checks.files_checked > 0
    want = chosen_files(store)
    assert copied(tmp_path / "d") == want and len(want) == len(done.transfer.plan.files)
    assert done.transfer.plan.tokens == sum(json.loads((store / c / LEDGER).read_text())["field_counts"]["input_ids"]
                                            for c in CHOSEN)
    dropped = [r for r in proxy.requests("cluster%3D1/quality%3D4/input_ids/data/c/0") if r.fault or r.range]
    assert [r.fault for r in dropped][:1] == ["drop"] and dropped[-1].range is not None  # resumed, not restarted
    again = download_cache(found, subsets=["cluster=*/quality=4"], dest=tmp_path / "d", policy=FAST, progress=False)
    assert again.ok and again.transfer.fetched == () and len(again.transfer.skipped) == len(want)
    assert adopt(tmp_path / "d", tokenizer=_tokenizer(tmp_path), name="copy").manifest_sha256  # the copy pins


def test_a_chunk_file_damaged_at_the_source_arrives_and_is_reported_by_the_structural_checks(store, tmp_path):
    victim = store / "cluster=1/quality=4/input_ids/data/c/0"
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0xFF  # inside the chunk file's index, which its crc32c guards; the size is unchanged
    victim.write_bytes(bytes(data))
    done = run_cli("download", str(store), "--subset", "cluster=1/quality=4", "--to", str(tmp_path / "d"))
    assert done.returncode == 1, done.stderr
    assert "cluster=1/quality=4/input_ids/data/c/0" in done.stderr and "structure: BAD" in done.stdout
    assert "not pinned" in done.stdout and "marin-data adopt" in done.stdout


def test_an_unfinished_cell_is_refused_before_anything_is_fetched(store, tmp_path):
    ledger = store / "cluster=2/quality=4" / LEDGER
    ledger.write_text(ledger.read_text().replace('"is_finished": true', '"is_finished": false'))
    with pytest.raises(CacheUnfinishedError):
        download_cache(detect(store), subsets=["cluster=*/quality=4"], dest=tmp_path / "d", progress=False)
    assert not (tmp_path / "d").exists()
    done = run_cli("download", str(store), "--subset", "cluster=2/*", "--to", str(tmp_path / "d"))
    assert done.returncode == 20 and "is_finished" in done.stderr


def test_a_dry_run_lists_the_chosen_cells_files_and_a_pin_is_refused(store, tmp_path):
    done = run_cli("download", str(store), "--subset", "cluster=0/*", "--to", str(tmp_path / "d"), "--dry-run")
    assert done.returncode == 0 and "cluster=0/quality=1/shard_ledger.json" in done.stdout
    assert "cluster=1" not in done.stdout and not (tmp_path / "d").exists()
    done = run_cli("download", str(store), "--to", str(tmp_path / "d"), "--manifest-sha256", "0" * 64)
    assert done.returncode == 2 and "adopt" in done.stderr


ESCAPE = "../" * 7 + "escaped"  # from DEST/<cell>/<folder>/, seven levels up is the test's own folder


@pytest.mark.parametrize("planted, single", [
    (f"cluster=1/quality=4/{ESCAPE}", False), (f"cluster=1/quality=4/shard_ledger.json/{ESCAPE}", False),
    ("cluster=1/quality=4/input_ids/data/c/0.part", False), (f"input_ids/{ESCAPE}", True), (".marin.lock", True)])
def test_a_listed_name_that_would_land_outside_the_copy_or_on_marins_own_files_is_refused(
        planted, single, store, moto, bucket_url, tmp_path):  # noqa: F811
    """A store lists what it likes: a listed name becomes a local path only once it is a clean relative path
    inside its cell and no name marin writes (the lock, a partial file); nothing is written before that."""
    cell = "cluster=1/quality=4"
    upload(store / cell if single else store, moto, bucket_url)
    bucket, prefix = bucket_url[len("s3://"):].split("/", 1)
    s3_client(moto).put_object(Bucket=bucket, Key=f"{prefix}/{planted}", Body=b"planted")
    dest = tmp_path / "a" / "b" / "c" / "d"
    done = run_cli("download", bucket_url, "--endpoint-url", moto, "--to", str(dest),
                   *([] if single else ["--subset", cell]))
    assert done.returncode == 2, done.stderr
    assert "refusing" in done.stderr and planted.rsplit("/", 1)[-1] in done.stderr
    assert not (tmp_path / "escaped").exists() and not dest.exists()


@pytest.mark.parametrize("size", [None, "-5", "12x"], ids=["no-size", "negative", "not-a-number"])
def test_a_listing_entry_without_a_size_a_file_can_have_is_a_remote_error_before_anything_is_written(
        store, tmp_path, size):
    """Each listed size is what a file is fetched against: without one (or with one no file has) there is nothing
    to fetch; a resume could never finish it."""
    cell = "cluster=1/quality=4"
    dest = tmp_path / "d"
    with HostileServer(store) as srv:
        srv.listed_sizes = {f"{cell}/input_ids/offsets/zarr.json": size}
        for command in (["info"], ["verify"], ["download", "--subset", cell, "--to", str(dest)]):
            done = run_cli(command[0], *srv.store_args("s3"), *command[1:])
            assert done.returncode == 8 and "malformed" in done.stderr, (command, done.stderr)
            assert "Traceback" not in done.stderr and "manifest.json" not in done.stderr
    assert not dest.exists()


def test_a_listing_naming_a_file_where_it_names_a_folder_is_refused_before_anything_is_written(store, tmp_path):
    cell = "cluster=1/quality=4"
    dest = tmp_path / "d"
    with HostileServer(store) as srv:
        srv.files[f"{cell}/input_ids"] = b"a key beside the keys below it"
        done = run_cli("download", *srv.store_args("s3"), "--subset", cell, "--to", str(dest))
    assert done.returncode == 2 and f"'{cell}/input_ids' as a file and as the folder of" in done.stderr, done.stderr
    assert not dest.exists()


def test_publish_refuses_an_unpinned_store_naming_adopt(store, tmp_path):
    before = tree_bytes(store)
    done = run_cli("publish", str(store), "--to", "s3://bucket/never", "--endpoint-url", "http://127.0.0.1:9")
    assert done.returncode == 22 and "unpinned Levanter store" in done.stderr and "marin-data adopt" in done.stderr
    assert tree_bytes(store) == before


def _tokenizer(tmp_path: Path) -> str:
    from shard_env import train_tiny

    return str(train_tiny(tmp_path / "tokenizer.json"))
