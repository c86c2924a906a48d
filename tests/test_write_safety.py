"""Where marin writes, nothing below the destination is followed: links, folders where files go and files
where folders go are refused with their own exit code, and nothing of the user's is written, renamed or
removed. Also: sizes the destination cannot hold."""

from __future__ import annotations

import http.server
import os
import threading
from pathlib import Path

import pytest
from conftest import build_corpus
from shard_env import make_texts, run_cli, tiny_tokenizer, write_jsonl  # noqa: F401 - a fixture

from marin_data.fileio.atomic import atomic_write_bytes
from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.manifest import load_corpus
from marin_data.cli._errors import EXIT_USAGE, describe
from marin_data.errors import InvalidManifestError, RemoteError, UnsafeDestinationError
from marin_data.layout import LOCK_NAME, PARTIAL_SUFFIX, RANGES_SUFFIX, RECORD
from marin_data.fileio.lock import corpus_lock
from marin_data.stores import open_store
from marin_data.transfer.download import download

PRECIOUS = b"the user's own file\n"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A small corpus to download from (a local path: no server needed)."""
    return build_corpus(tmp_path_factory.mktemp("src") / "corpus", {"a": [40, 40], "b": [30]}).root


def _first_shard(source: Path) -> str:
    return sorted(s.path for s in load_corpus(source).shards)[0]


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(PRECIOUS)
    return victim


def _link(dest: Path, source: Path, where: str) -> Path:
    shard = _first_shard(source)
    return {"final": dest / shard, "partial": dest / (shard + PARTIAL_SUFFIX),
            "record": dest / shard.replace(".parquet", ".parquet" + RANGES_SUFFIX),
            "folder": (dest / shard).parent}[where]


@pytest.mark.parametrize("part_bytes", [0, 1024], ids=["one-get", "ranges"])
@pytest.mark.parametrize("where", ["final", "partial", "record", "folder"])
def test_download_never_writes_through_a_link_below_dest(source, tmp_path, where, part_bytes):
    victim = _victim(tmp_path)
    target = tmp_path / "victim-folder" if where == "folder" else victim
    target.mkdir(exist_ok=True) if where == "folder" else None
    dest = tmp_path / "dest"
    link = _link(dest, source, where)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    try:
        download(source, subsets=None, dest=dest, part_bytes=part_bytes, progress=False)
    except UnsafeDestinationError as e:
        assert e.path == str(link)
    assert victim.read_bytes() == PRECIOUS and link.is_symlink() and os.readlink(link) == str(target)
    if where == "folder":
        assert list(target.iterdir()) == []
    if where == "record" and part_bytes == 0:
        return  # a one-GET download has no ranges record to write: it may succeed
    assert not (dest / "manifest.json").exists()


def test_cli_names_the_link_with_its_own_exit_code_and_a_linked_dest_is_the_users_choice(source, tmp_path):
    victim = _victim(tmp_path)
    dest = tmp_path / "dest"
    link = _link(dest, source, "final")
    link.parent.mkdir(parents=True)
    link.symlink_to(victim)
    out = run_cli("download", source, "--to", dest)
    assert out.returncode == 16, out.stderr
    assert str(link) in out.stderr and "symbolic link" in out.stderr and "Traceback" not in out.stderr
    assert victim.read_bytes() == PRECIOUS
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "chosen").symlink_to(real)  # DEST itself may be a link: the user chose it
    assert download(source, subsets=None, dest=tmp_path / "chosen", progress=False).ok
    assert load_corpus(real).shards


@pytest.mark.parametrize("dest", ["dangling", "below-a-file"])  # DEST a file is click's usage error (exit 2)
def test_a_dest_that_cannot_be_a_folder_is_named_with_exit_16(source, tmp_path, dest):
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    (tmp_path / "file").write_bytes(PRECIOUS)
    (tmp_path / "below-a-file").symlink_to(tmp_path / "file")  # DEST's parent is then a file
    target = tmp_path / dest / ("sub" if dest == "below-a-file" else "")
    out = run_cli("download", source, "--to", target)
    says = {"dangling": f"{tmp_path / 'dangling'}: is a symbolic link to {tmp_path / 'gone'}, which does not exist",
            "below-a-file": f"{tmp_path / 'below-a-file'}: is a symbolic link to {tmp_path / 'file'}, which is not a "
                            "folder"}[dest]
    assert out.returncode == 16 and says in out.stderr, out.stderr
    assert not (tmp_path / "gone").exists() and (tmp_path / "file").read_bytes() == PRECIOUS


def test_a_dest_the_system_refuses_is_named_with_exit_18(source):
    import errno

    refused = Path("/sys/marin-test")  # EPERM even for root (EROFS where /sys is mounted read-only)
    try:
        refused.mkdir()
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            pytest.skip(f"/sys refuses with {e!r} here")
    else:
        refused.rmdir()
        pytest.skip("/sys accepts a new folder here")
    out = run_cli("download", source, "--to", refused)
    assert out.returncode == 18 and f"{refused}: " in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("what", ["folder-as-shard", "file-as-folder"])
def test_a_folder_where_a_shard_goes_or_a_file_where_a_folder_goes_is_refused_untouched(source, tmp_path, what):
    dest = tmp_path / "dest"
    shard = dest / _first_shard(source)
    if what == "folder-as-shard":
        (shard / "mine").mkdir(parents=True)
        (shard / "mine" / "notes.txt").write_bytes(PRECIOUS)
        blocked = shard
    else:
        blocked = shard.parent
        blocked.parent.mkdir(parents=True)
        blocked.write_bytes(PRECIOUS)
    before = sorted(p.relative_to(dest) for p in dest.rglob("*"))
    out = run_cli("download", source, "--to", dest)
    assert out.returncode == 16 and str(blocked) in out.stderr, out.stderr
    assert set(before) <= {p.relative_to(dest) for p in dest.rglob("*")}  # nothing renamed or removed
    assert not [p for p in dest.rglob("*.part") if not p.is_file()]
    if what == "folder-as-shard":
        assert (shard / "mine" / "notes.txt").read_bytes() == PRECIOUS
    else:
        assert blocked.read_bytes() == PRECIOUS


def test_a_linked_lock_is_refused_and_its_target_untouched(source, tmp_path):
    victim = _victim(tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / LOCK_NAME).symlink_to(victim)
    out = run_cli("download", source, "--to", dest)
    assert out.returncode == 16 and LOCK_NAME in out.stderr, out.stderr
    assert victim.read_bytes() == PRECIOUS
    with pytest.raises(UnsafeDestinationError):
        with corpus_lock(dest):
            pass


def test_atomic_writes_refuse_links_below_the_root_but_not_the_root(tmp_path):
    victim = _victim(tmp_path)
    (tmp_path / "root" / "sub").mkdir(parents=True)
    (tmp_path / "root" / "linked").symlink_to(tmp_path)
    (tmp_path / "root" / "sub" / "f").symlink_to(victim)
    for target in (tmp_path / "root" / "linked" / "victim.txt", tmp_path / "root" / "sub" / "f"):
        with pytest.raises(UnsafeDestinationError):
            atomic_write_bytes(target, b"x", root=tmp_path / "root")
    assert victim.read_bytes() == PRECIOUS
    (tmp_path / "via").symlink_to(tmp_path / "root")
    atomic_write_bytes(tmp_path / "via" / "sub" / "new", b"ok", root=tmp_path / "via")
    assert (tmp_path / "root" / "sub" / "new").read_bytes() == b"ok"
    assert sorted(p.name for p in (tmp_path / "root" / "sub").iterdir()) == ["f", "new"]  # no temporary left


def test_a_name_that_climbs_out_of_the_root_is_refused_whatever_let_it_through(tmp_path):
    """The last guard under every writer: a ``..`` below the root is never walked, even inside a folder."""
    (tmp_path / "root").mkdir()
    for name in ("../escaped", "sub/../../escaped", "sub/deeper/../../../escaped"):
        with pytest.raises(UnsafeDestinationError, match="leaves the destination folder"):
            atomic_write_bytes(tmp_path / "root" / name, b"x", root=tmp_path / "root")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]


@pytest.mark.parametrize("size", [1 << 40, 1 << 62], ids=["1TiB", "2^62"])
@pytest.mark.parametrize("part_mb", ["0", "1"], ids=["one-get", "ranges"])
def test_a_listed_size_the_disk_cannot_hold_is_refused_before_anything_is_allocated(source, tmp_path, size, part_mb):
    corpus = build_corpus(tmp_path / "src", {"a": [40, 40], "b": [30]})
    huge = [s._replace(bytes=size) if s.path == _first_shard(source) else s for s in corpus.shards]
    commit_corpus(corpus.root, corpus.manifest, huge)
    dest = tmp_path / "dest"
    out = run_cli("download", corpus.root, "--to", dest, "--part-mb", part_mb)
    assert out.returncode == 17 and "free" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert all(p.stat().st_blocks * 512 < 1 << 30 and p.stat().st_size < 1 << 30 for p in dest.rglob("*")
               if p.is_file())


@pytest.mark.parametrize("where", ["data", "sources", "staging"])
def test_shard_never_writes_through_a_linked_folder_of_the_corpus(tiny_tokenizer, tmp_path, where):
    from marin_data.corpus.build import shard_subset

    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "text": t} for i, t in enumerate(make_texts(20, 1))])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "corpus"
    link = out / {"data": "data/s", "sources": "sources", "staging": ".staging"}[where]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere)
    with pytest.raises(UnsafeDestinationError) as e:
        shard_subset([inputs], subset="s", tokenizer=str(tiny_tokenizer), out=out, workers=1)
    assert e.value.path == str(link) and list(elsewhere.iterdir()) == []


def test_the_decode_cache_and_the_datasheet_refuse_links(source, tmp_path):
    from marin_data.formats.datasheet import write_datasheet
    from marin_data.loader.cache import DecodedShardCache

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shard = load_corpus(source).shards[0]
    cache = DecodedShardCache(source, tmp_path / "cache")
    tokens, _ = cache.paths(shard)
    tokens.parent.parent.mkdir(parents=True)
    tokens.parent.symlink_to(elsewhere)
    with pytest.raises(UnsafeDestinationError):
        cache.open(shard)
    out = tmp_path / "sheet"
    out.mkdir()
    (out / "datasheets").symlink_to(elsewhere)
    with pytest.raises(UnsafeDestinationError):
        write_datasheet(source, out=out)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("defect", ["twice", "reserved", "nested", "negative"])
def test_a_self_contradicting_shard_index_is_refused_before_anything_is_written(tmp_path, defect):
    corpus = build_corpus(tmp_path / "src", {"a": [10, 10]})
    first, second = corpus.shards
    bad = {"twice": [first, second._replace(path=first.path)],
           "reserved": [first, second._replace(path=RECORD)],
           "nested": [first, second._replace(path=first.path + "/inner.parquet")],
           "negative": [first, second._replace(bytes=-1)]}[defect]
    commit_corpus(corpus.root, corpus.manifest, bad)
    dest = tmp_path / "dest"
    with pytest.raises(InvalidManifestError) as e:
        download(corpus.root, subsets=None, dest=dest, progress=False)
    assert describe(e.value)[1] == EXIT_USAGE
    assert not dest.exists()
    with pytest.raises(InvalidManifestError):
        load_corpus(corpus.root)


@pytest.mark.parametrize("name", [LOCK_NAME, ".staging/commit/manifest.json", RECORD, "mirrors.json", "manifest.json",
                                  "README.md" + PARTIAL_SUFFIX, "data/a/part-00000.parquet" + RANGES_SUFFIX])
def test_a_manifest_listing_a_reserved_name_is_refused_before_a_pinned_download_writes_it(tmp_path, name):
    import hashlib
    import json

    from marin_data.layout import MANIFEST

    corpus = build_corpus(tmp_path / "src", {"a": [10]})
    planted = corpus.root / name
    planted.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads((corpus.root / MANIFEST).read_bytes())
    content = json.dumps({**doc, "version": "planted"}).encode()  # a journal manifest later readers prefer
    if name != MANIFEST:
        planted.write_bytes(content)
    doc["files"][name] = {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    data = json.dumps(doc).encode()
    (corpus.root / MANIFEST).write_bytes(data)
    dest = tmp_path / "dest"
    with pytest.raises(InvalidManifestError, match="is a reserved name") as e:
        download(corpus.root, subsets=None, dest=dest, progress=False,
                 manifest_sha256=hashlib.sha256(data).hexdigest())
    assert describe(e.value)[1] == EXIT_USAGE and not dest.exists()


@pytest.mark.parametrize("size", ['"12"', "1.5", "null", "-1"])
def test_a_tree_listing_with_a_size_that_is_no_byte_count_is_a_remote_error(tmp_path, size):
    listing = f'[{{"type": "file", "path": "manifest.json", "size": {size}, "oid": "{"0" * 40}"}}]'.encode()

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server hook
            body = b'{"sha": "%s"}' % (b"1" * 40) if "/revision/" in self.path else listing
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        store = open_store("hf://datasets/o/n", endpoint=f"http://127.0.0.1:{server.server_port}")
        with pytest.raises(RemoteError, match="malformed tree listing"):
            store.head("data/a/part-00000.parquet")  # what `verify --remote` and a split corpus's reads ask
    finally:
        server.shutdown()
        server.server_close()


def test_the_lock_file_goes_with_its_holder_and_a_lock_taken_on_the_removed_file_is_taken_again(tmp_path,
                                                                                                monkeypatch):
    """The holder removes ``.marin.lock`` when done. A writer that opened it just before holds a lock on a
    file no longer there: it must see that and lock the file the name now leads to, or two writers would
    each hold "the" lock."""
    import fcntl

    import marin_data.fileio.lock as lock
    from marin_data.errors import CorpusLockedError

    first = lock.corpus_lock(tmp_path)
    first.__enter__()
    real, calls = fcntl.flock, []

    def flock(fd, op):  # the first holder finishes between the second's open and its lock
        if not calls:
            first.__exit__(None, None, None)
        calls.append(fd)
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with lock.corpus_lock(tmp_path):
        monkeypatch.setattr(fcntl, "flock", real)
        assert len(calls) == 2 and (tmp_path / LOCK_NAME).is_file()
        with pytest.raises(CorpusLockedError):  # a third writer meets the lock the second holds
            with lock.corpus_lock(tmp_path):
                pass
    assert not (tmp_path / LOCK_NAME).exists()
