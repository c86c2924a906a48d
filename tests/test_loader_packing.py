"""Packing, the decoded-shard cache and held-out windows, over real Parquet corpora."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from loader_checks import check_batch, check_permutation, reference_tokens, window_ids, window_of

from marin_data.errors import LoaderConfigError, ShardFormatError, ShardMissingError
from marin_data.loader import DecodedShardCache, LoaderConfig, TokenStream
from marin_data.loader.holdout import held_before, holdout_every, train_indices, train_windows, val_windows
from marin_data.corpus.shard import read_shard


@pytest.fixture
def stream(make_corpus, tmp_path):
    # Many small shards and documents, so windows of 32 + 1 tokens cross document and shard boundaries.
    corpus = make_corpus({"a": [30, 50, 10, 40], "b/x": [20, 20, 20], "b/y": [60]}, doc_tokens=(1, 40))
    return TokenStream(corpus, LoaderConfig(seq_len=32, batch_size=4, val_fraction=0.1, segments=True),
                       cache_dir=tmp_path / "cache")


def test_windows_are_seq_len_plus_one_tokens_of_the_concatenated_documents_within_one_shard(stream):
    reference = reference_tokens(stream)
    positions = np.arange(300)
    batch = stream.read(positions)
    subset, start = stream.locate(positions)
    for r in range(len(positions)):
        expected = reference[subset[r]][start[r] : start[r] + 33]
        assert np.array_equal(window_of(batch)[r], expected)
    window_ids(stream, subset, start)  # each on its shard's grid, inside the shard


def test_each_shard_holds_its_own_windows_and_drops_less_than_one_sequence(stream):
    for tokens in stream.subset_tokens:
        per_shard = np.diff(tokens.window_starts(32))
        assert np.array_equal(per_shard, [max(0, (s.tokens - 1) // 32) for s in tokens.shards])
        served = per_shard * 32 + (per_shard > 0)
        assert np.all(np.array([s.tokens for s in tokens.shards]) - served < 33)


def test_labels_are_inputs_shifted_by_one_and_segments_follow_eos(stream):
    from marin_data.loader import to_tensors

    batch = stream.read(np.arange(200))
    tensors = to_tensors(batch)
    assert np.array_equal(tensors["labels"][:, :-1].numpy(), tensors["input_ids"][:, 1:].numpy())
    check_batch(window_of(batch), batch.segment_ids, batch.positions)
    assert batch.segment_ids.max() > 0, "the corpus should put several documents in a window"


def test_input_ids_and_labels_are_contiguous_in_both_tensor_forms(stream):
    from marin_data.loader import to_tensors

    batch = stream.read(np.arange(8))
    for tensors in (to_tensors(batch), to_tensors(batch, one_storage=True)):
        assert all(tensors[k].is_contiguous() for k in tensors)
        assert tensors["labels"].view(-1)[0] == tensors["input_ids"][0, 1]  # flattening for a loss works


def test_a_shard_table_with_fewer_slots_than_shards_evicts_grows_and_serves_the_same_windows(stream):
    from marin_data.loader.packing import ShardTable

    positions = np.arange(400)
    expected = stream.read(positions)  # read through the default table, which holds every shard of this corpus
    assert len(np.unique(stream.shard_ids(positions))) > 2
    table = stream._table = ShardTable(stream.source, stream.shards, stream._cumulative.flat,
                                       stream._cumulative.offsets, capacity=2)
    for first in range(0, 400, 2):  # two rows at a time: at most two shards a batch, so slots are reused
        batch = stream.read(range(first, first + 2))
        for name in ("input_ids", "labels", "segment_ids", "positions"):
            assert np.array_equal(getattr(batch, name), getattr(expected, name)[first : first + 2]), (first, name)
    assert len(table.used) == 2 and sorted(table.shard_in) == sorted(np.flatnonzero(table.slot_of >= 0))
    batch = stream.read(positions)  # one batch over more shards than slots: the table grows
    assert len(table.used) > 2 and np.array_equal(batch.buffer, expected.buffer)


def test_without_segments_a_batch_holds_the_same_tokens_and_no_document_arrays(stream):
    from dataclasses import replace

    from marin_data.loader import to_tensors

    plain = TokenStream(stream.corpus, replace(stream.config, segments=False), source=stream.source)
    assert plain.fingerprint == stream.fingerprint  # the same stream: a checkpoint resumes either way
    positions = np.arange(100)
    batch, full = plain.read(positions), stream.read(positions)
    for name in ("input_ids", "labels", "subset", "index"):
        assert np.array_equal(getattr(batch, name), getattr(full, name)), name
    assert batch.segment_ids is None and batch.positions is None
    assert batch.buffer.nbytes == full.buffer.nbytes - 2 * 4 * 100 * 32
    for tensors in (to_tensors(batch), to_tensors(batch, one_storage=True)):
        assert sorted(tensors) == ["index", "input_ids", "labels", "subset"]
        assert np.array_equal(tensors["labels"].numpy(), full.labels)
        for sent in (tensors, pickle.loads(pickle.dumps(tensors))):  # as a DataLoader worker hands it over
            with pytest.raises(KeyError, match=r"segment_ids.*LoaderConfig\(segments=True\)"):
                sent["segment_ids"]
            with pytest.raises(KeyError, match="^'nope'$"):
                sent["nope"]


def test_a_window_that_starts_at_a_document_start_has_no_carried_over_segment(make_corpus, tmp_path):
    corpus = make_corpus({"a": [40]}, doc_tokens=(7, 7))  # every document is 7 tokens + EOS = 8
    stream = TokenStream(corpus, LoaderConfig(seq_len=8, val_fraction=0, shuffle="none", segments=True),
                         cache_dir=tmp_path / "c")
    batch = stream.read(np.arange(5))
    assert np.all(batch.segment_ids == 0) and np.array_equal(batch.positions[0], np.arange(8))
    assert np.all(batch.input_ids[:, 7] == 0) and np.all(batch.labels[:, 7] != 0)


def test_every_training_window_of_a_subset_is_served_once_per_epoch_in_a_new_order(stream):
    sizes = stream.sizes()
    positions = np.arange(stream.mixture.phases[0].block)  # a whole mixture block: counters are complete
    subset, start = stream.locate(positions)
    _, index = stream.mixture.locate(positions)  # each subset's own sequence counter
    for k, name in enumerate(stream.subsets):
        mine = np.argsort(np.where(subset == k, index, np.iinfo(np.int64).max))
        windows = window_ids(stream, subset[mine], start[mine])  # this subset's windows in its counter's order
        epochs = [windows[e * sizes[name] : (e + 1) * sizes[name]] for e in range(2)]
        for epoch in epochs:
            assert len(np.unique(epoch)) == sizes[name], f"{name}: a sequence repeats within an epoch"
        assert np.array_equal(np.sort(epochs[0]), np.sort(epochs[1]))
        assert not np.array_equal(epochs[0], epochs[1]), f"{name}: the second epoch repeats the first's order"


def test_training_and_validation_streams_are_disjoint_and_cover_every_window(stream):
    train = stream.sizes()
    val = stream.sizes("validation")
    subset, start = stream.locate(np.arange(stream.mixture.phases[0].block))
    vsubset, vstart = stream.locate(np.arange(stream.stop("validation")), "validation")
    for k, name in enumerate(stream.subsets):
        t = set(window_ids(stream, subset[subset == k], start[subset == k]).tolist())
        v = window_ids(stream, vsubset[vsubset == k], vstart[vsubset == k]).tolist()
        assert len(v) == len(set(v)) == val[name] > 0
        assert not t & set(v), f"{name}: the training stream serves a validation sequence"
        assert t | set(v) == set(range(train[name] + val[name]))


def test_held_out_windows_are_spread_one_per_run_and_keyed_by_name_not_seed():
    every = holdout_every(0.01)
    val = int(held_before(np.array([1050]), 1050, every, 3)[0])
    train = 1050 - val
    assert (train, val, every) == (1040, 10, 100)

    def both(i):  # training indices first, then held-out ones: together a bijection onto the windows
        out = np.empty_like(i)
        out[i < train] = train_windows(i[i < train], 1050, every, 3)
        out[i >= train] = val_windows(i[i >= train] - train, every, 3)
        return out

    check_permutation(both, 1050)
    held = val_windows(np.arange(10), every, 3)
    assert np.array_equal(held // every, np.arange(10))
    w = np.arange(1051)
    assert np.array_equal(held_before(w, 1050, every, 3), np.searchsorted(held, w))
    back = train_indices(np.arange(1050), 1050, every, 3)  # the inverse: held-out windows have no index
    assert np.array_equal(np.flatnonzero(back < 0), held)
    assert np.array_equal(back[train_windows(np.arange(train), 1050, every, 3)], np.arange(train))


def test_validation_set_does_not_depend_on_the_seed(make_corpus, tmp_path):
    corpus = make_corpus({"a": [30]})
    streams = [TokenStream(corpus, LoaderConfig(seq_len=16, seed=seed, val_fraction=0.2), cache_dir=tmp_path)
               for seed in (1, 2)]
    held = [set(s.locate(np.arange(s.stop("validation")), "validation")[1].tolist()) for s in streams]
    assert held[0] == held[1]
    assert not np.array_equal(*(s.locate(np.arange(50))[1] for s in streams))


def test_cache_decodes_each_shard_once_into_memory_maps_equal_to_the_parquet(make_corpus, tmp_path):
    corpus = make_corpus({"a": [5, 7]})
    cache = DecodedShardCache(corpus.root, tmp_path / "cache")
    shard = corpus.shards[1]
    decoded = cache.open(shard)
    _, tokens, offsets = read_shard(corpus.root / shard.path)
    assert np.array_equal(decoded.tokens, tokens) and np.array_equal(decoded.offsets, offsets)
    cache.wait()  # the decode is served at once and stored in the background
    tokens_path, _ = cache.paths(shard)
    mtime = tokens_path.stat().st_mtime_ns
    (corpus.root / shard.path).unlink()  # a second cache over the same directory never reads Parquet again
    again = DecodedShardCache(corpus.root, tmp_path / "cache").open(shard)
    assert np.array_equal(again.tokens, tokens) and tokens_path.stat().st_mtime_ns == mtime
    assert not list((tmp_path / "cache").rglob("*.part"))


def test_other_caches_and_processes_reuse_a_decode_still_being_stored(make_corpus, tmp_path):
    import subprocess
    import sys

    corpus = make_corpus({"a": [50]})
    first = DecodedShardCache(corpus.root, tmp_path / "cache")
    tokens = np.array(first.open(corpus.shards[0]).tokens)
    (corpus.root / corpus.shards[0].path).unlink()  # from now on only the first decode can serve it
    same_process = DecodedShardCache(corpus.root, tmp_path / "cache").open(corpus.shards[0])
    assert np.array_equal(same_process.tokens, tokens)
    code = ("import sys, numpy as np\nfrom marin_data.corpus.manifest import load_corpus\n"
            "from marin_data.loader import DecodedShardCache\n"
            "c = load_corpus(sys.argv[1])\n"
            "print(int(DecodedShardCache(c.root, sys.argv[2]).open(c.shards[0]).tokens.astype(np.int64).sum()))")
    out = subprocess.run([sys.executable, "-c", code, str(corpus.root), str(tmp_path / "cache")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == int(tokens.astype(np.int64).sum())


def test_cache_names_a_missing_shard_and_refuses_one_that_disagrees_with_the_index(make_corpus, tmp_path):
    corpus = make_corpus({"a": [5, 7]})
    cache = DecodedShardCache(corpus.root, tmp_path / "cache")
    (corpus.root / corpus.shards[0].path).unlink()
    with pytest.raises(ShardMissingError, match="part-00000"):
        cache.open(corpus.shards[0])
    with pytest.raises(ShardFormatError, match="index says"):
        cache.open(corpus.shards[1]._replace(tokens=corpus.shards[1].tokens + 1))


def test_a_subset_too_short_for_one_sequence_is_refused_by_name(make_corpus, tmp_path):
    corpus = make_corpus({"a": [30], "tiny": [1]}, doc_tokens=(3, 3))
    with pytest.raises(LoaderConfigError, match="tiny"):
        TokenStream(corpus, LoaderConfig(seq_len=64), cache_dir=tmp_path)
    assert TokenStream(corpus, LoaderConfig(seq_len=64, mixture={"a": 1, "tiny": 0}), cache_dir=tmp_path)


def test_a_pass_reads_each_shard_in_one_stretch_shared_with_at_most_window_shards(make_corpus, tmp_path):
    corpus = make_corpus({"a": [12] * 16}, doc_tokens=(20, 60))  # 16 shards of ~500 tokens
    stream = TokenStream(corpus, LoaderConfig(seq_len=16, val_fraction=0.05, shuffle_window=2),
                         cache_dir=tmp_path)
    n = stream.sizes()["a"]
    _, start = stream.locate(np.arange(n))  # one subset: position j is its sequence j, so this is one pass
    shard = np.searchsorted(stream.subset_tokens[0].cumulative, start, side="right") - 1
    for s in range(16):
        first, last = np.flatnonzero(shard == s)[[0, -1]]
        assert len(np.unique(shard[first : last + 1])) <= 2, f"shard {s} is read in several stretches"
    stretches = shard[np.flatnonzero(np.diff(shard)) + 1]
    assert len(np.unique(shard)) == 16 and len(stretches) > 16, "shards of a window are not interleaved"
    order = shard[np.sort(np.unique(shard, return_index=True)[1])]  # shards in order of first read
    assert not np.array_equal(order, np.arange(16)), "the shards are read in path order"


def test_map_npy_maps_read_only_including_an_empty_array(tmp_path):
    from marin_data.loader.cache import map_npy

    for name, array in (("tokens", np.arange(5000, dtype=np.uint32)), ("empty", np.zeros(0, np.int64))):
        np.save(tmp_path / f"{name}.npy", array)
        mapped = map_npy(tmp_path / f"{name}.npy")
        assert np.array_equal(mapped, array) and mapped.dtype == array.dtype and not mapped.flags.writeable


def test_a_filled_map_is_read_without_page_faults(tmp_path):
    import resource
    import sys

    from marin_data.loader.cache import _fill_pages

    if sys.platform != "linux":
        pytest.skip("MADV_POPULATE_READ is Linux's")
    np.save(tmp_path / "t.npy", np.arange(32 << 20, dtype=np.uint32))  # 128 MiB: 32,768 pages

    def faults_reading(fill: bool) -> int:
        mapped = np.load(tmp_path / "t.npy", mmap_mode="r")
        if fill and (failed := _fill_pages(mapped.ctypes.data, mapped.nbytes)) != 0:
            pytest.skip(f"this kernel does not fill page tables (errno {failed})")
        np.add.reduce(np.arange(4096)[::1024], dtype=np.int64)  # numpy's buffers are in place before counting
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt  # this thread's: not a filler thread's
        assert int(np.add.reduce(mapped[::1024], dtype=np.int64)) == sum(range(0, 32 << 20, 1024))  # each page
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

    unfilled, filled = faults_reading(False), faults_reading(True)
    assert unfilled >= 16 and filled <= unfilled // 4, (unfilled, filled)  # unfilled: a fault per 2 MiB or less


def _fill_in_child(path: str, out) -> None:
    from marin_data.loader import cache

    cache.map_npy(path)
    out.put(cache._filler[1].submit(int, 7).result(timeout=20))  # the child's filler runs tasks


def test_a_forked_worker_gets_its_own_filler_thread(tmp_path):
    import multiprocessing

    from marin_data.loader import cache

    np.save(tmp_path / "t.npy", np.arange(1000, dtype=np.uint32))
    cache.map_npy(tmp_path / "t.npy")  # the parent's filler thread exists before the fork
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_fill_in_child, args=(str(tmp_path / "t.npy"), out))
    child.start()
    try:
        assert out.get(timeout=30) == 7
    finally:
        child.join(timeout=30)
    assert child.exitcode == 0


def _decode_in_child(cache, shard, out) -> None:
    cache.open(shard)  # decodes, and publishes on a thread of this process
    cache.wait()
    out.put(True)


def test_a_forked_worker_publishes_its_decodes_on_its_own_thread(make_corpus, tmp_path):
    import multiprocessing

    from marin_data.loader.cache import sealed

    corpus = make_corpus({"a": [30, 30]})
    cache = DecodedShardCache(corpus.root, tmp_path / "cache")
    first, second = corpus.shards
    cache.open(first)  # the parent's publishing thread exists before the fork
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_decode_in_child, args=(cache, second, out))
    child.start()
    try:
        assert out.get(timeout=30)
    finally:
        child.join(timeout=30)
    cache.wait()
    assert child.exitcode == 0 and all(sealed(cache.paths(s)[0].parent, s) for s in (first, second))
