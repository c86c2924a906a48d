"""Ranks, workers and resume: the stream of sequences never depends on how it is read."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import build_corpus
from loader_checks import check_global_stream, take

from marin_data.errors import LoaderConfigError, LoaderStateMismatchError
from marin_data.loader import LoaderConfig, Phase, TokenDataset, TokenLoader, TokenStream, make_loader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers, 2 cores

SEQ_LEN = 16
STEPS = 3
RESUME_AT = 1_234  # a resume position that is no multiple of any global batch below


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("corpus"), {"a": [40, 30], "b/x": [25], "b/y": [15, 20]},
                        doc_tokens=(1, 30))


@pytest.fixture(scope="module")
def config():
    return LoaderConfig(seq_len=SEQ_LEN, mixture=[Phase({"a": 0.5, "b": 0.5}, 1200), Phase({"a": 0.2, "b/x": 0.8})],
                        val_fraction=0.05, mixture_block=64)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _stream(corpus, config, cache, batch_size: int, rank_rows: str = "auto") -> TokenStream:
    return TokenStream(corpus, replace(config, batch_size=batch_size, rank_rows=rank_rows), cache_dir=cache)


def _ranks(corpus, config, cache, world: int, workers: int, batch: int, position: int,
           rank_rows: str) -> list[list[dict]]:
    out = []
    for rank in range(world):
        dataset = TokenDataset(_stream(corpus, config, cache, batch, rank_rows), rank=rank, world_size=world,
                               position=position, prefetch=0 if workers else 2)
        out.append(take(TokenLoader(dataset, num_workers=workers), STEPS))
    return out


def _dealt_by(rank_rows: str, stream: TokenStream) -> TokenStream | None:
    """`check_global_stream`'s ``stream`` argument for ranks dealt ``rank_rows``."""
    return stream if rank_rows == "shard" else None


# The whole product: worlds {1, 2, 3, 8} x workers {0, 1, 3} x per-rank batch sizes 1..5, with real
# DataLoader worker processes (60 cases, ~13 s in all). Rows dealt by shard (`marin_data.loader.ranks`) on a
# sample of the same (one rank is the same either way).
IN_PROCESS = [(w, 0, b) for w in (1, 2, 3, 8) for b in range(1, 6)]
WITH_WORKERS = [(w, n, b) for w in (1, 2, 3, 8) for n in (1, 3) for b in range(1, 6)]
BY_SHARD = [(2, 0, 5), (3, 0, 1), (8, 0, 3), (2, 3, 2), (3, 1, 4)]


@pytest.mark.parametrize("rank_rows, world, workers, batch",
                         [("position", *case) for case in IN_PROCESS + WITH_WORKERS]
                         + [("shard", *case) for case in BY_SHARD])
def test_stream_from_a_resume_position_is_the_uninterrupted_stream(corpus, config, cache, rank_rows, world, workers,
                                                                   batch):
    uninterrupted = _stream(corpus, config, cache, 1)
    reference = uninterrupted.read(np.arange(RESUME_AT, RESUME_AT + STEPS * world * batch))
    check_global_stream(_ranks(corpus, config, cache, world, workers, batch, RESUME_AT, rank_rows), RESUME_AT,
                        reference, stream=_dealt_by(rank_rows, uninterrupted))


def test_the_reference_stream_is_what_a_loader_run_from_the_start_serves(corpus, config, cache):
    """The resume tests compare with `TokenStream.read`; here that reference is checked against a loader
    that iterated, uninterrupted, from position 0 past the resume position."""
    batches = take(TokenDataset(_stream(corpus, config, cache, 2), prefetch=2), (RESUME_AT + 2 * STEPS) // 2)
    after = [b for b in batches if b["index"][0] >= RESUME_AT]
    assert after and after[0]["index"][0] == RESUME_AT
    check_global_stream([after], RESUME_AT, _stream(corpus, config, cache, 1).read(
        np.arange(RESUME_AT, RESUME_AT + 2 * len(after))))


@pytest.mark.parametrize("rank_rows", ["position", "shard"])
@pytest.mark.parametrize("first, second", [((2, 3, 3), (3, 0, 5)), ((1, 0, 4), (8, 1, 1)), ((3, 1, 2), (1, 3, 4))])
def test_checkpoint_taken_mid_run_resumes_with_another_world_worker_count_and_batch(corpus, config, cache,
                                                                                  first, second, rank_rows):
    (w1, n1, b1), (w2, n2, b2) = first, second
    loaders = [TokenLoader(TokenDataset(_stream(corpus, config, cache, b1, rank_rows), rank=r, world_size=w1,
                                        position=1190, prefetch=0 if n1 else 3), num_workers=n1) for r in range(w1)]
    before = [take(loader, 2) for loader in loaders]
    state = loaders[0].state_dict()
    assert state["position"] == 1190 + 2 * w1 * b1  # what the trainer got, not what workers produced
    after = []
    for r in range(w2):
        loader = TokenLoader(TokenDataset(_stream(corpus, config, cache, b2, rank_rows), rank=r, world_size=w2),
                             num_workers=n2)
        loader.load_state_dict(state)
        after.append(take(loader, 2))
    uninterrupted = _stream(corpus, config, cache, 1)
    dealt_by = _dealt_by(rank_rows, uninterrupted)
    check_global_stream(before, 1190, uninterrupted.read(np.arange(1190, state["position"])), stream=dealt_by)
    check_global_stream(after, state["position"],
                        uninterrupted.read(np.arange(state["position"], state["position"] + 2 * w2 * b2)),
                        stream=dealt_by)


def test_rows_dealt_by_shard_keep_each_rank_on_its_own_shards_and_one_rank_is_dealt_by_position(make_corpus,
                                                                                               tmp_path):
    from marin_data.loader.ranks import RankRows

    corpus = make_corpus({name: [30] * 4 for name in "abcd"}, doc_tokens=(1, 30))
    # Four equal subsets and a global batch of one mixture block (4 ranks x 6): every global batch holds
    # exactly 6 rows of each subset, so dealt by shard, rank r reads subset r only.
    stream = TokenStream(corpus, LoaderConfig(seq_len=SEQ_LEN, batch_size=6, shuffle_window=1, mixture_block=24,
                                              mixture={name: 1 for name in "abcd"}), cache_dir=tmp_path)
    assert stream.rank_rows == "position"  # a local corpus's default
    assert np.array_equal(RankRows(0, 1, 6, "shard").rows(stream, 96), np.arange(96, 102))

    def reads(by: str, start: int) -> set[tuple[int, int]]:  # (rank, shard) pairs the batch at `start` reads
        return {(r, g) for r, rows in enumerate(RankRows(0, 4, 6, by).deal(stream, start))
                for g in stream.shard_ids(rows).tolist()}

    starts = range(0, 24 * 40, 24)
    by_shard = set().union(*(reads("shard", p) for p in starts))
    assert {(r, stream.shards[g].subset) for r, g in by_shard} == {(r, "abcd"[r]) for r in range(4)}
    by_position = set().union(*(reads("position", p) for p in starts))
    assert len(by_shard) < 0.3 * len(by_position)  # (rank, shard) pairs: fetches from a remote corpus
    with pytest.raises(LoaderConfigError, match="rank_rows"):
        TokenStream(corpus, LoaderConfig(rank_rows="random"), cache_dir=tmp_path)


@pytest.mark.parametrize("workers", [0, 3])
def test_state_counts_batches_handed_to_the_trainer_not_those_prefetched(corpus, config, cache, workers):
    loader = make_loader(corpus, config, num_workers=workers, prefetch=4, cache_dir=cache)
    got = take(loader, 5, state_each=True)
    assert [row["state_position"] for row in got] == [8 * (k + 1) for k in range(5)]
    again = take(loader, 1)  # a new iter() continues where the trainer stopped, not where prefetch did
    assert again[0]["index"][0] == 40


def test_mismatched_fingerprint_is_refused_naming_what_differs_unless_not_strict(corpus, config, cache):
    state = make_loader(corpus, config, cache_dir=cache).state_dict()
    other = make_loader(corpus, replace(config, seed=1), cache_dir=cache)
    with pytest.raises(LoaderStateMismatchError, match="seed"):
        other.load_state_dict(state)
    with pytest.raises(LoaderStateMismatchError, match="mixture"):
        make_loader(corpus, replace(config, mixture={"a": 1}), cache_dir=cache, state=state)
    with pytest.warns(UserWarning, match="strict=False"):
        other.load_state_dict({**state, "position": 77}, strict=False)
    assert other.position == 77
    same = make_loader(corpus, replace(config, batch_size=3), world_size=4, rank=1, cache_dir=cache, state=state)
    assert same.position == state["position"]


def test_a_state_of_another_seq_len_or_other_shards_is_refused(corpus, config, cache, tmp_path):
    state = make_loader(corpus, config, cache_dir=cache).state_dict()
    with pytest.raises(LoaderStateMismatchError, match=r"differs in: seq_len\)"):
        make_loader(corpus, replace(config, seq_len=SEQ_LEN // 2), cache_dir=cache, state=state)
    grown = build_corpus(tmp_path / "grown", {"a": [40, 30, 5], "b/x": [25], "b/y": [15, 20]}, doc_tokens=(1, 30))
    with pytest.raises(LoaderStateMismatchError, match=r"differs in: data"):  # a shard more: another corpus
        make_loader(grown, config, cache_dir=tmp_path / "cache", state=state)


@pytest.mark.parametrize("rank_rows", ["position", "shard"])
def test_validation_stream_is_finite_and_ends_with_the_last_whole_global_batch(corpus, config, cache, rank_rows):
    loaders = [make_loader(corpus, replace(config, batch_size=2, rank_rows=rank_rows), split="validation",
                           cache_dir=cache, rank=r, world_size=2) for r in range(2)]
    total = loaders[0].dataset.stream.stop("validation")
    per_rank = [take(loader, 10_000) for loader in loaders]
    assert len(per_rank[0]) == len(per_rank[1]) == total // 4 > 0 and total % 4
    stream = loaders[0].dataset.stream
    check_global_stream(per_rank, 0, stream.read(np.arange(total // 4 * 4), "validation"),
                        stream=_dealt_by(rank_rows, stream), split="validation")


def test_passes_report_how_often_each_subset_has_been_read(corpus, config, cache):
    stream = _stream(corpus, config, cache, 8)
    far = 50_000
    passes = stream.passes(far)
    served = stream.served(far)
    assert sum(served.values()) == far
    assert passes == {k: served[k] / n for k, n in stream.sizes().items()}
    assert passes["b/x"] > passes["b/y"]  # b/y left the mixture after phase 0
    loader = make_loader(corpus, replace(config, batch_size=8), cache_dir=cache, prefetch=0)
    take(loader, 3)  # what the trainer received: 24 sequences from position 0
    assert loader.passes() == stream.passes(24) and sum(stream.served(24).values()) == 24


def test_prefetch_thread_errors_surface_in_the_trainer(corpus, config, tmp_path):
    stream = TokenStream(corpus, config, cache_dir=tmp_path / "cache")
    (corpus.root / corpus.shards[0].path).rename(tmp_path / "moved.parquet")
    try:
        with pytest.raises(FileNotFoundError, match="part-00000"):
            take(TokenDataset(stream, prefetch=2), 50)
    finally:
        (tmp_path / "moved.parquet").rename(corpus.root / corpus.shards[0].path)


def test_the_quickstart_demo_resumes_on_another_world_size_identically(corpus, tmp_path, capsys):
    from marin_data.testing.demo import demo

    assert demo(corpus.root, seq_len=SEQ_LEN, cache_dir=tmp_path)
    assert "identical to the uninterrupted stream: True" in capsys.readouterr().out
