"""``marin-train``: a command group whose default command trains; checkpoint names it never writes through."""

from __future__ import annotations

import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from test_train import CFG, corpus, loader_for  # noqa: F401 - corpus is a fixture

from marin_train.checkpoint import prune_checkpoints
from marin_train.cli import _mixture_from, main, summary
from marin_train.loop import TrainResult, train

ROOT = Path(__file__).resolve().parent.parent


def test_usage_names_real_commands(capsys):
    top = subprocess.run([sys.executable, "-m", "marin_train", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert top.returncode == 0 and "Usage: python -m marin_train [OPTIONS] COMMAND [ARGS]" in top.stdout
    assert all(name in top.stdout for name in ("train", "eval", "generate", "export"))
    for name in ("eval", "generate"):
        with pytest.raises(SystemExit):
            main([name, "--help"])
        assert "EXAMPLES" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["--bogus"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Usage: marin-train train [OPTIONS]" in err and "No such option" in err
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "--ep INTEGER" in capsys.readouterr().out
    for args in (["-h"], ["export", "-h"]):  # as marin-data takes it
        with pytest.raises(SystemExit) as exit_:
            main(args)
        assert exit_.value.code == 0 and "Usage: marin-train" in capsys.readouterr().out


def test_the_last_line_compares_the_means_of_this_runs_first_and_last_steps():
    noisy = [{"step": 50 + i, "loss": 6.0 - 0.01 * i + (0.5 if i % 2 == 0 else -0.5), "data_wait": 0.0, "seconds": 1.0}
             for i in range(1, 51)]  # a resumed run: steps 51-100, each step's loss +-0.5 around a falling trend
    line = summary(TrainResult(100, noisy, "run/step-00000100", None))
    assert line.startswith("done: step 100; this run trained steps 51-100, mean loss 5.9450 (steps 51-60) -> "
                           "5.5450 (steps 91-100), data wait 0.00%")
    assert noisy[-1]["loss"] > noisy[0]["loss"]  # what a first-vs-last comparison got wrong
    one = summary(TrainResult(1, noisy[:1], None, None))
    assert one.startswith("done: step 1; this run trained step 51, loss 5.4900, data wait")


def test_the_default_command_trains_and_says_it_saves_nothing(corpus, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--data", str(corpus.root), "--steps", "1", "--batch-size", "2", "--seq-len", "32"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "saves no checkpoint" in out and "done: step 1" in out


def test_mixture_from_parses_steps_and_weights():
    assert _mixture_from(("100:a=0.5,b/*=0.5", "200:a=1")) == ((100, {"a": 0.5, "b/*": 0.5}), (200, {"a": 1.0}))
    with pytest.raises(Exception, match="STEP:SUBSET=W"):
        _mixture_from(("a=1",))


def test_checkpoints_are_never_written_through_a_symlink(corpus, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "latest").symlink_to(tmp_path / "elsewhere")
    cfg = replace(CFG, steps=1, checkpoint_dir=str(run))
    with pytest.raises(FileExistsError, match="latest is a symlink"):
        train(cfg, loader_for(corpus, cfg, tmp_path / "c"), log=lambda _: None, resume=False)
    assert not (tmp_path / "elsewhere").exists()


def test_a_single_file_checkpoint_of_earlier_versions_is_refused_by_name(corpus, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "step-00000001.pt").write_bytes(b"old")
    (run / "latest").write_text("step-00000001.pt")
    cfg = replace(CFG, steps=2, checkpoint_dir=str(run))
    with pytest.raises(ValueError, match="step-00000001.pt.*single-file checkpoints"):
        train(cfg, loader_for(corpus, cfg, tmp_path / "c"), log=lambda _: None)


def test_mixture_from_changes_the_mixture_on_resume(corpus, tmp_path, capsys):
    args = ["--data", str(corpus.root), "--steps", "4", "--batch-size", "2", "--seq-len", "32", "--log-every", "1",
            "--checkpoint-dir", str(tmp_path / "run"), "--mixture", "a=1", "--mixture", "b=1"]
    for extra in (["--until", "2"], ["--mixture-from", "3:a=1,b=3"]):
        with pytest.raises(SystemExit) as exit_:
            main([*args, *extra])
        assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "done: step 4; this run trained steps 3-4, mean loss" in out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as exit_:
            main(["export", str(tmp_path / "run/step-00000004"), "--to", str(tmp_path / "model")])
    assert exit_.value.code == 0 and (tmp_path / "model/model.safetensors").is_file()
    assert not [w for w in caught if "torch.distributed is disabled" in str(w.message)]


def test_reschedule_rebuilds_the_learning_rate_schedule_on_resume_and_says_so(corpus, tmp_path, capsys):
    args = ["--data", str(corpus.root), "--batch-size", "2", "--seq-len", "32", "--checkpoint-dir", str(tmp_path)]
    for extra in (["--steps", "20", "--until", "1"], ["--steps", "2", "--reschedule"]):
        with pytest.raises(SystemExit) as exit_:
            main([*args, *extra])
        assert exit_.value.code == 0
    assert ("learning-rate schedule rebuilt from this run's settings (--reschedule): peak 3.00e-03, warmup 10 steps, "
            "cosine to 3.00e-04 at step 2; the checkpoint's was peak 3.00e-03, warmup 10 steps, cosine to 3.00e-04 at "
            "step 20") in capsys.readouterr().out


def test_keep_checkpoints_deletes_the_oldest_and_says_so_and_zero_keeps_every_one(corpus, tmp_path, capsys):
    args = ["--data", str(corpus.root), "--steps", "3", "--batch-size", "2", "--seq-len", "32", "--checkpoint-every",
            "1"]
    for keep, run in (("1", tmp_path / "one"), ("0", tmp_path / "all")):
        with pytest.raises(SystemExit) as exit_:
            main([*args, "--checkpoint-dir", str(run), "--keep-checkpoints", keep])
        assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "one").glob("step-*")) == ["step-00000003"]
    for gone in ("step-00000001", "step-00000002"):
        assert f"deleted {tmp_path / 'one' / gone} (--keep-checkpoints 1 keeps the newest)" in out
    assert sorted(p.name for p in (tmp_path / "all").glob("step-*")) == [f"step-0000000{i}" for i in (1, 2, 3)]
    assert "deleted " + str(tmp_path / "all") not in out
    # export takes the run directory for its latest checkpoint
    for source, to in ((tmp_path / "all", tmp_path / "from-run"), (tmp_path / "all" / "step-00000003",
                                                                    tmp_path / "from-step")):
        with pytest.raises(SystemExit) as exit_:
            main(["export", str(source), "--to", str(to)])
        assert exit_.value.code == 0
    assert f"exported {tmp_path / 'all' / 'step-00000003'} to {tmp_path / 'from-run'}" in capsys.readouterr().out
    assert (tmp_path / "from-run" / "model.safetensors").read_bytes() == (
        tmp_path / "from-step" / "model.safetensors").read_bytes()


def test_export_refuses_a_directory_that_is_no_checkpoint_or_run_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(tmp_path), "--to", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert f"{tmp_path}: neither a checkpoint" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_the_checkpoint_just_written_is_kept_even_when_newer_steps_are_there(tmp_path):
    for step in (100, 150, 200):
        (tmp_path / f"step-{step:08d}").mkdir()
    current = tmp_path / "step-00000150"  # a run resumed from an older checkpoint wrote this one
    deleted = prune_checkpoints(tmp_path, keep=1, current=current)
    assert sorted(p.name for p in deleted) == ["step-00000100", "step-00000200"]
    assert [p.name for p in tmp_path.iterdir()] == [current.name]
    assert prune_checkpoints(tmp_path, keep=0, current=current) == []


def test_train_help_lists_every_option_under_exactly_one_heading(capsys):
    import re

    import click

    from marin_train.cli import command

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    sections: dict[str, list[str]] = {}
    for line in capsys.readouterr().out.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            sections[line[:-1]] = heading = []
        elif line.startswith("  -") and sections:  # an option's first line: its flags, then its help
            heading += re.findall(r"(?<![\w-])--?[a-z][\w-]*", line[2:].split("  ")[0])
    assert list(sections) == ["Data", "Remote corpus and shard cache", "Model and schedule",
                              "Checkpoints and resume", "Run"]
    flags = [flag for listed in sections.values() for flag in listed]
    every = [o for p in command.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)]
    assert sorted(flags) == sorted([*every, "-h", "--help"])  # each once
    assert sections["Data"][:1] == ["--data"] and "--checkpoint-dir" in sections["Checkpoints and resume"]


def test_a_sectioned_command_refuses_an_option_without_exactly_one_heading():
    import click

    from marin_train.help_sections import SectionedCommand

    params = [click.Option(["--a"]), click.Option(["--b"])]
    with pytest.raises(ValueError, match=r"heading, or unknown: b$"):
        SectionedCommand("x", params=params, sections=[("A", ["a"])])
    with pytest.raises(ValueError, match=r"heading, or unknown: a$"):
        SectionedCommand("x", params=params, sections=[("A", ["a", "b"]), ("B", ["a"])])
    with pytest.raises(ValueError, match=r"heading, or unknown: c$"):
        SectionedCommand("x", params=params, sections=[("A", ["a", "b", "c"])])
