"""Adding a format costs one folder and one registry line: a toy format (`tests/toyformat`) registered at run
time is found by the one door (`marin_data.formats.open_source`), and the loader serves it exactly as it
serves a Parquet corpus holding the same documents."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import build_corpus
from marin_data.cli import main
from marin_data.formats import open_source, register, unregister
from marin_data.layout import TOKENIZER
from marin_data.loader.cache import DecodedShardCache
from marin_data.loader import LoaderConfig, TokenStream
from toyformat import NAME, ToyFormat, write_toy_corpus


@pytest.fixture
def toy():
    register(ToyFormat())  # the one registry line
    yield
    unregister(NAME)


@pytest.fixture
def twins(tmp_path, toy):
    """A Parquet corpus and a toy corpus holding the same documents in the same shards."""
    parquet = build_corpus(tmp_path / "parquet", {"a": [5, 3, 6], "b": [4, 7]}, seed=5)
    decoded = DecodedShardCache(parquet.root, tmp_path / "decoded")
    docs: dict[str, list] = {}
    for shard in sorted(parquet.shards, key=lambda s: s.path):
        d = decoded.open(shard)
        docs.setdefault(shard.subset, []).append([d.tokens[a:b] for a, b in zip(d.offsets[:-1], d.offsets[1:])])
    toy = write_toy_corpus(tmp_path / "toy", docs, parquet.manifest.tokenizer, (parquet.root / TOKENIZER).read_bytes())
    return parquet, toy


def test_the_door_opens_a_registered_format(twins):
    _, toy = twins
    source = open_source(toy.root)
    assert (source.format, source.kind, source.pinned) == (NAME, "corpus", True)


def test_an_unregistered_format_is_refused_by_name(twins):
    _, toy = twins
    unregister(NAME)
    with pytest.raises(ValueError, match="unknown format 'toy'"):
        open_source(toy.root)


@pytest.mark.parametrize("packing", ["overlap", "levanter"])
def test_the_loader_serves_a_toy_corpus_as_it_serves_parquet(twins, tmp_path, packing):
    parquet, toy = twins
    config = LoaderConfig(seq_len=24, batch_size=4, seed=3, packing=packing)
    streams = [TokenStream(c.root, config, cache_dir=tmp_path / f"cache-{i}") for i, c in enumerate(twins)]
    assert [s.decoder.__class__.__name__ for s in streams] == ["ParquetDecoder", "ToyDecoder"]
    for start in range(0, 40, 4):
        a, b = (s.read(range(start, start + 4)) for s in streams)
        assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.labels, b.labels)
        assert np.array_equal(a.subset, b.subset)


def run(capsys, *args: str) -> tuple[int, str]:
    """``marin-data ARGS`` in this process (where the toy format is registered): exit code and output."""
    with pytest.raises(SystemExit) as done:
        main(list(args))
    out = capsys.readouterr()
    return done.value.code, out.out + out.err


def test_info_and_verify_read_a_toy_corpus(twins, capsys):
    _, toy = twins
    code, out = run(capsys, "info", str(toy.root), "--json")
    assert code == 0, out
    assert {name: s["docs"] for name, s in json.loads(out)["subsets"].items()} == {"a": 14, "b": 11}
    assert run(capsys, "verify", str(toy.root))[0] == 0
    shard = toy.root / toy.shards[0].path
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    code, out = run(capsys, "verify", str(toy.root))
    assert code == 1 and toy.shards[0].path in out
