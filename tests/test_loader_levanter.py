"""The loader streams a pinned Levanter cache directly: every sequence is the cells' own tokens, computed here
independently from the documents the caches were written with (and, for the golden caches, from the
documents real Levanter read back), in both packings; resume is exact at other world sizes, worker counts
and batch sizes; every file a decode reads is checked against the index first; an unpinned cache is refused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from levanter_env import CHUNK, make_cache, make_store, wide_tokenizer
from loader_checks import check_global_stream, take, window_of
from s3_env import bucket_url, moto, proxy, s3_client  # noqa: F401 - fixtures
from shard_env import tiny_tokenizer, tree_bytes  # noqa: F401 - a fixture

from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.manifest import Manifest, load_corpus
from marin_data.corpus.records import SHARD, ShardRecord, SubsetInfo
from marin_data.corpus.shard import shard_path, write_shard
from marin_data.errors import InvalidManifestError, LoaderConfigError, ShardChecksumError, UnpinnedCacheError
from marin_data.layout import TOKENIZER
from marin_data.levanter import adopt
from marin_data.loader import LoaderConfig, Phase, TokenDataset, TokenLoader, TokenStream, make_loader
from marin_data.loader.packing import IGNORE
from marin_data.raw.tokenizer import TokenizerInfo

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

FIXTURES = Path(__file__).parent / "fixtures" / "levanter"
# cell -> (documents, write_cache options): an int32/lz4, an int64/zstd and a sharded cell, each of several
# chunk files of `CHUNK` tokens, so that documents span chunk files and the sharded cell's part ends; the
# first has more than 10 (c/10 comes after c/9 in its flat tokens, before c/2 in a sort by path)
CELLS = {"cluster=0/quality=0": (400, {}), "cluster=0/quality=4": (200, {"dtype": "int64", "codec": "zstd"}),
         "cluster=1/quality=4": (250, {"layout": "sharded", "parts": 3})}
SEQ_LEN = 100  # divides no chunk file: "levanter" windows straddle them


def _options(options: dict) -> dict:
    from marin_data.levanter import ZSTD

    return {**options, "codec": ZSTD} if options.get("codec") == "zstd" else options


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    """A pinned store of the three cells, and each cell's documents."""
    from shard_env import train_tiny

    root = tmp_path_factory.mktemp("levloader")
    docs = {cell: make_cache(root / "store" / cell, n, seed=i, **_options(options))
            for i, (cell, (n, options)) in enumerate(CELLS.items())}
    adopt(root / "store", tokenizer=str(train_tiny(root / "tokenizer.json")), name="store")
    return root / "store", docs


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("decoded")


def flat(documents) -> np.ndarray:
    return np.concatenate(documents).astype(np.int64)


def chunk_bounds(cell: str, documents) -> np.ndarray:
    """Where the cell's chunk files start and end in its flat tokens, from how it was written: parts split
    the documents evenly in order (`write_cache`), each part's chunk files hold `CHUNK` tokens."""
    parts = CELLS[cell][1].get("parts", 1)
    doc_bounds = np.linspace(0, len(documents), parts + 1).astype(int)
    sizes = [sum(len(d) for d in documents[a:b]) for a, b in zip(doc_bounds[:-1], doc_bounds[1:])]
    out, base = [0], 0
    for size in sizes:
        out += [base + min(size, k) for k in range(CHUNK, size + CHUNK, CHUNK)]
        base += size
    return np.unique(out)


def document_starts(documents) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(d) for d in documents])[:-1]])


def expected_segments(starts: np.ndarray, x: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """segment_ids, positions of the row that starts at flat token ``x`` (``starts``: the document starts)."""
    begins = np.zeros(length, bool)
    begins[0] = True
    inside = starts[(starts > x) & (starts < x + length)] - x
    begins[inside] = True
    last = np.maximum.accumulate(np.where(begins, np.arange(length), 0))
    return np.cumsum(begins) - 1, np.arange(length) - last


def one_cell(store: Path, cell: str, cache_dir: Path, **config) -> TokenStream:
    return TokenStream(store, LoaderConfig(seq_len=SEQ_LEN, batch_size=4, subsets=[cell], **config),
                       cache_dir=cache_dir)


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_overlap_windows_are_a_cells_tokens_inside_one_chunk_file_with_its_document_boundaries(pinned, cell,
                                                                                              cache_dir):
    store, docs = pinned
    stream = one_cell(store, cell, cache_dir, segments=True, val_fraction=0.05)
    tokens, bounds, starts = flat(docs[cell]), chunk_bounds(cell, docs[cell]), document_starts(docs[cell])
    expected = sorted(a + j * SEQ_LEN for a, b in zip(bounds[:-1], bounds[1:]) for j in range((b - a - 1) // SEQ_LEN))
    seen = []
    for split in ("train", "validation"):
        n = stream.sizes(split)[cell]
        batch = stream.read(np.arange(n), split)
        first = stream.locate(np.arange(n), split)[1]
        seen += first.tolist()
        assert np.array_equal(window_of(batch), np.stack([tokens[x:x + SEQ_LEN + 1] for x in first]))
        for r, x in enumerate(first):
            segment_ids, positions = expected_segments(starts, x, SEQ_LEN)
            assert np.array_equal(batch.segment_ids[r], segment_ids) and np.array_equal(batch.positions[r], positions)
    assert sorted(seen) == expected  # every window of every chunk file, once, in training or validation


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_levanter_windows_are_a_cells_flat_tokens_across_chunk_files_and_parts(pinned, cell, cache_dir):
    store, docs = pinned
    stream = one_cell(store, cell, cache_dir, packing="levanter", shuffle="none", val_fraction=0)
    tokens = flat(docs[cell])
    n = len(tokens) // SEQ_LEN
    assert stream.sizes()[cell] == n
    batch = stream.read(np.arange(n + 2))  # and the first two of the next pass
    want = tokens[:n * SEQ_LEN].reshape(n, SEQ_LEN)
    assert np.array_equal(batch.input_ids, np.concatenate([want, want[:2]]))
    assert np.array_equal(batch.labels[:, :-1], batch.input_ids[:, 1:]) and np.all(batch.labels[:, -1] == IGNORE)
    crossing = [i for i in range(n) if len({int(np.searchsorted(chunk_bounds(cell, docs[cell]), x, "right"))
                                            for x in (i * SEQ_LEN, (i + 1) * SEQ_LEN - 1)}) > 1]
    assert crossing  # the case that matters: windows running on into the next chunk file (or part)


def _parquet_twin(root: Path, docs: dict[str, list[np.ndarray]], docs_per_shard: int) -> None:
    """The same documents, in the same order, as a Parquet corpus cut into shards of its own."""
    tok = json.dumps({"model": {"type": "synthetic", "vocab_size": 400}}).encode()
    root.mkdir(parents=True)
    (root / TOKENIZER).write_bytes(tok)
    info = TokenizerInfo("synthetic", hashlib.sha256(tok).hexdigest(), vocab_size=400, eos_id=0)
    records = []
    for subset, documents in docs.items():
        for n, a in enumerate(range(0, len(documents), docs_per_shard)):
            part = documents[a:a + docs_per_shard]
            offsets = np.concatenate([[0], np.cumsum([len(d) for d in part])]).astype(np.int64)
            st = write_shard(root / shard_path(subset, n), [str(i) for i in range(len(part))],
                             flat(part).astype(np.uint32), offsets, info)
            records.append(ShardRecord(shard_path(subset, n), subset, st.bytes, st.sha256, st.docs, st.tokens,
                                       st.row_groups))
    commit_corpus(root, Manifest("twin", "0", info, {s: SubsetInfo(0, 0, 0, 0) for s in docs}), records)


def test_levanter_windows_of_a_pinned_store_are_those_of_the_same_documents_in_parquet(pinned, cache_dir, tmp_path):
    """Levanter's windows do not depend on how the tokens are cut into files: the same mixture over the same
    documents, as a Parquet corpus, serves the same training and validation streams."""
    store, docs = pinned
    _parquet_twin(tmp_path / "twin", docs, docs_per_shard=37)
    config = LoaderConfig(seq_len=SEQ_LEN, batch_size=4, packing="levanter", shuffle="feistel", val_fraction=0.05,
                          mixture=[Phase({"cluster=*/quality=4": 1.0}, 64), Phase({"cluster=0/*": 0.7,
                                                                                 "cluster=1/*": 0.3})])
    ours, twin = TokenStream(store, config, cache_dir=cache_dir), TokenStream(tmp_path / "twin", config,
                                                                             cache_dir=tmp_path / "c")
    assert ours.subsets == twin.subsets and ours.sizes() == twin.sizes()
    for split, n in (("train", 400), ("validation", sum(ours.sizes("validation").values()))):
        a, b = ours.read(np.arange(n), split), twin.read(np.arange(n), split)
        assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.labels, b.labels)
        assert np.array_equal(a.subset, b.subset)


GOLDEN = json.loads((FIXTURES / "EXPECTED.json").read_text())["caches"]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_levanter_windows_of_the_golden_caches_are_the_documents_real_levanter_read(name, tmp_path):
    shutil.copytree(FIXTURES / name, tmp_path / "cache")
    adopt(tmp_path / "cache", tokenizer=str(wide_tokenizer(tmp_path / "tok")), name="cell")  # ids up to 127,924
    seq_len = 7  # a prime: windows cut documents anywhere
    stream = TokenStream(tmp_path / "cache", LoaderConfig(seq_len=seq_len, batch_size=1, packing="levanter",
                                                          shuffle="none", val_fraction=0), cache_dir=tmp_path / "c")
    levanter = GOLDEN[name]["documents"]
    lengths = [d["length"] if isinstance(d, dict) else len(d) for d in levanter]
    n = sum(lengths) // seq_len
    assert stream.sizes() == {"cell": n}
    served = stream.read(np.arange(n)).input_ids.reshape(-1)  # windows i*L..(i+1)*L, back to back
    for doc, a, b in zip(levanter, np.cumsum([0, *lengths[:-1]]), np.cumsum(lengths)):
        if b <= len(served):
            ours = served[a:b]
            assert (len(ours) == doc["length"] and hashlib.sha256(ours.astype("<i8").tobytes()).hexdigest()
                    == doc["sha256_int64le"]) if isinstance(doc, dict) else ours.tolist() == doc
        elif a < len(served) and not isinstance(doc, dict):
            assert served[a:].tolist() == doc[:len(served) - a]  # the window the tail ends in


@pytest.mark.parametrize("packing", ["overlap", "levanter"])
@pytest.mark.parametrize("rank_rows, world, workers, batch", [("position", 1, 0, 3), ("position", 3, 2, 2),
                                                              ("shard", 2, 0, 5)])
def test_a_resumed_mixture_over_cells_is_the_uninterrupted_stream(pinned, cache_dir, packing, rank_rows, world,
                                                                  workers, batch):
    store, _ = pinned
    config = LoaderConfig(seq_len=SEQ_LEN, packing=packing, segments=packing == "overlap", val_fraction=0.02,
                          mixture=[Phase({"cluster=*/quality=4": 1.0}, 96), Phase({"cluster=0/*": 0.6,
                                                                                 "cluster=1/*": 0.4})])
    start = 89  # across the phase change
    uninterrupted = TokenStream(store, config, cache_dir=cache_dir)
    reference = uninterrupted.read(np.arange(start, start + 3 * world * batch))
    ranks = []
    for rank in range(world):
        stream = TokenStream(store, replace(config, batch_size=batch, rank_rows=rank_rows), cache_dir=cache_dir)
        dataset = TokenDataset(stream, rank=rank, world_size=world, position=start, prefetch=0 if workers else 2)
        ranks.append(take(TokenLoader(dataset, num_workers=workers), 3))
    check_global_stream(ranks, start, reference, stream=uninterrupted if rank_rows == "shard" else None)


def test_a_checkpoint_resumes_on_another_world_size_worker_count_and_batch(pinned, cache_dir):
    store, _ = pinned
    config = LoaderConfig(seq_len=SEQ_LEN, mixture={"cluster=0/*": 0.5, "cluster=1/*": 0.5}, val_fraction=0.02)
    loaders = [make_loader(store, replace(config, batch_size=3), rank=r, world_size=2, cache_dir=cache_dir,
                           num_workers=1) for r in range(2)]
    before = [take(loader, 2) for loader in loaders]
    state = loaders[0].state_dict()
    after = [take(make_loader(store, replace(config, batch_size=4), rank=r, world_size=3, cache_dir=cache_dir,
                              state=state), 2) for r in range(3)]
    uninterrupted = TokenStream(store, config, cache_dir=cache_dir)
    check_global_stream(before, 0, uninterrupted.read(np.arange(state["position"])))
    check_global_stream(after, state["position"], uninterrupted.read(np.arange(state["position"],
                                                                               state["position"] + 24)))


def test_the_fingerprint_covers_the_selected_cells_files_so_a_partial_download_resumes(pinned, cache_dir, tmp_path):
    from marin_data.transfer.download import download

    store, _ = pinned
    config = LoaderConfig(seq_len=SEQ_LEN, batch_size=4, subsets=["cluster=*/quality=4"])
    full = make_loader(store, config, cache_dir=cache_dir)
    next(iter(full))
    state = full.state_dict()
    assert download(str(store), subsets=["cluster=*/quality=4"], dest=tmp_path / "dl", progress=False).ok
    assert not (tmp_path / "dl/cluster=0/quality=0").exists()
    part = make_loader(tmp_path / "dl", config, cache_dir=tmp_path / "c", state=state)  # the same stream
    assert np.array_equal(next(iter(part))["input_ids"].numpy(), full.dataset.stream.read(range(4, 8)).input_ids)
    chosen = {s.path for s in load_corpus(store).shards if s.subset.endswith("quality=4")}
    assert full.dataset.stream.components["data"] == TokenStream(tmp_path / "dl", config).components["data"]
    assert {s.path for s in full.dataset.stream.shards} < chosen  # data chunk files to decode; every file hashed
    assert {s.kind for s in full.dataset.stream.shards} == {SHARD}


def test_every_file_a_decode_reads_is_checked_against_the_index_first(pinned, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(pinned[0], store)
    config = LoaderConfig(seq_len=SEQ_LEN, batch_size=4, subsets=["cluster=0/quality=0"], shuffle="none")
    good = TokenStream(store, config, cache_dir=tmp_path / "good").read(range(4)).input_ids
    for rel in ("cluster=0/quality=0/input_ids/data/c/0", "cluster=0/quality=0/input_ids/offsets/c/0"):
        path = store / rel
        data = path.read_bytes()
        path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
        stream = TokenStream(store, config, cache_dir=tmp_path / rel.replace("/", "-"))
        with pytest.raises(ShardChecksumError, match=rel):
            stream.read(range(4))
        path.write_bytes(data)
    assert np.array_equal(TokenStream(store, config, cache_dir=tmp_path / "again").read(range(4)).input_ids, good)
    zarr = store / "cluster=0/quality=0/input_ids/data/zarr.json"
    zarr.write_bytes(zarr.read_bytes().replace(b'"int32"', b'"int64"'))  # a reader would decode other values
    with pytest.raises(ShardChecksumError, match="zarr.json"):
        TokenStream(store, config, cache_dir=tmp_path / "z")


def test_a_decode_sealed_among_other_document_boundaries_is_never_served(tmp_path, tiny_tokenizer):  # noqa: F811
    """Two caches of the same tokens cut into documents differently have byte-identical data chunk files;
    the decode of one is never mapped for the other (its seal names its part's offsets), and one corpus
    holding both is refused, its decodes being keyed by the file's sha256. The fingerprint tells them apart."""
    from marin_data.levanter import write_cache

    docs = [np.arange(1, 40), np.arange(50, 90), np.arange(7, 30)]
    joined = [np.concatenate(docs[:2]), docs[2]]
    for name, documents in (("split", docs), ("joined", joined)):
        write_cache(tmp_path / name / "cell", documents, chunk=CHUNK, inner=256)
        adopt(tmp_path / name, tokenizer=str(tiny_tokenizer))
    config = LoaderConfig(seq_len=20, batch_size=1, segments=True, shuffle="none", val_fraction=0)
    chunk = "cell/input_ids/data/c/0"
    assert (tmp_path / "split" / chunk).read_bytes() == (tmp_path / "joined" / chunk).read_bytes()
    for name, documents in (("split", docs), ("joined", joined), ("split", docs)):  # one decode folder for all
        batch = TokenStream(tmp_path / name, config, cache_dir=tmp_path / "c").read(range(4))
        starts = document_starts(documents)
        assert all(np.array_equal(batch.segment_ids[r], expected_segments(starts, 20 * r, 20)[0]) for r in range(4))
    streams = [TokenStream(tmp_path / name, config, cache_dir=tmp_path / "c") for name in ("split", "joined")]
    assert streams[0].fingerprint != streams[1].fingerprint  # the offsets differ: another stream
    shutil.copytree(tmp_path / "joined/cell", tmp_path / "both/b")
    shutil.copytree(tmp_path / "split/cell", tmp_path / "both/a")
    adopt(tmp_path / "both", tokenizer=str(tiny_tokenizer))
    with pytest.raises(InvalidManifestError, match="same bytes"):
        TokenStream(tmp_path / "both", config, cache_dir=tmp_path / "c")


def test_an_unpinned_cache_or_store_is_refused_naming_adopt(tmp_path, capsys):
    from marin_train.cli import main

    make_store(tmp_path / "store", {"cluster=0/quality=0": 20})
    for path in (tmp_path / "store", tmp_path / "store/cluster=0/quality=0"):
        with pytest.raises(UnpinnedCacheError, match="unpinned Levanter"):
            make_loader(path)
    with pytest.raises(SystemExit) as exit_:
        main(["--data", str(tmp_path / "store"), "--steps", "1"])
    assert exit_.value.code == 22 and "marin-data adopt" in capsys.readouterr().err


def test_levanter_packing_has_no_segment_ids_and_an_unknown_packing_is_named(pinned):
    with pytest.raises(LoaderConfigError, match="segment ids"):
        TokenStream(pinned[0], LoaderConfig(packing="levanter", segments=True))
    with pytest.raises(LoaderConfigError, match="overlap, levanter"):
        TokenStream(pinned[0], LoaderConfig(packing="tight"))


@pytest.fixture
def on_s3(pinned, moto, bucket_url, tmp_path):  # noqa: F811
    from marin_data.transfer.publish_s3 import publish

    copy = tmp_path / "copy"
    shutil.copytree(pinned[0], copy)  # publish records the bucket in the copy's manifest, not the fixture's
    publish(copy, to=bucket_url, endpoint_url=moto, progress=False)
    return bucket_url


@pytest.mark.parametrize("packing", ["overlap", "levanter"])
def test_a_pinned_store_on_s3_streams_what_its_local_copy_serves_within_the_cache_limit(pinned, on_s3, moto,
                                                                                       cache_dir, tmp_path, packing):
    from marin_data.loader.remote.budget import decoded_bytes

    store, _ = pinned
    config = LoaderConfig(seq_len=SEQ_LEN, batch_size=4, packing=packing, segments=packing == "overlap",
                          mixture={"cluster=*/quality=4": 1.0}, shuffle_window=1, val_fraction=0.02)
    local = TokenStream(store, config, cache_dir=cache_dir)
    chosen = [s for s in load_corpus(store).shards if s.kind == SHARD and s.subset.endswith("quality=4")]
    limit = sum(decoded_bytes(s) + s.bytes for s in chosen) // 2
    loader = make_loader(on_s3, config, cache_dir=tmp_path / "remote", cache_bytes=limit, endpoint_url=moto)
    stream = loader.dataset.stream
    assert stream.fingerprint == local.fingerprint  # the same stream: a checkpoint resumes on either
    batches = take(loader, 30)  # most of a pass over both cells
    state = loader.state_dict()
    stats = stream.source.stats()
    stream.close()
    for batch in batches:
        want = local.read(batch["index"])
        assert np.array_equal(batch["input_ids"], want.input_ids) and np.array_equal(batch["labels"], want.labels)
        if packing == "overlap":
            assert np.array_equal(batch["segment_ids"], want.segment_ids)
    assert stats.high_water <= limit and set(stats.fetches) <= {s.path for s in chosen}  # data chunk files only
    resumed = make_loader(store, config, cache_dir=cache_dir, state=state)
    assert np.array_equal(next(iter(resumed))["input_ids"].numpy(), local.read(range(120, 124)).input_ids)


def test_a_damaged_response_for_any_file_of_a_cell_is_read_again_and_never_served(pinned, on_s3, proxy, cache_dir,
                                                                                   tmp_path):  # noqa: F811
    from faultproxy import Fault
    from s3_env import FAST

    store, _ = pinned
    part = "part-00001-of-00003"  # of the one sharded cell (a request's path has "=" escaped)
    victims = [f"{part}/shard_ledger.json", f"{part}/input_ids/data/zarr.json", f"{part}/input_ids/offsets/c/0",
               f"{part}/input_ids/data/c/0"]
    for victim in victims:
        proxy.add(Fault("corrupt", match=victim, times=1))
    config = LoaderConfig(seq_len=SEQ_LEN, batch_size=4, subsets=["cluster=1/quality=4"], segments=True)
    loader = make_loader(on_s3, config, cache_dir=tmp_path / "remote", endpoint_url=proxy.endpoint, policy=FAST)
    local = TokenStream(store, config, cache_dir=cache_dir)
    for batch in take(loader, local.sizes()["cluster=1/quality=4"] // 4):  # a pass: every chunk file read
        assert np.array_equal(batch["segment_ids"], local.read(batch["index"]).segment_ids)
    loader.dataset.stream.close()
    assert {v: [r.fault for r in proxy.requests(v)] for v in victims} == {v: ["corrupt", None] for v in victims}


def test_a_pinned_store_streams_from_the_hub_and_an_unpinned_one_on_s3_is_refused(pinned, moto, bucket_url,
                                                                                  cache_dir, tmp_path):  # noqa: F811
    from marin_data.testing.mirror import running_mirror

    store, _ = pinned
    shutil.copytree(store, tmp_path / "hub/team/store")
    config = LoaderConfig(seq_len=SEQ_LEN, batch_size=4, packing="levanter", subsets=["cluster=1/*"])
    local = TokenStream(store, config, cache_dir=cache_dir)
    with running_mirror(tmp_path / "hub") as mirror:
        loader = make_loader("hf://datasets/team/store", config, cache_dir=tmp_path / "remote", endpoint=mirror.url,
                             manifest_sha256=load_corpus(store).manifest_sha256)
        got = take(loader, 3)
        loader.dataset.stream.close()
    assert all(np.array_equal(b["input_ids"], local.read(b["index"]).input_ids) for b in got)
    make_store(tmp_path / "raw", {"cluster=0/quality=0": 20})
    bucket, prefix = bucket_url[len("s3://"):].split("/", 1)
    for rel in tree_bytes(tmp_path / "raw"):
        s3_client(moto).upload_file(str(tmp_path / "raw" / rel), bucket, f"{prefix}/{rel}")
    with pytest.raises(UnpinnedCacheError, match="unpinned Levanter store"):
        make_loader(bucket_url, config, cache_dir=tmp_path / "r2", endpoint_url=moto)


def test_marin_train_trains_on_a_pinned_store_local_and_on_s3_and_resumes(pinned, on_s3, moto, tmp_path, capsys):
    from marin_train.cli import main

    for data, flags in ((str(pinned[0]), []), (on_s3, ["--endpoint-url", moto, "--cache-dir", str(tmp_path / "c")])):
        run = tmp_path / data.replace("/", "-").replace(":", "")
        args = ["--data", data, *flags, "--steps", "3", "--batch-size", "2", "--seq-len", "32", "--log-every", "1",
                "--checkpoint-dir", str(run), "--mixture", "cluster=*/quality=4=0.5",
                "--mixture", "cluster=0/quality=0=0.5"]
        for until in ("2", "3"):
            with pytest.raises(SystemExit) as exit_:
                main([*args, "--until", until])
            assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert "resumed from" in out and "done: step 3" in out, out
