"""Schedule files: Marin's hero run as configuration, phase starts rounded to whole mixture blocks exactly as the
loader runs them, refused when malformed or when the run does not fit them, and printed by the plan."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import build_corpus

from marin_data.errors import InvalidScheduleError
from marin_model.config import get_preset
from marin_train.cli import main
from marin_train.config import DataConfig, TrainConfig
from marin_train.data import training_loader
from marin_train.plan import flops_per_token, phase_plans
from marin_train.schedule import load_schedule, round_to_block

ROOT = Path(__file__).resolve().parent.parent
MARIN = ROOT / "examples" / "schedules" / "marin-535b-a23b.yaml"


def write(tmp_path: Path, text: str, name: str = "schedule.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


SMALL = """
steps: 10
global_batch: 8
seq_len: 16
mixture_block: 16
phases:
  - {name: first, start_step: 0, weights: {a: 1}}
  - {name: second, start_step: 3, weights: {a: 1, b: 3}}
"""


def test_marins_hero_run_is_its_published_shape():
    s = load_schedule(MARIN)
    assert (s.steps, s.global_batch, s.seq_len, s.mixture_block) == (390_251, 11_264, 4_096, 49_152)
    assert s.starts() == [0, 108_000 * 11_264, 312_192 * 11_264] == [0, 24_750 * 49_152, 71_544 * 49_152]
    assert sum(s.lengths()) == s.sequences == 4_395_787_264
    assert s.sequences * s.seq_len == 18_005_144_633_344  # ~18.0T tokens
    assert get_preset("marin-535b-a23b").moe.capacity_factor == 1.15


@pytest.mark.parametrize("sequences, block, rounded", [
    (0, 16, 0), (7, 16, 0), (8, 16, 16), (24, 16, 32), (23, 16, 16), (40, 16, 48),  # halves go up
    (100 * 11_264, 49_152, 23 * 49_152),  # step 100 of Marin's batch: 22.9 blocks
    (1_216_512_000, 49_152, 1_216_512_000), (10**18 + 1, 2, 10**18 + 2)])  # exact with big integers
def test_round_to_block_is_the_nearest_whole_block_halves_up(sequences, block, rounded):
    assert round_to_block(sequences, block) == rounded


def test_the_loader_starts_each_phase_where_the_schedule_says(make_corpus, tmp_path):
    corpus = make_corpus({"a": [200, 200], "b": [300]})
    s = load_schedule(write(tmp_path, SMALL))
    assert s.starts() == [0, 32] and s.lengths() == [32, 48]  # step 3 = sequence 24 = 1.5 blocks: up to 2
    cfg = TrainConfig(steps=10, batch_size=8, seq_len=16, data=DataConfig(source=str(corpus.root), schedule=s))
    stream = training_loader(cfg, rank=0, world_size=1).dataset.stream
    assert [p.start for p in stream.mixture.phases] == [0, 32]
    subsets, _ = stream.locate(range(0, 80))
    assert set(subsets[:32].tolist()) == {stream.subsets.index("a")}  # phase 0 serves a only
    assert (subsets[32:] == stream.subsets.index("b")).sum() == 36  # 3/4 of phase 1's 48, exactly


def test_a_weight_that_would_move_a_boundary_is_refused(make_corpus, tmp_path):
    corpus = make_corpus({"a": [200, 200], "b": [300]})
    s = load_schedule(write(tmp_path, SMALL.replace("weights: {a: 1}}", "weights: {a: 1, b: 0.015625}}")))  # 1/65 of it
    cfg = TrainConfig(steps=10, batch_size=8, seq_len=16, data=DataConfig(source=str(corpus.root), schedule=s))
    with pytest.raises(InvalidScheduleError, match="block for phase 0 is 65 sequences"):
        training_loader(cfg, rank=0, world_size=1)
    with pytest.raises(InvalidScheduleError, match="global batch is 16"):
        training_loader(replace(cfg, batch_size=16), rank=0, world_size=1)


@pytest.mark.parametrize("text, words", [
    ("[1, 2]", "must be a mapping"),
    ("steps: 10\nglobal_batch: 8\nseq_len: 16\nphases: []\n", "missing ['mixture_block']"),
    (SMALL + "extra: 1\n", "unknown keys ['extra']"),
    (SMALL.replace("steps: 10", "steps: 0"), "steps must be a whole number >= 1"),
    (SMALL.replace("start_step: 0,", "start_step: 1,"), "first phase must start at step 0"),
    (SMALL.replace("start_step: 3", "start_step: 0"), "increasing steps"),
    (SMALL.replace("start_step: 3", "start_step: 10"), "at or after the run's end"),
    (SMALL.replace("mixture_block: 16", "mixture_block: 64"), "both start at sequence 0"),  # 3 steps: 3/8 block
    (SMALL.replace("{a: 1, b: 3}", "{a: -1}"), "numbers >= 0"),
    (SMALL.replace("{a: 1, b: 3}", "[a]"), "weights must map"),
    ("steps: [unclosed", "not valid YAML"),
])
def test_a_malformed_schedule_is_refused_by_name(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(InvalidScheduleError, match="schedule.yaml") as e:
        load_schedule(path)
    assert words in str(e.value)


def test_json_schedules_read_like_yaml(tmp_path):
    import json

    import yaml

    path = write(tmp_path, json.dumps(yaml.safe_load(SMALL)), "schedule.json")
    assert load_schedule(path).starts() == [0, 32]


def test_train_takes_a_schedule_and_refuses_flags_that_contradict_it(tmp_path, capsys):
    corpus = build_corpus(tmp_path / "corpus", {"a": [200, 200], "b": [300]})
    path = write(tmp_path, SMALL.replace("steps: 10", "steps: 6"))
    args = ["--data", str(corpus.root), "--schedule", str(path), "--batch-size", "8", "--log-every", "1"]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 0 and "done: step 6" in capsys.readouterr().out
    for extra, code, words in [(["--steps", "5"], 2, "contradicts the schedule's 6"),
                               (["--mixture", "a=1"], 2, "drop --mixture"),
                               (["--batch-size", "4"], 2, "global batch is 4")]:
        with pytest.raises(SystemExit) as exit_:
            main([*args, *extra])
        assert exit_.value.code == code and words in capsys.readouterr().err


def test_plan_prints_each_phases_start_tokens_and_flops_next_to_the_totals():
    s, cfg = load_schedule(MARIN), get_preset("marin-535b-a23b")
    plans = phase_plans(s, cfg)
    assert [p.start_step for p in plans] == [0, 108_000, 312_192]
    assert sum(p.tokens for p in plans) == 18_005_144_633_344
    per_token = sum(flops_per_token(cfg, 4096))
    assert sum(p.flops for p in plans) == pytest.approx(per_token * 18_005_144_633_344, rel=1e-12)
    run = subprocess.run([sys.executable, "-m", "marin_train.plan", "--schedule", str(MARIN)], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    for words in ("pretrain-late", "108,000", "3,516,530,688", "71,544", "18,005,144,633,344", "18.005T",
                  "published 2.7e+24"):
        assert words in run.stdout
