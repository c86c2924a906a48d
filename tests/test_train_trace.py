"""``marin-train trace RUN``: what a run trained on, from what its checkpoint recorded (its stream's fingerprint
and the manifest it read among them); ``python -m marin_train.plan --data`` shows the exposure before a run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import build_corpus

from marin_data.loader.trace import Trace
from marin_train.cli import main
from marin_train.seal import SEAL, seal_document
from marin_train.trace import open_run

ROOT = Path(__file__).resolve().parent.parent
SCHEDULE = """steps: 6
global_batch: 8
seq_len: 32
mixture_block: 16
phases:
  - {name: one, start_step: 0, weights: {a: 0.5, b: 0.5}}
  - {name: two, start_step: 2, weights: {a: 0.1, b: 0.9}}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Four of the six steps of a run (2 micro-batches of 4 a step) on a corpus whose subset ``z`` no phase weighs."""
    root = tmp_path_factory.mktemp("traced")
    corpus = build_corpus(root / "corpus", {"a": [200, 200], "b": [300], "z": [5]}, seed=5)
    (root / "schedule.yaml").write_text(SCHEDULE)
    with pytest.raises(SystemExit) as exit_:
        main(["--data", str(corpus.root), "--schedule", str(root / "schedule.yaml"), "--batch-size", "4",
              "--accumulation", "2", "--checkpoint-dir", str(root / "run"), "--until", "4", "--seed", "1",
              "--log-every", "100"])
    assert exit_.value.code == 0
    return root / "run", corpus, root


def trace_cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(["trace", *args])
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


def test_the_checkpoint_records_the_stream_and_the_manifest_it_read(run):
    path, corpus, _ = run
    recorded = json.loads((path / "step-00000004" / "config.json").read_text())
    assert recorded["train"]["data"]["manifest_sha256"] == corpus.manifest_sha256
    assert recorded["global_batch"] == 8
    with open_run(str(path)) as (cfg, trace, _):
        assert recorded["stream"]["fingerprint"] == trace.stream.fingerprint
        assert cfg.steps == 6 and trace.global_batch == 8


def test_a_step_lists_each_slot_and_each_document_leads_back_to_it(run, capsys):
    path, corpus, _ = run
    code, out, _ = trace_cli(capsys, str(path), "--step", "3", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["step"] == 3 and len(doc["batch"]) == 8
    with open_run(str(path)) as (_, trace, _):
        subset, _ = trace.stream.locate(range(16, 24))
    for j, slot in enumerate(doc["batch"]):
        assert {"subset", "sequence", "shard", "sha256", "license", "documents"} <= set(slot)
        assert slot["subset"] == ("a", "b")[subset[j]] and slot["license"] == "CC0-1.0"
        assert slot["sha256"] == next(s.sha256 for s in corpus.shards if s.path == slot["shard"])
        for d in slot["documents"]:
            assert set(d) == {"id", "first", "last"} and 0 <= d["first"] <= d["last"]
    first = doc["batch"][5]["documents"][0]["id"]
    code, out, _ = trace_cli(capsys, str(path), "--document", first, "--json")
    back = json.loads(out)
    assert code == 0 and set(back) >= {"document", "steps", "slots"} and back["document"] == first
    assert (3, 5) in zip(back["steps"], back["slots"])
    code, out, _ = trace_cli(capsys, str(path), "--step", "3")
    assert code == 0 and doc["batch"][0]["shard"] in out and first in out


def test_the_summary_counts_each_subset_and_names_those_never_served(run, capsys):
    path, _, _ = run
    code, out, _ = trace_cli(capsys, str(path), "--summary", "--until", "2", "--json")
    table = json.loads(out)
    assert code == 0 and table["until"] == 2 and table["never_served"] == ["z"]
    assert sum(e["sequences"] for e in table["subsets"]) == 16
    assert {e["subset"]: e["tokens"] for e in table["subsets"]} == {e["subset"]: 32 * e["sequences"]
                                                                    for e in table["subsets"]}
    code, out, _ = trace_cli(capsys, str(path), "--summary")
    assert code == 0 and "steps 1-6" in out and "never served: z" in out


@pytest.mark.parametrize("args, code, words", [
    (["--step", "3", "--summary"], 2, "give one of --step, --document and --summary"),
    ([], 2, "give one of"),
    (["--step", "7"], 2, "this run's steps are 1-6"),
    (["--summary", "--until", "0"], 2, "this run's steps are 1-6"),
    (["--step", "2", "--until", "3"], 2, "--until goes with"),
    (["--document", "a/9/9"], 2, "no document with id 'a/9/9' in this corpus"),
])
def test_bad_queries_are_refused_in_one_line(run, capsys, args, code, words):
    got, _, err = trace_cli(capsys, str(run[0]), *args)
    assert got == code and words in err and "Traceback" not in err


def test_a_document_the_run_never_weighed_was_never_served(run, capsys):
    code, out, _ = trace_cli(capsys, str(run[0]), "--document", "z/0/1", "--json")
    assert code == 0 and json.loads(out)["steps"] == []


def test_another_corpus_or_a_path_that_is_no_run_is_refused(run, capsys, tmp_path):
    path, _, root = run
    other = build_corpus(tmp_path / "other", {"a": [200, 200], "b": [300], "z": [5]}, seed=6)
    code, _, err = trace_cli(capsys, str(path), "--step", "1", "--data", str(other.root))
    assert code == 12 and "differs from the one it trained on (in: data)" in err
    code, _, err = trace_cli(capsys, str(root), "--step", "1")
    assert code == 24 and "neither a checkpoint" in err


def test_a_copy_of_the_corpus_gives_the_same_answers(run, capsys, tmp_path):
    import shutil

    path, corpus, _ = run
    shutil.copytree(corpus.root, tmp_path / "copy")
    answers = [trace_cli(capsys, str(path), "--step", "4", "--json", *extra)[1] for extra in
               ([], ["--data", str(tmp_path / "copy"), "--cache-dir", str(tmp_path / "cache")])]
    assert answers[0] == answers[1]
    doc = json.loads(answers[0])["batch"][0]["documents"][0]["id"]
    steps = json.loads(trace_cli(capsys, str(path / "step-00000004"), "--document", doc, "--json")[1])["steps"]
    with open_run(str(path / "step-00000004")) as (_, trace, _):
        assert isinstance(trace, Trace)
        assert np.array_equal(trace.document(doc, 6) // 8 + 1, steps)  # the planned end, not the checkpoint's


def test_plan_shows_the_exposure_of_a_schedule_on_a_corpus_before_the_run(run):
    _, corpus, root = run
    args = [sys.executable, "-m", "marin_train.plan", "--preset", "tiny", "--gpus", "8", "--ep", "1",
            "--schedule", str(root / "schedule.yaml")]
    done = subprocess.run([*args, "--data", str(corpus.root), "--seed", "1", "--until", "2"], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "steps 1-2" in done.stdout and "never served: z" in done.stdout
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["a"], ["b"])}
    assert int(rows["a"][1]) + int(rows["b"][1]) == 16
    refused = subprocess.run([*args[:-2], "--data", str(corpus.root)], capture_output=True, text=True, cwd=ROOT,
                             timeout=300)
    assert refused.returncode == 2 and "need --schedule" in refused.stderr
    empty = root / "not-a-corpus"
    empty.mkdir(exist_ok=True)
    (empty / "notes.txt").write_text("no corpus here")
    unknown = subprocess.run([*args, "--data", str(empty)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: ") and "Traceback" not in unknown.stderr


def test_a_checkpoint_that_records_no_fingerprint_is_traced_and_says_it_is_unchecked(run, capsys, tmp_path):
    import shutil

    old = tmp_path / "step-00000004"
    shutil.copytree(run[0] / "step-00000004", old)
    recorded = json.loads((old / "config.json").read_text())
    del recorded["stream"]  # as checkpoints written before the stream was recorded, and sealed so
    (old / "config.json").write_text(json.dumps(recorded))
    (old / SEAL).unlink()
    (old / SEAL).write_text(json.dumps(seal_document(old, recorded["step"], rank=0, world=1)))
    code, out, err = trace_cli(capsys, str(old), "--step", "2", "--json")
    assert code == 0 and "records no stream fingerprint" in err
    assert out == trace_cli(capsys, str(run[0]), "--step", "2", "--json")[1]
