"""`marin-data datasheet` on a Levanter cache or store: every number is the caches', computed here again from
the documents the test wrote (or, for the golden caches, from what real Levanter read back), with numpy.

The store built here has four cells: two consolidated int32/lz4 caches named like Marin's, a sharded int64/zstd
one with `.stats.json`, and `books`, whose ledger carries columns of Marin's token-count registry. Documents
are planted to repeat within a cell and across two cells, one of them long enough to span chunk files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from levanter_env import CHUNK, INNER, VOCAB, documents, wide_tokenizer
from s3_env import bucket_url, moto, s3_client  # noqa: F401
from shard_env import tiny_tokenizer, tree_bytes  # noqa: F401
from test_datasheet import md_tables, num

from marin_data.cli import main
from marin_data.levanter.cachestats import FIRST_CHARS
from marin_data.docs.figures import token_grid
from marin_data.docs.stats import CorpusStats, SubsetStats, spread
from marin_data.formats.datasheet import write_datasheet
from marin_data.errors import CacheCheckError, CacheUnfinishedError
from marin_data.layout import DATASHEET, FIGURES, HEATMAP
from marin_data.levanter import LZ4, ZSTD, write_cache
from marin_data.ui import terminal_safe

FIXTURES = Path(__file__).parent / "fixtures" / "levanter"
EXPECTED = json.loads((FIXTURES / "EXPECTED.json").read_text())["caches"]
CELLS = ("Cell", "Documents", "Tokens", "Bytes", "Chunk files", "Parts", "Layout", "Tokens as", "Codec", "Token share")
LENGTHS = ("Subset", "Documents scanned", "p50", "p90", "p99", "max", "mean", "Scope")
DUPLICATES = ("Subset", "Documents scanned", "Copies", "Tokens in copies", "Share of scanned tokens", "Scope")
REGISTRY = {"marin_name": "books/v1", "category": "specialized", "synthetic": False, "hf_repo": "org/books",
            "license": "CC-BY-4.0"}


# --- slow, obvious references --------------------------------------------------------------------------
def reference_duplicates(cells: dict[str, list]) -> tuple[dict, dict]:
    """Within: {cell: (copies, their tokens)}; across: {(a, b): documents of a also in b}, by exact content."""
    where: dict[object, dict[str, int]] = {}
    lengths: dict[object, int] = {}
    for cell, docs in cells.items():
        for d in docs:
            key = tuple(d) if not isinstance(d, dict) else d["sha256_int64le"]
            lengths[key] = len(d) if not isinstance(d, dict) else d["length"]
            where.setdefault(key, {}).setdefault(cell, 0)
            where[key][cell] += 1
    within = {c: (0, 0) for c in cells}
    across: dict[tuple[str, str], int] = {}
    for key, counts in where.items():
        for c, n in counts.items():
            within[c] = (within[c][0] + n - 1, within[c][1] + (n - 1) * lengths[key])
            for other in counts:
                if other != c:
                    across[(c, other)] = across.get((c, other), 0) + n
    return within, across


def reference_scanned(parts: list[list[np.ndarray]], budget: int) -> int:
    """Documents digested under ``budget``: those whose every chunk file (an empty one: the file its position
    falls in, the last file at the very end) is among the files `spread` picks over the cell."""
    sizes, first_file = [], []
    for docs in parts:
        tokens = sum(len(d) for d in docs)
        first_file.append(len(sizes))
        sizes += [min(CHUNK, tokens - k) for k in range(0, tokens, CHUNK)]
    picked = set(spread(sizes, budget))
    scanned = 0
    for docs, base in zip(parts, first_file):
        last = base + max(0, -(-sum(len(d) for d in docs) // CHUNK) - 1)
        position = 0
        for d in docs:
            files = {base + p // CHUNK for p in range(position, position + len(d))} or {min(base + position // CHUNK,
                                                                                                last)}
            scanned += files <= picked
            position += len(d)
    return scanned


def cell_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def chunk_files(folder: Path) -> int:
    return sum(1 for p in folder.rglob("c/*") if p.parent.parent.name == "data")


def table(text: str, headers: tuple[str, ...]) -> dict[str, list[str]]:
    return {row[0].strip("`"): row for row in md_tables(text)[headers]}


def nearest_rank(lengths: list[int], p: int) -> int:
    return int(np.percentile(lengths, p, method="inverted_cdf"))


# --- the store --------------------------------------------------------------------------------------------
@pytest.fixture
def store(tmp_path) -> tuple[Path, dict[str, list[np.ndarray]], dict[str, list[list[np.ndarray]]]]:
    """(root, each cell's documents, each cell's documents by part)."""
    root = tmp_path / "store"
    long = np.arange(1500) % (VOCAB - 2) + 2  # spans two chunk files
    short = np.array([1, 7, 8, 9])
    docs = {"cluster=0/quality=0": documents(40, 0), "cluster=0/quality=4": documents(50, 1) + [np.zeros(0, int)],
            "cluster=1/quality=4": documents(30, 2), "books": documents(20, 3)}
    docs["cluster=0/quality=0"][5:5] = [long]
    docs["cluster=0/quality=0"][30:30] = [long]  # a copy, 25 documents and a chunk file further
    docs["cluster=0/quality=4"][10:10] = [short]
    docs["cluster=1/quality=4"][3:3] = [short]  # shared by two cells
    common = {"chunk": CHUNK, "inner": INNER, "tokenizer": "tiny", "vocab_size": VOCAB}
    for cell in ("cluster=0/quality=0", "cluster=0/quality=4"):
        write_cache(root / cell, docs[cell], codec=LZ4, **common)
    write_cache(root / "cluster=1/quality=4", docs["cluster=1/quality=4"], codec=ZSTD, dtype="int64",
                layout="sharded", parts=2, stats=True, **common)
    write_cache(root / "books", docs["books"], codec=LZ4, stats=True, **common)
    ledger = root / "books/shard_ledger.json"
    doc = json.loads(ledger.read_text())
    doc["metadata"]["preprocessor_metadata"].update(REGISTRY)
    ledger.write_text(json.dumps(doc))
    half = len(docs["cluster=1/quality=4"]) // 2
    by_part = {c: [d] for c, d in docs.items()}
    by_part["cluster=1/quality=4"] = [docs["cluster=1/quality=4"][:half], docs["cluster=1/quality=4"][half:]]
    return root, docs, by_part


def test_an_unpinned_store_is_documented_from_its_caches(store, tiny_tokenizer, tmp_path):
    root, docs, _ = store
    before = tree_bytes(root)
    result = write_datasheet(root, tokenizer=str(tiny_tokenizer), out=tmp_path / "out", scan_tokens=0)
    assert tree_bytes(root) == before and result.manifest_sha256 is None
    assert set(result.written) == {*FIGURES, HEATMAP, DATASHEET}
    text = (tmp_path / "out" / DATASHEET).read_text()
    rows = table(text, CELLS)
    layouts = {"cluster=1/quality=4": ("2", "sharded", "int64", "blosc zstd clevel 1")}
    for cell, d in docs.items():
        lengths = [len(x) for x in d]
        assert [num(c) for c in rows[cell][1:5]] == [len(d), sum(lengths), cell_bytes(root / cell),
                                                     chunk_files(root / cell)], cell
        assert tuple(rows[cell][5:9]) == layouts.get(cell, ("1", "consolidated", "int32", "blosc lz4 clevel 5"))
    total = sum(len(x) for d in docs.values() for x in d)
    assert [num(c) for c in rows["**Total**"][1:3]] == [sum(len(d) for d in docs.values()), total]
    for cell, row in table(text, LENGTHS).items():  # every document, from the offsets
        lengths = [len(x) for x in docs[cell]]
        assert [num(c) for c in row[1:6]] == [len(lengths), *(nearest_rank(lengths, p) for p in (50, 90, 99)),
                                              max(lengths)] and row[7] == "all documents", cell
    within, across = reference_duplicates(docs)
    assert within["cluster=0/quality=0"] == (1, 1500) and across == {("cluster=0/quality=4", "cluster=1/quality=4"): 1,
                                                                     ("cluster=1/quality=4", "cluster=0/quality=4"): 1}
    found = {cell: (num(r[1]), num(r[2]), num(r[3]), r[5]) for cell, r in table(text, DUPLICATES).items()}
    assert found == {c: (len(d), *within[c], "all chunk files") for c, d in docs.items()}
    shared = md_tables(text)[("Subset A", "Subset B", "Documents of A also in B", "Share of A's tokens",
                              "Documents of B also in A", "Share of B's tokens")]
    assert [(r[0], r[1], num(r[2]), num(r[4])) for r in shared] == [
        ("`cluster=0/quality=4`", "`cluster=1/quality=4`", 1, 1)]
    registry = table(text, ("Cell", "marin_name", "marin_tokens", "category", "synthetic", "hf_repo", "license"))
    assert registry["books"][1:] == ["books/v1", str(sum(len(x) for x in docs["books"])), "specialized", "False",
                                     "org/books", "CC-BY-4.0"]
    assert registry["cluster=0/quality=0"][1:] == ["—"] * 6
    assert registry["cluster=1/quality=4"][2] == str(sum(len(x) for x in docs["cluster=1/quality=4"]))
    first = terminal_safe(_decode(tiny_tokenizer, docs["cluster=0/quality=0"][0])[:FIRST_CHARS])
    assert f"(row 0, {len(docs['cluster=0/quality=0'][0])} tokens, decoded with `tiny-bpe`)" in text
    assert f"```text\n{first}\n```" in text
    assert "**Not pinned.**" in text and "has sha256" not in text and "marin-data adopt" in text


def _decode(tokenizer: Path, ids: np.ndarray) -> str:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer)).decode(ids.tolist(), skip_special_tokens=False)


def test_the_heat_map_holds_the_cluster_quality_cells_and_only_them(store, tiny_tokenizer, tmp_path):
    from PIL import Image

    root, docs, _ = store
    write_datasheet(root, tokenizer=str(tiny_tokenizer), out=tmp_path / "out")
    text = (tmp_path / "out" / DATASHEET).read_text()
    assert "![Tokens by cluster and quality](token-heatmap.png)" in text
    with Image.open(tmp_path / "out" / HEATMAP) as img:
        assert img.format == "PNG" and img.width == 800
    stats = CorpusStats.of([SubsetStats(c, len(d), sum(len(x) for x in d), 0, 0, "", 0.0, None)
                            for c, d in sorted(docs.items())])
    clusters, qualities, grid = token_grid(stats)
    tokens = {c: sum(len(x) for x in d) for c, d in docs.items()}
    assert (clusters, qualities) == ([0, 1], [0, 4])  # `books` is in the table only
    assert np.array_equal(grid, [[tokens["cluster=0/quality=0"], tokens["cluster=0/quality=4"]],
                                 [np.nan, tokens["cluster=1/quality=4"]]], equal_nan=True)
    assert token_grid(CorpusStats.of([stats.subsets[0]])) is None  # no cell named cluster=X/quality=Y


def test_a_sampled_cell_digests_the_documents_wholly_inside_the_files_it_reads(store, tiny_tokenizer, tmp_path):
    root, docs, by_part = store
    write_datasheet(root, tokenizer=str(tiny_tokenizer), out=tmp_path / "out", scan_tokens=600)
    text = (tmp_path / "out" / DATASHEET).read_text()
    rows = table(text, DUPLICATES)
    for cell, row in rows.items():
        files = chunk_files(root / cell)
        assert num(row[1]) == reference_scanned(by_part[cell], 600), cell
        picked = len(spread([min(CHUNK, n - k) for p in by_part[cell] for n in [sum(len(d) for d in p)]
                             for k in range(0, n, CHUNK)], 600))
        assert row[5] == ("all chunk files" if picked == files else f"sample: {picked} of {files} chunk files")
    assert sorted(r[5] for r in rows.values()) == ["all chunk files", "all chunk files", "sample: 1 of 2 chunk files",
                                                    "sample: 1 of 5 chunk files"]
    for cell, row in table(text, LENGTHS).items():  # lengths are never sampled: they come from the offsets
        assert num(row[1]) == len(docs[cell]) and row[7] == "all documents"


def test_the_lengths_pass_holds_one_offsets_chunk_file_whatever_the_documents(tiny_tokenizer, tmp_path,
                                                                               monkeypatch):
    """Memory: one offsets chunk file of ends (and one digest bucket), not a cell's ends: 35,000 documents
    more cost less than one int64 each at the peak."""
    from dataclasses import replace

    from memory_checks import peak_bytes

    import marin_data.docs.stats as stats
    from marin_data.levanter.cachestats import cache_stats
    from marin_data.levanter import ArrayMeta, CacheWriter, detect, open_cache
    from marin_data.raw.tokenizer import load_tokenizer

    monkeypatch.setattr(stats, "BUCKET_ROWS", 2048)  # the digests' own bound, made small
    tokenizer, rng, peaks = load_tokenizer(str(tiny_tokenizer)), np.random.default_rng(0), []
    for n in (5_000, 5_000, 40_000):  # the first run warms up what is allocated once
        lengths = rng.integers(1, 4, n)
        meta = ArrayMeta("int32", chunk=CHUNK, inner=INNER, blosc=LZ4)
        writer = CacheWriter(tmp_path / f"{n}-{len(peaks)}", meta, replace(meta, dtype="int64"))
        writer.write(rng.integers(2, VOCAB, int(lengths.sum())), lengths)
        writer.close()
        cache = open_cache(detect(str(tmp_path / f"{n}-{len(peaks)}")).store)
        found, peak = peak_bytes(lambda: cache_stats({"c": cache}, sizes={}, tokenizer=tokenizer, scan_tokens=0))
        assert found.corpus.subsets[0].docs == n and found.corpus.duplicates.scanned_docs[0] == n
        peaks.append(peak)
    assert peaks[2] - peaks[1] < 35_000 * 8, peaks


# --- golden caches, written by real Levanter ------------------------------------------------------------
@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    return wide_tokenizer(tmp_path_factory.mktemp("wide"))


def _length(doc) -> int:
    return doc["length"] if isinstance(doc, dict) else len(doc)


@pytest.mark.parametrize("name", ["store", "consolidated-int32-lz4", "consolidated-int64-zstd", "tokenized-int64-lz4"])
def test_the_golden_caches_are_documented_as_levanter_reads_them(name, wide, tmp_path):
    cells = {k[len("store/"):]: v for k, v in EXPECTED.items() if k.startswith("store/")} if name == "store" else {
        name: EXPECTED[name]}
    write_datasheet(FIXTURES / name, tokenizer=str(wide), out=tmp_path / "out")
    text = (tmp_path / "out" / DATASHEET).read_text()
    rows, lengths_rows = table(text, CELLS), table(text, LENGTHS)
    within, _ = reference_duplicates({c: v["documents"] for c, v in cells.items()})
    duplicates = table(text, DUPLICATES)
    for cell, want in cells.items():
        blosc = next(iter(want["caches"].values()))["data"]["blosc"]
        assert [num(c) for c in rows[cell][1:3]] == [want["rows"], want["tokens"]]
        assert rows[cell][7:9] == [want["dtype"], f"blosc {blosc['cname']} clevel {blosc['clevel']}"]
        lengths = [_length(d) for d in want["documents"]]
        assert [num(c) for c in lengths_rows[cell][2:6]] == [*(nearest_rank(lengths, p) for p in (50, 90, 99)),
                                                             max(lengths)]
        assert (num(duplicates[cell][2]), num(duplicates[cell][3])) == within[cell]
        first = want["documents"][0]
        assert f"```text\n{' '.join(f't{i}' for i in first)[:FIRST_CHARS]}\n```" in text
    if name == "store":  # one cell per codec generation
        assert {rows[c][8] for c in cells} == {"blosc lz4 clevel 5", "blosc zstd clevel 1"}
        assert (tmp_path / "out" / HEATMAP).is_file()
    if name == "tokenized-int64-lz4":  # what the tokenizer run recorded
        assert "`tokenizer`: `levanter-fixture-wordlevel`, `vocab_size`: `37`, `append_bos`: `True`, " \
               "`append_eos`: `True`" in text


# --- refusals ---------------------------------------------------------------------------------------------
def _ledger(root: Path, cell: str, **changes) -> None:
    path = root / cell / "shard_ledger.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("damage, code, named", [
    (lambda root: (root / "cluster=0/quality=4/input_ids/offsets/zarr.json").unlink(), 19,
     "cluster=0/quality=4/input_ids/offsets/zarr.json"),
    (lambda root: _ledger(root, "cluster=0/quality=0", is_finished=False), 20, "cluster=0/quality=0/shard_ledger.json"),
    (lambda root: _ledger(root, "books", total_num_rows=19, shard_rows={"0": 19}), 21,
     "books/input_ids/offsets/c/0"),
])
def test_a_broken_cache_is_refused_by_name_and_nothing_is_written(store, tiny_tokenizer, tmp_path, capsys, damage,
                                                                   code, named):
    root, _, _ = store
    damage(root)
    with pytest.raises(SystemExit) as e:
        main(["datasheet", str(root), "--tokenizer", str(tiny_tokenizer), "--out", str(tmp_path / "out")])
    assert e.value.code == code and named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_ids_outside_the_tokenizer_are_refused_naming_the_chunk_file(store, tmp_path):
    root, _, _ = store
    with pytest.raises(CacheCheckError, match="outside the tokenizer's vocabulary") as e:
        write_datasheet(root, tokenizer=str(FIXTURES / "levanter-fixture-wordlevel"), out=tmp_path / "out")
    assert "/input_ids/data/c/" in e.value.path
    _ledger(root, "books", is_finished=False)
    with pytest.raises(CacheUnfinishedError):
        write_datasheet(root, tokenizer=str(FIXTURES / "levanter-fixture-wordlevel"), out=tmp_path / "out")


def test_an_unpinned_cache_needs_a_tokenizer_and_an_out_folder(store, tiny_tokenizer, tmp_path, capsys):
    root, docs, _ = store
    for args in ([], ["--tokenizer", str(tiny_tokenizer)], ["--out", str(tmp_path / "out")]):
        with pytest.raises(SystemExit) as e:
            main(["datasheet", str(root), *args])
        assert e.value.code == 2 and "--tokenizer" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["datasheet", str(root), "--tokenizer", str(tiny_tokenizer), "--out", str(root / "docs")])
    assert e.value.code == 22 and "adopt" in capsys.readouterr().err  # never written into the cache
    with pytest.raises(SystemExit) as e:
        main(["datasheet", str(root), "--meta-template"])
    template = capsys.readouterr().out
    assert e.value.code == 0 and all(f'"{cell}":' in template or f"{cell}:" in template for cell in docs)


@pytest.fixture(params=["s3", "hf"])
def published_store(request, store, tmp_path):
    """(URL, its store flags) of a copy of the store on S3 (moto) or on our Hub mirror; the local root."""
    root, _, _ = store
    if request.param == "hf":
        import shutil

        from marin_data.testing.mirror import running_mirror

        shutil.copytree(root, tmp_path / "mirror/team/raw")
        with running_mirror(tmp_path / "mirror") as mirror:
            yield "hf://datasets/team/raw", ["--endpoint", mirror.url], root
        return
    moto, bucket_url = request.getfixturevalue("moto"), request.getfixturevalue("bucket_url")
    bucket, prefix = bucket_url[len("s3://"):].split("/", 1)
    client = s3_client(moto)
    for rel in tree_bytes(root):
        client.upload_file(str(root / rel), bucket, f"{prefix}/{rel}")
    yield bucket_url, ["--endpoint-url", moto], root


def test_an_unpinned_store_on_s3_or_the_hub_reads_as_the_local_one(published_store, tiny_tokenizer, tmp_path,
                                                                   capsys):
    url, flags, root = published_store
    with pytest.raises(SystemExit) as e:
        main(["datasheet", url, *flags, "--tokenizer", str(tiny_tokenizer), "--out", str(tmp_path / "remote"),
              "--scan-tokens", "600"])
    assert e.value.code == 0, capsys.readouterr().err
    assert "not pinned" in capsys.readouterr().out
    write_datasheet(root, tokenizer=str(tiny_tokenizer), out=tmp_path / "local", scan_tokens=600)
    remote, local = ((tmp_path / d / DATASHEET).read_text() for d in ("remote", "local"))
    for headers in (CELLS, LENGTHS, DUPLICATES):
        assert table(remote, headers) == table(local, headers)
    assert f"marin-data verify {url} {' '.join(flags)} --deep --tokenizer TOK" in remote
    assert hashlib.sha256((tmp_path / "remote" / HEATMAP).read_bytes()).digest() == \
        hashlib.sha256((tmp_path / "local" / HEATMAP).read_bytes()).digest()


def test_the_heat_map_s_colours_span_the_cells_whatever_their_spread():
    """Cells of 1.8M to 2.2M tokens take the scale's two ends (a log scale stretched to a decade had painted
    them alike); counts spanning decades keep a log scale."""
    import numpy as np

    from marin_data.docs.figures import heat_norm

    norm, scale = heat_norm(np.array([1.8e6, 2.0e6, 2.2e6]))
    assert scale == "linear" and float(norm(1.8e6)) == 0 and float(norm(2.2e6)) == 1
    norm, scale = heat_norm(np.array([1e3, 1e5, 1e7]))
    assert scale == "log" and float(norm(1e3)) == 0 and float(norm(1e7)) == 1 and abs(float(norm(1e5)) - 0.5) < 1e-9
    norm, scale = heat_norm(np.array([5e6, 5e6]))
    assert 0 < float(norm(5e6)) < 1
