"""What a run saw (`marin_data.loader.trace`): each slot of a step is what the loader serves there, with the
documents its window touches; a document's steps are exactly the positions whose window holds one of its
tokens, found by inverting the order (checked here against a scan of every position); each subset's exposure
is what the stream serves. On a Parquet corpus, a pinned Levanter cache and a URL.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import build_corpus
from loader_checks import reference_tokens, take
from s3_env import bucket_url, moto  # noqa: F401 - fixtures

from marin_data.corpus.shard import read_shard
from marin_data.errors import LoaderConfigError, UnknownDocumentError
from marin_data.loader import LoaderConfig, Phase, TokenDataset, TokenStream
from marin_data.loader.packing import PACKINGS
from marin_data.loader.remote.stream import make_remote_loader
from marin_data.loader.trace import Trace, exposure, never_served

G = 8  # sequences per step
SCHEDULE = [Phase({"a": 0.6, "b/c": 0.4}, 160), Phase({"a": 0.2, "b/c": 0.8})]
CONFIG = LoaderConfig(seq_len=32, batch_size=4, seed=3, mixture=SCHEDULE, mixture_block=16, val_fraction=0.05)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """``b/c`` is small: the run passes over it several times; ``d`` is never weighed. Row groups of ~3,000
    tokens: windows cross them, and a trace reads only those it touches."""
    return build_corpus(tmp_path_factory.mktemp("trace") / "corpus", {"a": [60, 40], "b/c": [12], "d": [5]}, seed=2,
                        row_group_tokens=3000)


def parquet_spans(stream: TokenStream) -> dict[int, list[tuple[str, int, int]]]:
    """Each subset's documents as ``(id, first token, one past the last)`` in its stream, read from its shards."""
    out = {}
    for s, tokens in enumerate(stream.subset_tokens):
        spans = []
        for shard, base in zip(tokens.shards, tokens.cumulative):
            ids, _, offsets = read_shard(stream.corpus.root / shard.path)
            spans += [(i, int(base + a), int(base + b)) for i, a, b in zip(ids, offsets[:-1], offsets[1:])]
        out[s] = spans
    return out


def touched(spans: list[tuple[str, int, int]], lo: int, hi: int) -> list[tuple[str, int, int]]:
    """``(id, first, last)`` of the documents that share tokens with ``[lo, hi)``, counted from each one's start."""
    return [(i, max(lo, a) - a, min(hi, b) - 1 - a) for i, a, b in spans if a < hi and b > lo and b > a]


def scanned(stream: TokenStream, s: int, lo: int, hi: int, stop: int) -> np.ndarray:
    """Every position ``< stop`` whose window holds one of tokens ``[lo, hi)`` of subset ``s``, by scanning all."""
    subset, start = stream.locate(np.arange(stop))
    length = stream.seq_len + PACKINGS[stream.config.packing].extra
    return np.flatnonzero((subset == s) & (start < hi) & (start + length > lo))


def check_trace(trace: Trace, spans, steps: int) -> None:
    """Forward: every slot's window and documents; backward: each document of each step, against a full scan."""
    stream = trace.stream
    for step in range(1, steps + 1):
        for slot in trace.step(step):
            s = stream.subsets.index(slot.subset)
            assert [(d.id, d.first, d.last) for d in slot.documents] == touched(spans[s], *slot.tokens)
            for d in slot.documents:
                lo, hi = next((a, b) for i, a, b in spans[s] if i == d.id)
                found = trace.document(d.id, steps)
                assert slot.position in found
                assert np.array_equal(found, scanned(stream, s, lo, hi, steps * trace.global_batch)), d.id


@pytest.mark.parametrize("shuffle", ["hierarchical", "feistel", "none"])
@pytest.mark.parametrize("packing", ["overlap", "levanter"])
def test_each_document_of_a_step_is_traced_back_to_exactly_the_steps_that_served_it(corpus, shuffle, packing):
    stream = TokenStream(corpus, replace(CONFIG, shuffle=shuffle, packing=packing, shuffle_window=2))
    trace = Trace(stream, G)
    check_trace(trace, parquet_spans(stream), 60)
    assert stream.passes(60 * G)["b/c"] > 2  # the backward query crossed epochs


def test_each_slot_is_what_the_loader_serves_there_across_a_resume_at_another_world_size(corpus):
    stream = TokenStream(corpus, CONFIG)
    reference, trace = reference_tokens(stream), Trace(stream, G)
    ranks = [TokenDataset(stream, rank=r, world_size=2, prefetch=0) for r in range(2)]  # 2 ranks x 4 = G
    batches = [b for d in ranks for b in take(d, 3)]
    resumed = TokenDataset(TokenStream(corpus, replace(CONFIG, batch_size=G)), world_size=1, prefetch=0)
    resumed.load_state_dict(ranks[0].state_dict())
    batches += take(resumed, 3)
    served = {int(i): w for b in batches
              for i, w in zip(b["index"], np.concatenate([b["input_ids"], b["labels"][:, -1:]], axis=1))}
    assert sorted(served) == list(range(6 * G))
    for step in range(1, 7):
        for slot in trace.step(step):
            assert slot.step == step and slot.position == (step - 1) * G + slot.slot
            s = stream.subsets.index(slot.subset)
            assert np.array_equal(served[slot.position], reference[s][slot.tokens[0]:slot.tokens[1]])
            assert stream.shards[stream.shard_ids([slot.position])[0]].path == slot.shard
            assert slot.license == "CC0-1.0" and len(slot.sha256) == 64


def test_exposure_is_what_the_stream_serves_and_names_subsets_never_served(corpus):
    stream = TokenStream(corpus, CONFIG)
    table = exposure(stream, G, 50)
    subset, _ = stream.locate(np.arange(50 * G))
    sizes = stream.sizes()
    for s, e in enumerate(table):
        count = int(np.sum(subset == s))
        assert (e.subset, e.sequences, e.tokens) == (stream.subsets[s], count, count * 32)
        assert e.epochs == pytest.approx(count / sizes[e.subset])
        assert e.fraction == pytest.approx(min(count, sizes[e.subset]) / sizes[e.subset])
        assert e.first_step == int(np.flatnonzero(subset == s)[0]) // G + 1
    assert never_served(stream, table) == ["d"]
    late = TokenStream(corpus, replace(CONFIG, mixture=[Phase({"a": 1.0}, 64), Phase({"a": 0.5, "d": 0.5})]))
    table = exposure(late, G, 10)
    assert [(e.subset, e.first_step) for e in table] == [("a", 1), ("d", 9)]
    assert never_served(late, exposure(late, G, 8)) == ["b/c", "d"]


def test_an_unknown_document_or_a_step_outside_the_run_is_refused(corpus):
    trace = Trace(TokenStream(corpus, replace(CONFIG, mixture=[Phase({"a": 1.0}, 80)])), G)
    assert trace.steps() == 10
    with pytest.raises(UnknownDocumentError, match="no document with id 'a/9/9' in this corpus"):
        trace.document("a/9/9")
    for step in (0, 11):
        with pytest.raises(LoaderConfigError, match="step"):
            trace.step(step)
    with pytest.raises(LoaderConfigError, match="never ends"):
        Trace(TokenStream(corpus, CONFIG), G).document("a/0/0")
    assert Trace(TokenStream(corpus, CONFIG), G).document("d/0/1", 5).size == 0  # never weighed: never served


def test_a_shard_with_an_empty_document_is_read_whole_and_the_empty_document_never_served(tmp_path):
    from conftest import EOS
    from marin_data.corpus.commit import commit_corpus
    from marin_data.corpus.manifest import load_corpus
    from marin_data.corpus.shard import write_shard

    corpus = build_corpus(tmp_path / "corpus", {"a": [30]}, seed=4)
    rng = np.random.default_rng(0)
    lens = np.array([50, 0, 70, 40] * 5)  # a list column counts one slot for each empty list: the footer's
    offsets = np.concatenate([[0], np.cumsum(lens)])  # token counts no longer add up to the index's
    tokens = rng.integers(1, 999, size=int(offsets[-1])).astype(np.uint32)
    tokens[offsets[1:][lens > 0] - 1] = EOS
    st = write_shard(corpus.root / "data/e/part-00000.parquet", [f"e/{i}" for i in range(len(lens))], tokens, offsets,
                     corpus.manifest.tokenizer)
    record = corpus.shards[0]._replace(path="data/e/part-00000.parquet", subset="e", bytes=st.bytes,
                                       sha256=st.sha256, docs=st.docs, tokens=st.tokens, row_groups=st.row_groups)
    manifest = replace(corpus.manifest, subsets={**corpus.manifest.subsets, "e": corpus.manifest.subsets["a"]})
    commit_corpus(corpus.root, manifest, [*corpus.shards, record])
    stream = TokenStream(load_corpus(corpus.root), replace(CONFIG, mixture={"a": 0.5, "e": 0.5}))
    trace = Trace(stream, G)
    assert len(trace.documents.groups(record)[0]) == 2  # one group: the shard, through the loader's decode
    check_trace(trace, parquet_spans(stream), 12)
    assert trace.document("e/1", 12).size == 0


def test_a_pinned_cache_is_traced_from_its_ledgers_and_offsets(tmp_path):
    from levanter_env import make_store
    from shard_env import train_tiny

    from marin_data.levanter import adopt

    cells = {"cluster=0/quality=1": 120, "cluster=1/quality=4": 90}
    docs = make_store(tmp_path / "store", cells, layout="sharded", parts=2)  # windows cross chunk files and parts
    adopt(tmp_path / "store", tokenizer=str(train_tiny(tmp_path / "tokenizer.json")), name="store")
    stream = TokenStream(tmp_path / "store", LoaderConfig(seq_len=50, batch_size=4, seed=1, mixture_block=16,
                                                          packing="levanter"), cache_dir=tmp_path / "decoded")
    spans = {}
    for s, name in enumerate(stream.subsets):
        ends = np.cumsum([len(d) for d in docs[name]])
        spans[s] = [(f"{name}:{r}", int(e - len(d)), int(e)) for r, (d, e) in enumerate(zip(docs[name], ends))]
    check_trace(Trace(stream, G), spans, 12)
    assert not (tmp_path / "decoded").exists()  # no data chunk file was read
    with pytest.raises(UnknownDocumentError, match="no row 500"):
        Trace(stream, G).document("cluster=0/quality=1:500", 3)


def test_a_remote_corpus_is_traced_as_its_local_copy(corpus, bucket_url, moto, tmp_path):  # noqa: F811
    import shutil

    from marin_data.transfer.publish_s3 import publish

    copy = tmp_path / "copy"
    shutil.copytree(corpus.root, copy)
    publish(copy, to=bucket_url, endpoint_url=moto, progress=False)
    local = Trace(TokenStream(corpus, CONFIG), G)
    remote = make_remote_loader(bucket_url, CONFIG, cache_dir=tmp_path / "cache", endpoint_url=moto,
                                rank=0, world_size=1).dataset.stream
    try:
        trace = Trace(remote, G)
        for step in (1, 7):
            assert trace.step(step) == local.step(step)
        doc = local.step(7)[3].documents[0].id
        assert np.array_equal(trace.document(doc, 20), local.document(doc, 20))
    finally:
        remote.close()


def test_at_the_hero_runs_batch_a_weight_far_under_one_block_is_served_from_its_first_block(corpus):
    """Levanter's per-block rounding never serves a weight under 1/block (Marin found 8 of 200 cells untrained
    with blocks of 49,152); cumulative apportionment serves it in every block, and the summary says from when."""
    stream = TokenStream(corpus, replace(CONFIG, mixture={"a": 1 - 1e-6, "b/c": 1e-6}, mixture_block=49_152))
    table = exposure(stream, 11_264, 390_251)  # the whole run: 4.4 billion positions, counted, not scanned
    rare = table[1]
    assert rare.subset == "b/c" and abs(rare.sequences - 1e-6 * 11_264 * 390_251) <= 1
    assert rare.first_step is not None and rare.first_step <= -(-stream.mixture.phases[0].block // 11_264)
    assert never_served(stream, table) == ["d"]
