"""The training loop: exact resume, and two data-parallel ranks on CPU (gloo)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, build_corpus

from marin_data.loader import LoaderConfig, make_loader
from marin_train.config import TrainConfig
from marin_train.loop import lr_at, train
from marin_train.parallel import full_state_dict

ROOT = Path(__file__).resolve().parent.parent
CFG = TrainConfig(steps=20, batch_size=2, seq_len=32, warmup=4, log_every=1000, model_overrides={"vocab_size": VOCAB, "n_layers": 2})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("train") / "corpus", {"a": [200, 200], "b": [300]}, seed=5)


def loader_for(corpus, cfg: TrainConfig, cache: Path, **kw):
    config = LoaderConfig(seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed, segments=True)
    return make_loader(corpus, config, cache_dir=cache, **kw)


def digest(model: torch.nn.Module) -> str:
    """Of the whole state (gathered from the shards: a collective under torchrun)."""
    h = hashlib.sha256()
    for name, t in sorted(full_state_dict(model).items()):
        h.update(name.encode() + t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_twenty_steps_equal_ten_then_resume_then_ten_bitwise(corpus, tmp_path):
    whole = train(replace(CFG, accumulation=2), loader_for(corpus, CFG, tmp_path / "c"), log=lambda _: None)
    cfg = replace(CFG, accumulation=2, checkpoint_dir=str(tmp_path / "run"))
    first = train(cfg, loader_for(corpus, CFG, tmp_path / "c"), log=lambda _: None, until=10)
    assert first.steps == 10 and Path(first.checkpoint).name == "step-00000010"
    second = train(cfg, loader_for(corpus, CFG, tmp_path / "c"), log=lambda _: None)  # resumes at 10
    assert [r["step"] for r in second.records] == list(range(11, 21))
    assert [r["loss"] for r in first.records + second.records] == [r["loss"] for r in whole.records]
    assert digest(second.model) == digest(whole.model)  # weights and the balancing bias, bit for bit
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 21))
    assert [m["step"] for m in metrics if "time_to_first_step" in m] == [1, 11]  # each run's first step


def test_a_resume_with_other_steps_keeps_the_checkpoint_s_learning_rates_unless_rescheduled(corpus, tmp_path):
    whole = train(CFG, loader_for(corpus, CFG, tmp_path / "c"), log=lambda _: None)  # 20 steps, uninterrupted
    cfg = replace(CFG, checkpoint_dir=str(tmp_path / "run"))
    train(cfg, loader_for(corpus, CFG, tmp_path / "c"), log=lambda _: None, until=10)
    lines = []
    kept = train(replace(cfg, steps=15), loader_for(corpus, CFG, tmp_path / "c"), log=lines.append)
    assert kept.steps == 15 and [r["lr"] for r in kept.records] == [r["lr"] for r in whole.records[10:15]]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["lr"] for m in metrics] == [r["lr"] for r in whole.records[:15]]
    said = next(line for line in lines if line.startswith("learning-rate schedule"))
    assert said == ("learning-rate schedule from the checkpoint: peak 3.00e-03, warmup 4 steps, cosine to 3.00e-04 at "
                    "step 20; this run's steps 15 (the checkpoint's 20) leave it as it is (--reschedule rebuilds it "
                    "from them); the run stops at step 15")
    lines.clear()  # the checkpoint at 15 keeps the 20-step schedule; rebuilding it takes the flag, and says so
    rebuilt = train(replace(cfg, steps=18), loader_for(corpus, CFG, tmp_path / "c"), log=lines.append,
                    reschedule=True)
    assert [r["lr"] for r in rebuilt.records] == [lr_at(replace(CFG, steps=18), s) for s in (15, 16, 17)]
    assert [r["lr"] for r in rebuilt.records] != [r["lr"] for r in whole.records[15:18]]
    assert ("learning-rate schedule rebuilt from this run's settings (--reschedule): peak 3.00e-03, warmup 4 steps, "
            "cosine to 3.00e-04 at step 18; the checkpoint's was peak 3.00e-03, warmup 4 steps, cosine to 3.00e-04 "
            "at step 20") in lines
    lines.clear()  # and the rebuilt schedule is the one the next resume keeps
    last = train(replace(cfg, steps=20), loader_for(corpus, CFG, tmp_path / "c"), log=lines.append)
    assert [r["lr"] for r in last.records] == [lr_at(replace(CFG, steps=18), s) for s in (18, 19)]
    assert any(line.startswith("learning-rate schedule from the checkpoint: peak 3.00e-03, warmup 4 steps, cosine "
                               "to 3.00e-04 at step 18; this run's steps 20 (the checkpoint's 18)") for line in lines)


WORKER = """
import hashlib, json, sys, torch
sys.path.insert(0, {tests!r})
from test_train import CFG, digest, loader_for
from marin_data.corpus.manifest import load_corpus
from marin_train.distributed import init_distributed, shutdown_distributed
from marin_train.loop import train
init_distributed()  # joins torchrun's group first: the loader takes its rank and world size from it
seen = []
class Recording:
    def __init__(self, loader): self.loader = loader
    def __iter__(self):
        for batch in self.loader:
            seen.extend(batch["index"].tolist())
            yield batch
    def state_dict(self): return self.loader.state_dict()
    def load_state_dict(self, s): self.loader.load_state_dict(s)
cfg = CFG.__class__(**{{**CFG.__dict__, "steps": 6}})
result = train(cfg, Recording(loader_for(load_corpus({corpus!r}), cfg, {cache!r})), log=print)
rank = torch.distributed.get_rank()
with open({out!r} + f"/rank{{rank}}.json", "w") as f:
    json.dump({{"seen": seen, "digest": digest(result.model), "loss": [r["loss"] for r in result.records]}}, f)
shutdown_distributed()  # the mesh's groups, destroyed while the interpreter is whole
"""


@pytest.mark.slow
def test_two_ranks_under_torchrun_read_disjoint_data_and_end_with_identical_weights(corpus, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(ROOT / "tests"), corpus=str(corpus.root), cache=str(tmp_path / "c"),
                                    out=str(tmp_path)))
    # PYTHONFAULTHANDLER: a rank that crashes (aborts at exit, say) prints every thread's Python stack.
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert run.returncode == 0, run.stderr[-8000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    a, b = (set(r["seen"]) for r in ranks)
    assert not a & b and len(a) == len(b) == 6 * CFG.batch_size
    assert sorted(a | b) == list(range(2 * 6 * CFG.batch_size))  # together: the first 6 global batches
    assert ranks[0]["digest"] == ranks[1]["digest"]
    assert ranks[0]["loss"] == ranks[1]["loss"]  # the logged loss is the global mean
    assert "step     6/6" in run.stdout and run.stdout.count("step     6/6") == 1  # rank 0 logs


def test_bf16_autocast_trains_on_cpu(corpus, tmp_path):
    result = train(replace(CFG, steps=2, precision="bf16"), loader_for(corpus, CFG, tmp_path / "c"), log=lambda _: None)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in result.records)
    assert all(p.dtype == torch.float32 for p in result.model.parameters())  # fp32 master weights (the shards)
    seen = {}  # the weights each module computes with (FSDP has gathered them when a pre-forward hook runs)
    moe = result.model.blocks[0].moe
    moe.router.register_forward_pre_hook(lambda m, _: seen.update(router=m.weight.dtype))
    moe.shared.register_forward_pre_hook(lambda m, _: seen.update(shared=m.w13.weight.dtype))
    result.model(torch.zeros(1, 8, dtype=torch.long))
    assert seen == {"router": torch.float32, "shared": torch.bfloat16}  # the router keeps its fp32 policy


def test_recompute_gives_the_same_run_and_counts_the_load_once(corpus, tmp_path):
    runs = [train(replace(CFG, steps=3, recompute=recompute), loader_for(corpus, CFG, tmp_path / "c"),
                  log=lambda _: None) for recompute in (False, True)]
    assert [r["loss"] for r in runs[1].records] == pytest.approx([r["loss"] for r in runs[0].records], rel=1e-6)
    assert [r["imbalance"] for r in runs[1].records] == [r["imbalance"] for r in runs[0].records]
    # Every weight and the balancing bias, which moved by the same load (not counted twice).
    torch.testing.assert_close(*(full_state_dict(r.model) for r in runs), atol=1e-6, rtol=0)


@pytest.mark.slow
def test_blocks_compiled_under_fsdp2_train_like_eager_blocks(corpus, tmp_path):
    """torch.compile per block (TrainConfig.compile) composes with FSDP2's per-block units and the custom ops:
    the same losses as eager blocks, to compiler rounding."""
    cfg = replace(CFG, steps=3, precision="bf16")
    runs = [train(replace(cfg, compile=compiled), loader_for(corpus, CFG, tmp_path / "c"), log=lambda _: None)
            for compiled in (False, True)]
    assert all(getattr(block, "_compiled_call_impl", None) is not None for block in runs[1].model.blocks)
    assert [r["loss"] for r in runs[1].records] == pytest.approx([r["loss"] for r in runs[0].records], rel=2e-2)
