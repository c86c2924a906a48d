"""``marin-data trace`` on real caches (written with Levanter's array specs, small chunk grids so that the
offsets span several inner chunks and chunk files): every slot's documents against the documents read back
whole, backward(forward(s)) contains s, the summary against counted steps, pins, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from marin_data.cli import cli
from marin_data.errors import TrainConfigError, UnsupportedOrderKeyError
from marin_data.levanter.order.config import load_run, parse_run
from marin_data.levanter.order.trace import open_trace
from levanter_env import make_store
from shard_env import run_cli, tiny_tokenizer  # noqa: F401

CELLS = {"cluster=0/quality=1": 700, "cluster=0/quality=2": 300, "cluster=1/quality=1": 90}


def run_yaml(tmp_path: Path, **data) -> str:
    names = {"c0q1": "cluster=0/quality=1", "c0q2": "cluster=0/quality=2", "c1q1": "cluster=1/quality=1"}
    config = {"data": {"tokenizer": "tiny", "mixture_block_size": 32, "shuffle": True,
                       "components": {n: {"type": "cached", "cache_dir": f"gs://bucket/store/{c}", "flat_cache": True}
                                      for n, c in names.items()},
                       "train_weights": {"c0q1": 0.6, "c0q2": 0.3, "c1q1": 0.1}, **data},
              "trainer": {"seed": 0, "train_batch_size": 16, "num_train_steps": 60}, "model": {"max_seq_len": 16}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("store")
    return root, make_store(root, CELLS)


def brute_documents(docs: list[np.ndarray], start: int, stop: int) -> list[dict]:
    ends = np.cumsum([len(d) for d in docs])
    starts = ends - [len(d) for d in docs]
    return [{"row": r, "first": int(max(start, a) - a), "last": int(min(stop, b) - 1 - a)}
            for r, (a, b) in enumerate(zip(starts, ends)) if a < stop and b > start and b > a]


@pytest.mark.parametrize("shuffle", [True, False, {"io_block_size": 4, "window_blocks": 2, "perm_type": "linear"}])
def test_each_slot_lists_the_documents_its_window_touches(store, tmp_path, shuffle):
    root, docs = store
    trace = open_trace(run_yaml(tmp_path, shuffle=shuffle), store=str(root))
    cells = {"c0q1": "cluster=0/quality=1", "c0q2": "cluster=0/quality=2", "c1q1": "cluster=1/quality=1"}
    for step in (0, 3, 41):
        for slot in trace.step(step)["batch"]:
            a, b = slot["tokens"]
            assert slot["documents"] == brute_documents(docs[cells[slot["component"]]], a, b)


@pytest.mark.parametrize("data", [
    {}, {"shuffle": False}, {"shuffle": True, "permutation_type": "linear"},
    {"shuffle": {"io_block_size": 4, "window_blocks": 3, "perm_type": "feistel"}},
    {"train_weights": [[0, {"c0q1": 0.5, "c0q2": 0.5}], [8, {"c0q1": 0.2, "c0q2": 0.2, "c1q1": 0.6}]]},
    {"num_validation_sequences": {"c0q1": 40, "c1q1": 9}},
    {"max_train_batches": {"c1q1": 1}, "shuffle": {"io_block_size": 3, "window_blocks": 2}},
])
def test_backward_of_forward_contains_the_step(store, tmp_path, data):
    root, _ = store
    trace = open_trace(run_yaml(tmp_path, **data), store=str(root))
    for step in (0, 7, 59):
        for n, slot in enumerate(trace.step(step)["batch"][:6]):
            doc = slot["documents"][0]
            back = trace.document(f"{slot['component']}:{doc['row']}")
            assert (step, n) in set(zip(back["steps"], back["slots"]))


def test_backward_finds_exactly_the_steps_a_scan_finds(store, tmp_path):
    root, _ = store
    trace = open_trace(run_yaml(tmp_path), store=str(root))
    scanned = {(s, n) for s in range(60) for n, slot in enumerate(trace.step(s)["batch"])
               if slot["component"] == "c1q1" and any(d["row"] == 5 for d in slot["documents"])}
    back = trace.document("cluster=1/quality=1:5")  # a cell id names the same document
    assert set(zip(back["steps"], back["slots"])) == scanned and scanned


def test_summary_counts_what_the_steps_serve(store, tmp_path):
    root, _ = store
    trace = open_trace(run_yaml(tmp_path, train_weights={"c0q1": 0.98, "c0q2": 0.02, "c1q1": 0.0}),
                       store=str(root))
    out = trace.summary(until=9)
    counts = {}
    for s in range(9):
        for slot in trace.step(s, documents=False)["batch"]:
            counts[slot["component"]] = counts.get(slot["component"], 0) + 1
    served = {r["component"]: r["tokens_served"] // 16 for r in out["components"]}
    assert served == {"c0q1": counts.get("c0q1", 0), "c0q2": 0}
    assert out["never_served"] == ["c0q2"] and out["zero_weight"] == ["c1q1"]  # 0.02 * 32 truncates to 0


@pytest.mark.parametrize("data,key", [
    ({"prior_context_phases": []}, "data.prior_context_phases"),
    ({"shuffle": 1000}, "data.shuffle"),
    ({"shuffle": {"io_block_size": 4, "window_blocks": 2, "era": 3}}, "data.shuffle.era"),
    ({"some_new_knob": 1}, "data.some_new_knob"),
])
def test_an_order_changing_key_is_refused_by_name(tmp_path, data, key):
    with pytest.raises(UnsupportedOrderKeyError) as e:
        load_run(run_yaml(tmp_path, **data))
    assert e.value.key == key


@pytest.mark.parametrize("spec,key", [
    ({"type": "concat", "children": {}}, "data.components.x.type"),
    ({"cache_dir": "d", "pack": True}, "data.components.x.pack"),
    ({"cache_dir": "d", "format": {"type": "chat"}}, "data.components.x.format"),
    ({"cache_dir": "d", "weight_decay": 3}, "data.components.x.weight_decay"),
])
def test_a_component_levanter_serves_otherwise_is_refused(spec, key):
    config = {"data": {"components": {"x": spec}}, "model": {"max_seq_len": 8}}
    with pytest.raises(UnsupportedOrderKeyError) as e:
        parse_run(config)
    assert e.value.key == key


def test_budgets_with_max_train_batches_are_refused_as_levanter_refuses_them(tmp_path):
    with pytest.raises(TrainConfigError, match="cannot be set with"):
        load_run(run_yaml(tmp_path, target_budget=10, experiment_budget=5, max_train_batches={"c0q1": 1}))


def test_cli_prints_the_issue_json_shape_and_refuses_in_one_line(store, tmp_path):
    root, _ = store
    runner = CliRunner()
    ok = runner.invoke(cli, ["trace", "--levanter-config", run_yaml(tmp_path), "--step", "2", "--json",
                             "--store", str(root)])
    assert ok.exit_code == 0, ok.output
    out = json.loads(ok.output)
    assert out["step"] == 2 and out["levanter"] == "0.2.227" and len(out["batch"]) == 16
    assert set(out["batch"][0]) == {"component", "sequence", "tokens", "documents"}
    table = runner.invoke(cli, ["trace", "--levanter-config", run_yaml(tmp_path), "--summary", "--store", str(root)])
    assert table.exit_code == 0 and "c0q1" in table.output
    bad = run_cli("trace", "--levanter-config", run_yaml(tmp_path, prior_context_phases=[]), "--step", "0",
                  "--store", str(root))
    assert bad.returncode == 2 and "data.prior_context_phases" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 2  # the error and its fix


def test_the_table_without_documents_has_no_documents_column(store, tmp_path):
    root, _ = store
    shown = CliRunner().invoke(cli, ["trace", "--levanter-config", run_yaml(tmp_path), "--step", "2",
                                     "--no-documents", "--store", str(root)])
    assert shown.exit_code == 0, shown.output
    assert "sequence" in shown.output and "documents" not in shown.output.splitlines()[1]


def test_a_pinned_store_names_cell_shard_sha256_and_license(tmp_path, tiny_tokenizer):
    import hashlib

    from marin_data.levanter import adopt

    root = tmp_path / "store"
    make_store(root, CELLS)
    adopt(root, tokenizer=str(tiny_tokenizer), license="ODC-By-1.0")
    trace = open_trace(run_yaml(tmp_path), store=str(root))
    for slot in trace.step(4)["batch"]:
        assert slot["cell"].startswith("cluster=") and slot["license"] == "ODC-By-1.0"
        for shard in slot["shards"]:
            assert shard["path"].startswith(slot["cell"] + "/input_ids/data/c/")
            assert shard["sha256"] == hashlib.sha256((root / shard["path"]).read_bytes()).hexdigest()


def test_with_text_decodes_exactly_the_window(tmp_path, tiny_tokenizer):
    from marin_data.levanter import adopt
    from marin_data.raw.tokenizer import load_tokenizer

    root = tmp_path / "store"
    docs = make_store(root, CELLS)
    adopt(root, tokenizer=str(tiny_tokenizer))
    trace = open_trace(run_yaml(tmp_path), store=str(root))
    tok = load_tokenizer(str(tiny_tokenizer)).tokenizer
    out = trace.step(6, text=tok)
    cells = {"c0q1": "cluster=0/quality=1", "c0q2": "cluster=0/quality=2", "c1q1": "cluster=1/quality=1"}
    for slot in out["batch"]:
        flat = np.concatenate(docs[cells[slot["component"]]])
        a, b = slot["tokens"]
        assert slot["text"] == tok.decode(flat[a:b].tolist(), skip_special_tokens=False)
    shown = run_cli("trace", "--levanter-config", run_yaml(tmp_path), "--step", "6", "--with-text", "--store", root)
    assert shown.returncode == 0 and "== slot 0:" in shown.stdout


def test_first_exhausted_ends_the_run_where_a_component_runs_out(store, tmp_path):
    root, _ = store
    weights = {"c0q1": 0.2, "c0q2": 0.2, "c1q1": 0.6}  # c1q1: 19 slots a block of its ~170 sequences
    restart = open_trace(run_yaml(tmp_path, train_weights=weights), store=str(root))
    first = open_trace(run_yaml(tmp_path, train_weights=weights, stop_strategy="first_exhausted"), store=str(root))
    assert first.step(0, documents=False) == restart.step(0, documents=False)
    with pytest.raises(TrainConfigError, match="run has ended"):
        first.step(59, documents=False)


@pytest.mark.parametrize("data,top,match", [
    ({"train_weights": [[0, {"c0q1": 1.0}], [3, {"c0q2": 1.0}]]}, {}, "not a multiple of mixture_block_size"),
    ({"train_weights": {"c0q1": 0.0}}, {}, "sum to 0"),
    ({}, {"data_seed": 2**40}, "fits int32"),
    ({"mixture_block_size": 70_000}, {}, "mixture_block_size"),
])
def test_values_levanter_would_refuse_are_typed_errors(store, tmp_path, data, top, match):
    root, _ = store
    path = run_yaml(tmp_path, **data)
    config = yaml.safe_load(Path(path).read_text())
    Path(path).write_text(yaml.safe_dump({**config, **top}, sort_keys=False))
    with pytest.raises(TrainConfigError, match=match):
        open_trace(path, store=str(root))
