"""``marin-train --packing`` and ``--val-fraction``: a run trains on the loader's own windows of that packing,
a schedule file may set both, a resume keeps the checkpoint's (refused by flag name otherwise), and the log and
``marin-train eval`` say which held-out evaluation they read and how large it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import build_text_corpus

import marin_train.run as run_module
from marin_data.errors import InvalidScheduleError
from marin_data.loader import LoaderConfig, make_loader
from marin_train.cli import main
from marin_train.data import eval_config, eval_stream
from marin_train.schedule import load_schedule

SEQ = 32
TRAIN = ["--batch-size", "2", "--seq-len", str(SEQ), "--threads", "1", "--log-every", "100"]
SCHEDULE = """
steps: 2
global_batch: 2
seq_len: 32
mixture_block: 4
phases:
  - {start_step: 0, weights: {code: 0.5, "prose/*": 0.5}}
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_text_corpus(tmp_path_factory.mktemp("packing") / "corpus", {"code": 300, "prose/a": 300})[0]


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()  # --threads sets this worker's count: give it back
    yield
    torch.set_num_threads(before)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


class Recorded:
    """A loader that keeps a copy of each batch it hands the trainer."""

    def __init__(self, loader):
        self.loader, self.batches = loader, []

    def __iter__(self):
        for batch in self.loader:
            self.batches.append({k: v.clone() for k, v in batch.items()})
            yield batch

    def __getattr__(self, name):
        return getattr(self.loader, name)


def loader_batches(corpus, packing: str, n: int, tmp_path: Path) -> list[dict[str, torch.Tensor]]:
    config = LoaderConfig(seq_len=SEQ, batch_size=2, seed=0, val_fraction=0.05, packing=packing)
    batches = iter(make_loader(corpus, config, cache_dir=tmp_path / "cache"))
    return [next(batches) for _ in range(n)]


def test_packing_levanter_trains_on_the_loaders_own_levanter_windows(corpus, tmp_path, capsys, monkeypatch):
    seen, train = [], run_module.train

    def spy(cfg, loader, **kw):
        seen.append(Recorded(loader))
        return train(cfg, seen[-1], **kw)

    monkeypatch.setattr(run_module, "train", spy)
    code, out, _ = cli(capsys, "--data", str(corpus.root), "--steps", "2", "--packing", "levanter", "--val-fraction",
                       "0.05", "--checkpoint-dir", str(tmp_path / "run"), *TRAIN)
    assert code == 0 and "done: step 2" in out
    got = seen[0].batches
    want = loader_batches(corpus, "levanter", 2, tmp_path)
    assert len(got) == 2 and all("segment_ids" not in b for b in got)  # no boundaries: causal attention
    for g, w in zip(got, want):
        for field in ("input_ids", "labels", "index"):
            assert torch.equal(g[field], w[field]), field
        assert (g["labels"][:, -1] == -100).all()  # a levanter window's last position has no label
    overlap = loader_batches(corpus, "overlap", 1, tmp_path)[0]
    assert not torch.equal(overlap["input_ids"], got[0]["input_ids"])  # the check tells the packings apart
    recorded = json.loads((tmp_path / "run" / "step-00000002" / "config.json").read_text())
    assert recorded["train"]["data"]["packing"] == "levanter" and recorded["train"]["data"]["val_fraction"] == 0.05
    assert recorded["stream"]["components"]["packing"] == "levanter"


def test_a_resume_with_another_packing_or_held_out_fraction_is_refused_by_flag(corpus, tmp_path, capsys):
    run = ["--data", str(corpus.root), "--steps", "3", "--checkpoint-dir", str(tmp_path / "run"), *TRAIN]
    assert cli(capsys, *run, "--packing", "levanter", "--val-fraction", "0.05", "--until", "1")[0] == 0
    code, _, err = cli(capsys, *run, "--val-fraction", "0.05")
    assert code == 12 and ("was trained with --packing levanter, this run has --packing overlap" in err
                           and "resume with --packing levanter" in err)
    code, _, err = cli(capsys, *run, "--packing", "levanter")
    assert code == 12 and "was trained with --val-fraction 0.05, this run has --val-fraction 0.001" in err
    code, out, _ = cli(capsys, *run, "--packing", "levanter", "--val-fraction", "0.05")
    assert code == 0 and "resumed from" in out and "done: step 3" in out


def test_a_schedule_file_sets_packing_and_the_held_out_fraction(corpus, tmp_path, capsys):
    path = tmp_path / "schedule.yaml"
    path.write_text(SCHEDULE + "packing: levanter\nval_fraction: 0.05\n")
    assert load_schedule(path).data_fields() == {"packing": "levanter", "val_fraction": 0.05}
    path.with_name("plain.yaml").write_text(SCHEDULE)
    assert load_schedule(path.with_name("plain.yaml")).data_fields() == {}
    args = ["--data", str(corpus.root), "--schedule", str(path), "--checkpoint-dir", str(tmp_path / "run"), *TRAIN]
    code, out, _ = cli(capsys, *args, "--packing", "levanter")  # a flag that agrees is fine
    assert code == 0 and "done: step 2" in out
    recorded = json.loads((tmp_path / "run" / "step-00000002" / "config.json").read_text())["train"]["data"]
    assert (recorded["packing"], recorded["val_fraction"]) == ("levanter", 0.05)
    for flag, value, words in (("--packing", "overlap", "--packing overlap contradicts the schedule's levanter"),
                               ("--val-fraction", "0.01", "--val-fraction 0.01 contradicts the schedule's 0.05")):
        code, _, err = cli(capsys, *args, "--no-resume", flag, value)
        assert code == 2 and words in err


@pytest.mark.parametrize("extra, words", [
    ("packing: bogus\n", "packing must be one of overlap, levanter, got 'bogus'"),
    ("packing: [levanter]\n", "packing must be one of overlap, levanter, got ['levanter']"),
    ("val_fraction: 0.7\n", "val_fraction must be a number in [0, 0.5], got 0.7"),
    ("val_fraction: yes\n", "val_fraction must be a number in [0, 0.5], got True"),
])
def test_a_schedule_with_a_bad_packing_or_held_out_fraction_is_refused(tmp_path, extra, words):
    path = tmp_path / "schedule.yaml"
    path.write_text(SCHEDULE + extra)
    with pytest.raises(InvalidScheduleError, match="schedule.yaml") as e:
        load_schedule(path)
    assert words in str(e.value)


def test_bad_flag_values_are_refused_by_click(corpus, capsys):
    for flag, value in (("--packing", "tight"), ("--val-fraction", "0.9")):
        code, _, err = cli(capsys, "--data", str(corpus.root), flag, value)
        assert code == 2 and f"Invalid value for '{flag}'" in err


def test_the_log_and_eval_say_which_held_out_evaluation_and_how_large(corpus, tmp_path, capsys):
    stream = eval_stream(str(corpus.root), eval_config(SEQ, 0.05, None, "levanter"))
    split = stream.stop("validation")
    data = split + sum(stream.sizes("train").values())
    assert split > 10
    size = (f"evaluation: 10 sequences of 32 tokens (320 tokens): {100 * 10 / split:.3g}% of the held-out split, "
            f"which is {100 * split / data:.3g}% of the data (val_fraction 0.05, levanter packing)")
    run = str(tmp_path / "run")
    code, out, _ = cli(capsys, "--data", str(corpus.root), "--steps", "2", "--packing", "levanter", "--val-fraction",
                       "0.05", "--eval-every", "2", "--eval-tokens", "320", "--checkpoint-dir", run, *TRAIN)
    assert code == 0 and size + "; every 2 steps and at the last\n" in out
    code, out, err = cli(capsys, "eval", run, "--data", str(corpus.root), "--max-tokens", "320", "--threads", "1",
                         "--json")
    assert code == 0 and err.splitlines()[0] == size
    result = json.loads(out)
    assert result["evaluation"] == {"sequences": 10, "seq_len": SEQ, "tokens": 320, "split_sequences": split,
                                    "data_sequences": data, "of_split": 10 / split, "split_of_data": split / data,
                                    "packing": "levanter", "val_fraction": 0.05}
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    # the same windows as the run's own evaluation: the run's packing and split, not the defaults
    assert result["overall"]["loss"] == last["eval/loss"] and result["overall"]["tokens"] == last["eval/tokens"]
