"""Sealed checkpoints: a damaged or swapped ``.distcp`` is refused by name, ``latest`` naming a missing or damaged
step offers the newest intact one, every rank's files are covered and checked (real gloo ranks, resumed at
another world size), and no step's ``metrics.jsonl`` line is lost to a kill or repeated by a resume."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from conftest import VOCAB, build_corpus
from test_train import loader_for
from ranks import spawn_ranks

from marin_data.cli._errors import describe
from marin_data.errors import CheckpointDamagedError
from marin_train.checkpoint import resume_config
from marin_train.cli import main
from marin_train.config import TrainConfig
from marin_train.loop import train

ROOT = Path(__file__).resolve().parent.parent
CFG = TrainConfig(steps=2, batch_size=2, seq_len=32, warmup=1, log_every=1000, checkpoint_every=1,
                  model_overrides={"vocab_size": VOCAB, "n_layers": 2})
STEP1, STEP2 = "step-00000001", "step-00000002"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of two steps, checkpointed at each: ``step-00000001`` and ``step-00000002``."""
    root = tmp_path_factory.mktemp("sealed")
    corpus = build_corpus(root / "corpus", {"a": [200, 200], "b": [300]}, seed=5)
    cfg = replace(CFG, checkpoint_dir=str(root / "run"))
    train(cfg, loader_for(corpus, cfg, root / "cache"), log=lambda _: None)
    return corpus, root / "run"


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the trained run that a test may damage."""
    corpus, run = trained
    shutil.copytree(run, tmp_path / "run")
    return corpus, tmp_path / "run"


def resume(corpus, run: Path, cache: Path, steps: int = 3):
    """Train to ``steps`` in this process (a world of one), resuming from ``run``."""
    cfg = resume_config(replace(CFG, steps=steps, checkpoint_dir=str(run)), 1)
    return train(cfg, loader_for(corpus, cfg, cache), log=lambda _: None)


def zero_inside_a_tensor(path: Path) -> None:
    """Zero up to 1 MiB in the middle of the largest tensor stored in the ``.distcp`` file ``path``: where the
    bytes of production-size tensors are (damage to DCP's own framing is caught by torch itself)."""
    from torch.distributed.checkpoint import FileSystemReader

    stored = FileSystemReader(str(path.parent)).read_metadata().storage_data.values()
    largest = max((s for s in stored if s.relative_path == path.name), key=lambda s: s.length)
    n = min(1 << 20, largest.length // 2)
    with open(path, "r+b") as f:
        f.seek(largest.offset + (largest.length - n) // 2)
        f.write(bytes(n))


def metric_steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_checkpoint_is_sealed_with_the_size_and_sha256_of_each_of_its_files(run):
    _, run = run
    seal = json.loads((run / STEP2 / "seal.json").read_text())
    names = {p.name for p in (run / STEP2).iterdir()} - {"seal.json"}
    assert seal["step"] == 2 and set(seal["files"]) == names >= {".metadata", "__0_0.distcp", "trainer.pt"}
    assert seal["files"]["__0_0.distcp"]["bytes"] == (run / STEP2 / "__0_0.distcp").stat().st_size


@pytest.mark.parametrize("damage", ["zeroed", "from another step"])
def test_a_damaged_distcp_is_refused_by_name_and_the_previous_step_offered(run, tmp_path, damage):
    corpus, run = run
    target = run / STEP2 / "__0_0.distcp"
    if damage == "zeroed":
        zero_inside_a_tensor(target)
    else:
        shutil.copyfile(run / STEP1 / "__0_0.distcp", target)  # the same size: only its digest differs
    with pytest.raises(CheckpointDamagedError, match=rf"{STEP2}.*__0_0.distcp.*sha256(.|\n)*{STEP1}"):
        resume(corpus, run, tmp_path / "c")
    assert (run / "latest").read_text() == STEP2  # nothing was changed


def test_a_checkpoint_renamed_to_another_step_is_refused(run, tmp_path):
    corpus, run = run
    shutil.rmtree(run / STEP2)
    shutil.copytree(run / STEP1, run / STEP2)  # every file intact, but step 1's
    with pytest.raises(CheckpointDamagedError, match=f"{STEP2}.*holds step 1"):
        resume(corpus, run, tmp_path / "c")


@pytest.mark.parametrize("damage", ["missing", "truncated", "unsealed"])
def test_latest_naming_a_missing_or_damaged_step_says_so_and_offers_the_newest_intact_one(run, tmp_path, damage):
    corpus, run = run
    if damage == "missing":
        shutil.rmtree(run / STEP2)
    elif damage == "truncated":
        os.truncate(run / STEP2 / ".metadata", 100)
    else:
        (run / STEP2 / "seal.json").unlink()
    why = {"missing": "does not exist", "truncated": r"\.metadata holds 100 bytes", "unsealed": "no seal"}[damage]
    with pytest.raises(CheckpointDamagedError, match=rf"latest names {STEP2}.*{why}(.|\n)*newest intact.*{STEP1}"):
        resume(corpus, run, tmp_path / "c")
    (run / "latest").write_text(STEP1)  # what the message offers
    assert [r["step"] for r in resume(corpus, run, tmp_path / "c").records] == [2, 3]
    assert metric_steps(run) == [1, 2, 3]  # step 2's line of the damaged run replaced, not repeated


def test_no_intact_checkpoint_left_says_to_start_afresh(run, tmp_path):
    corpus, run = run
    for step in (STEP1, STEP2):
        (run / step / "seal.json").unlink()
    with pytest.raises(CheckpointDamagedError, match="no intact checkpoint.*--no-resume"):
        resume(corpus, run, tmp_path / "c")


def test_marin_train_names_the_damaged_file_and_exits_19(run, capsys):
    corpus, run = run
    zero_inside_a_tensor(run / STEP2 / "__0_0.distcp")
    with pytest.raises(SystemExit) as exit_:
        main(["--data", str(corpus.root), "--steps", "3", "--batch-size", "2", "--seq-len", "32",
              "--checkpoint-dir", str(run)])
    err = capsys.readouterr().err
    assert exit_.value.code == 24 and "__0_0.distcp" in err and "-> " in err and STEP1 in err


def test_export_refuses_a_damaged_checkpoint(run, tmp_path):
    from marin_train.export import export_checkpoint

    _, run = run
    zero_inside_a_tensor(run / STEP2 / "__0_0.distcp")
    with pytest.raises(CheckpointDamagedError, match="__0_0.distcp"):
        export_checkpoint(run / STEP2, tmp_path / "model")
    assert not (tmp_path / "model" / "model.safetensors").exists()


def test_a_checkpoint_of_the_previous_format_without_a_seal_still_resumes(run, tmp_path):
    corpus, run = run
    (run / STEP2 / "seal.json").unlink()
    config = json.loads((run / STEP2 / "config.json").read_text())
    (run / STEP2 / "config.json").write_text(json.dumps({**config, "format": 2}))
    assert [r["step"] for r in resume(corpus, run, tmp_path / "c").records] == [3]


# --- hostile pickles: nothing of a checkpoint runs code, sealed or not -----------------------------------


class Payload:
    """Pickles to a call of ``exec`` that writes ``marker``: what a forged checkpoint file would carry."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def forged(marker: Path, size: int | None = None) -> bytes:
    """A pickle that writes ``marker`` when loaded, padded to ``size`` bytes (a pickle ends at its STOP)."""
    data = pickle.dumps(Payload(marker))
    return data if size is None else data + b" " * (size - len(data))


def reseal(checkpoint: Path) -> None:
    """Seal ``checkpoint``'s files as they are now: what anyone who can write a checkpoint can do."""
    seal = json.loads((checkpoint / "seal.json").read_text())
    seal["files"] = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                     for p in checkpoint.iterdir() if p.name != "seal.json"}
    (checkpoint / "seal.json").write_text(json.dumps(seal))


def train_cli(corpus, run: Path, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(["--data", str(corpus.root), "--steps", "3", "--batch-size", "2", "--seq-len", "32",
              "--checkpoint-dir", str(run)])
    return exit_.value.code, capsys.readouterr().err


@pytest.mark.parametrize("damage", ["a pickle of its size", "200 bytes rotten"])
def test_a_swapped_or_rotten_trainer_pt_is_refused_by_name_before_it_is_unpickled(run, tmp_path, capsys, damage):
    corpus, run = run
    trainer, marker = run / STEP2 / "trainer.pt", tmp_path / "marker"
    size = trainer.stat().st_size
    if damage == "a pickle of its size":
        trainer.write_bytes(forged(marker, size))
    else:
        data = bytearray(trainer.read_bytes())
        data[size // 2:size // 2 + 200] = bytes(200)
        trainer.write_bytes(bytes(data))
    assert trainer.stat().st_size == size  # the quick look at `latest` (sizes only) passes
    code, err = train_cli(corpus, run, capsys)
    assert not marker.exists()
    assert code == 24 and f"{STEP2}: latest" not in err and "trainer.pt" in err and STEP1 in err, err
    assert "Traceback" not in err and "Unpickling" not in err


@pytest.mark.parametrize("name", ["trainer.pt", ".metadata"])
def test_a_forged_pickle_sealed_anew_runs_nothing_and_is_refused_by_name(run, tmp_path, name):
    corpus, run = run
    marker = tmp_path / "marker"
    (run / STEP2 / name).write_bytes(forged(marker))
    reseal(run / STEP2)
    with pytest.raises(CheckpointDamagedError, match=rf"{STEP2}(.|\n)*{re.escape(name)}") as refused:
        resume(corpus, run, tmp_path / "c")
    assert not marker.exists() and describe(refused.value)[1] == 24


def test_a_trainer_pt_of_plain_values_but_no_rng_state_sealed_anew_is_refused_by_name(run, tmp_path):
    corpus, run = run
    trainer = torch.load(run / STEP2 / "trainer.pt", weights_only=True)
    torch.save({**trainer, "rng": {**trainer["rng"], "torch": torch.zeros(3)}}, run / STEP2 / "trainer.pt")
    reseal(run / STEP2)
    with pytest.raises(CheckpointDamagedError, match=f"{STEP2}.*trainer.pt holds no RNG state"):
        resume(corpus, run, tmp_path / "c")


def test_dcp_values_are_read_as_plain_values_only(tmp_path):
    """DCP stores a state's non-tensor values (an optimizer's hyperparameters) as pickles, which its own
    planner loads with ``weights_only=False``."""
    from marin_train.safe_load import load_shards

    marker = tmp_path / "marker"
    dcp.save({"w": torch.ones(3), "lr": 0.5}, checkpoint_id=tmp_path / "plain", no_dist=True)
    dcp.save({"w": torch.ones(3), "lr": Payload(marker)}, checkpoint_id=tmp_path / "forged", no_dist=True)
    state = {"w": torch.zeros(3), "lr": 0.0}
    load_shards(tmp_path / "plain", state, no_dist=True)
    assert state["lr"] == 0.5 and torch.equal(state["w"], torch.ones(3))
    with pytest.raises(CheckpointDamagedError, match="lr"):
        load_shards(tmp_path / "forged", state, no_dist=True)
    assert not marker.exists()


def test_a_trainer_pt_of_the_previous_version_with_numpys_rng_state_as_an_array_still_resumes(run, tmp_path):
    corpus, run = run
    trainer = torch.load(run / STEP2 / "trainer.pt", weights_only=True)
    kind, keys, *rest = trainer["rng"]["numpy"]
    trainer["rng"]["numpy"] = (kind, np.array(keys, dtype=np.uint32), *rest)  # as np.random.get_state() has it
    torch.save(trainer, run / STEP2 / "trainer.pt")
    reseal(run / STEP2)
    assert [r["step"] for r in resume(corpus, run, tmp_path / "c").records] == [3]


KILLED = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from dataclasses import replace
from conftest import build_corpus
from test_checkpoint_seal import CFG, loader_for
from marin_data.corpus.manifest import load_corpus
import marin_train.checkpoint as checkpoint
from marin_train.loop import train
write = checkpoint.atomic_write
def write_then_die(path, fn):  # SIGKILL right after `latest` names step 2, before anything else
    write(path, fn)
    if path.name == "latest" and path.read_text() == "step-00000002":
        os.kill(os.getpid(), signal.SIGKILL)
checkpoint.atomic_write = write_then_die
cfg = replace(CFG, checkpoint_dir={run!r})
train(cfg, loader_for(load_corpus({corpus!r}), cfg, {cache!r}), log=print)
"""


def test_a_kill_between_the_latest_flip_and_the_metrics_append_loses_no_line(trained, tmp_path):
    corpus, _ = trained
    run = tmp_path / "run"
    script = KILLED.format(tests=str(ROOT / "tests"), run=str(run), corpus=str(corpus.root), cache=str(tmp_path / "c"))
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (run / "latest").read_text() == STEP2 and metric_steps(run) == [1]  # step 2's line not yet written
    assert [r["step"] for r in resume(corpus, run, tmp_path / "c").records] == [3]
    assert metric_steps(run) == [1, 2, 3]


# --- a full disk ----------------------------------------------------------------------------------------

FULL_DISK = """
import json, math, os, shutil, subprocess, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_checkpoint_seal import resume
from marin_data.cli._errors import describe
from marin_data.corpus.manifest import load_corpus
from marin_train.seal import verify_checkpoint
mnt, trained, corpus, cache = Path({mnt!r}), Path({run!r}), load_corpus({corpus!r}), Path({cache!r})
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], check=True)
pages = sum(math.ceil(p.stat().st_size / 4096) for p in (trained / "step-00000002").iterdir())
for more in {more!r}:  # pages free beyond what the files of a checkpoint take (tmpfs counts whole pages)
    run, filler = mnt / "run", mnt / "filler"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(trained, run)
    free = os.statvfs(mnt)
    filler.write_bytes(bytes(free.f_bavail * free.f_frsize - 4096 * (pages + more)))
    try:
        resume(corpus, run, cache)
        failed = None
    except BaseException as e:  # DCP's CheckpointException is no Exception
        failed = describe(e) or repr(e)[:2000]
    left = sorted(os.listdir(run))
    intact = []
    for name in left:
        if name.startswith("step-"):
            verify_checkpoint(run / name)
            intact.append(name)
    latest = (run / "latest").read_text()
    filler.unlink()
    again = [r["step"] for r in resume(corpus, run, cache).records]
    lines = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    print(json.dumps(dict(more=more, failed=failed, left=left, intact=intact, latest=latest, again=again,
                          lines=lines)))
"""


def can_mount_a_tmpfs() -> bool:
    try:
        return subprocess.run(["unshare", "-r", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                              capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not can_mount_a_tmpfs(), reason="needs user and mount namespaces (unshare -r -m) for a small tmpfs")
def test_a_full_disk_during_a_save_exits_17_leaves_nothing_wrong_and_the_rerun_resumes(trained, tmp_path):
    """Each save runs out of room at another point: in DCP's files, in trainer.pt, in seal.json
    and at the ``latest`` flip (-400, -6, -2 and 0 pages beyond what a checkpoint's files take)."""
    corpus, run = trained
    (tmp_path / "mnt").mkdir()
    script = FULL_DISK.format(tests=str(ROOT / "tests"), mnt=str(tmp_path / "mnt"), run=str(run),
                              corpus=str(corpus.root), cache=str(tmp_path / "c"), more=[-400, -6, -2, 0])
    done = subprocess.run(["unshare", "-r", "-m", sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    cases = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(cases) == 4
    for case in cases:
        message, code = case["failed"]
        assert code == 17 and "step-00000003: cannot save this checkpoint" in message, case
        assert case["latest"] == STEP2 and ".step-00000003.part" not in case["left"], case  # nothing committed
        assert case["intact"] == [n for n in case["left"] if n.startswith("step-")]  # every step-* is whole
        assert case["again"] == [3] and case["lines"] == [1, 2, 3], case  # the re-run resumed
    # Out of room at the `latest` flip: step 3 complete under its name, but not the latest one.
    assert [c["more"] for c in cases if "step-00000003" in c["intact"]] == [0]


# --- several ranks ------------------------------------------------------------------------------------


def _rank(rank: int, world: int, out: str, corpus: str, cfg: TrainConfig) -> None:
    """One gloo rank: resume (or start) ``cfg`` and record the steps it ran, or the error that refused it."""
    from marin_data.corpus.manifest import load_corpus
    from marin_train.distributed import shutdown_distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}.init", rank=rank, world_size=world)
    cfg = replace(cfg, batch_size=cfg.batch_size // world)  # cfg.batch_size is the global batch here
    try:
        cfg = resume_config(cfg, world)
        result = train(cfg, loader_for(load_corpus(corpus), cfg, Path(f"{out}.cache{rank}")), log=lambda _: None)
        outcome = {"steps": [r["step"] for r in result.records]}
    except CheckpointDamagedError as e:
        outcome = {"error": str(e)}
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(outcome))
    shutdown_distributed()


def spawn(out: Path, corpus, world: int, cfg: TrainConfig) -> list[dict]:
    spawn_ranks(_rank, (world, str(out), str(corpus.root), cfg), world)
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
def test_every_ranks_files_are_sealed_and_checked_at_any_world_size(trained, tmp_path):
    corpus, _ = trained
    run = tmp_path / "run"
    cfg = replace(CFG, batch_size=4, checkpoint_dir=str(run))  # a global batch of 4 over 2 ranks
    assert spawn(tmp_path / "first", corpus, 2, cfg) == [{"steps": [1, 2]}] * 2
    seal = json.loads((run / STEP2 / "seal.json").read_text())
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(seal["files"])  # rank 1's shards too
    rank1 = run / STEP2 / "__1_0.distcp"
    intact = rank1.read_bytes()
    zero_inside_a_tensor(rank1)
    damaged = spawn(tmp_path / "damaged", corpus, 2, replace(cfg, steps=3))
    assert all("__1_0.distcp" in r.get("error", "") for r in damaged), damaged  # every rank refuses
    with pytest.raises(CheckpointDamagedError, match="__1_0.distcp"):  # and one process hashing it all
        resume(corpus, run, tmp_path / "c")
    rank1.write_bytes(intact)
    assert [r["step"] for r in resume(corpus, run, tmp_path / "c").records] == [3]  # world 2 -> world 1
    assert metric_steps(run) == [1, 2, 3]
