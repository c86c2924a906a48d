"""The sharded training loop on real gloo processes: FSDP2 x expert parallelism at world 1, 2 and 4 give the
same run; a checkpoint written at world 4 resumes at world 2 and 1; a kill -9 mid-save loses nothing saved.

One module fixture runs every layout once (each a `torch.multiprocessing` spawn of gloo ranks) and the tests
compare what they recorded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import VOCAB, build_corpus, built_once
from ranks import spawn_ranks

from marin_train.config import TrainConfig

pytestmark = pytest.mark.slow

GLOBAL_BATCH = 4
CFG = TrainConfig(steps=6, batch_size=GLOBAL_BATCH, seq_len=32, warmup=2, log_every=1000, grad_clip=0.5,
                  model_overrides={"vocab_size": VOCAB, "n_layers": 2, "moe_bias_update": "sign"})


def _worker(rank: int, world: int, out: str, corpus: str, cfg: TrainConfig, kill_at_save: int,
            until: int | None) -> None:
    """One rank: train ``cfg`` on the corpus (to step ``until``, when given), record losses, gradient norms,
    rows served, shard sizes and the whole final state (rank 0) under ``out``. ``kill_at_save``: SIGKILL this
    process after the shards of that save are written, before the checkpoint is committed."""
    import marin_train.checkpoint as checkpoint
    from marin_data.corpus.manifest import load_corpus
    from marin_data.loader import LoaderConfig, make_loader
    from marin_train.checkpoint import resume_config
    from marin_train.distributed import shutdown_distributed
    from marin_train.loop import train
    from marin_train.parallel import full_state_dict

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/init", rank=rank, world_size=world)
    cfg = replace(cfg, batch_size=cfg.batch_size // world)  # cfg.batch_size is the global batch here
    cfg = resume_config(cfg, world)
    if kill_at_save:
        saves, save = [], checkpoint.dcp.save

        def save_then_die(*args, **kwargs):
            save(*args, **kwargs)
            saves.append(1)
            if len(saves) == kill_at_save:
                os.kill(os.getpid(), signal.SIGKILL)
        checkpoint.dcp.save = save_then_die
    config = LoaderConfig(seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed, segments=True)
    loader = make_loader(load_corpus(corpus), config, cache_dir=f"{out}/cache{rank}")
    seen = []

    class Recording:
        def __iter__(self):
            for batch in loader:
                seen.append(batch["index"].tolist())
                yield batch

        def state_dict(self):
            return loader.state_dict()

        def load_state_dict(self, state):
            loader.load_state_dict(state)

    result = train(cfg, Recording(), log=lambda _: None, until=until)
    model = result.model
    local = {name: p.to_local().numel() for name, p in model.named_parameters()}
    experts = model.blocks[0].moe.experts.w13_EL2F
    whole = full_state_dict(model)
    batch = {"tokens": torch.arange(2 * 16).view(2, 16) % VOCAB}
    logits = model.eval()(batch["tokens"]).logits.detach()
    record = {"loss": [r["loss"] for r in result.records], "grad_norm": [r["grad_norm"] for r in result.records],
              "steps": [r["step"] for r in result.records], "seen": seen, "local": local,
              "experts_local_shape": list(experts.to_local().shape),
              "experts_placements": [str(p) for p in experts.placements], "checkpoint": result.checkpoint}
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(record, f)
    if rank == 0:
        torch.save({"state": whole, "logits": logits, "tokens": batch["tokens"]}, f"{out}/final.pt")
    shutdown_distributed()


def run(out: Path, corpus: Path, world: int, cfg: TrainConfig, kill_at_save: int = 0,
        until: int | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    spawn_ranks(_worker, (world, str(out), str(corpus), cfg, kill_at_save, until), world)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    return {"ranks": ranks, **torch.load(out / "final.pt"), **ranks[0]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every layout's run, once per test session: under pytest-xdist the workers share one directory, and the
    first to take the lock runs them while the others wait for its results."""
    root = built_once(tmp_path_factory, "fsdp_runs", lambda root: torch.save(_run_layouts(root), root / "runs.pt"))
    return torch.load(root / "runs.pt", weights_only=False)


def _run_layouts(root: Path) -> dict:
    build_corpus(root / "corpus", {"a": [200, 200], "b": [300]}, seed=5)
    corpus = root / "corpus"
    out = {"corpus": corpus, "root": root}
    out["w1"] = run(root / "w1", corpus, 1, CFG)
    out["w2ep2"] = run(root / "w2ep2", corpus, 2, replace(CFG, ep=2))
    out["w4ep2"] = run(root / "w4ep2", corpus, 4, replace(CFG, ep=2))
    saved = replace(CFG, ep=2, checkpoint_dir=str(root / "ckpt"))
    out["w4ep2_until3"] = run(root / "w4ep2_until3", corpus, 4, saved, until=3)  # the 6-step schedule's first 3
    for name, world in (("w2ep1", 2), ("w1ep1", 1)):
        shutil.copytree(root / "ckpt", root / f"ckpt_{name}")
        out[f"resume_{name}"] = run(root / name, corpus, world, replace(CFG, checkpoint_dir=str(root / f"ckpt_{name}")))
    six = replace(CFG, batch_size=6)  # a global batch that 3 ranks divide
    out["w1_b6"] = run(root / "w1_b6", corpus, 1, six)
    uneven = replace(six, checkpoint_dir=str(root / "ckpt_w3"))
    out["w3_until3"] = run(root / "w3_until3", corpus, 3, uneven, until=3)
    out["resume_w3_w2ep2"] = run(root / "w3_w2ep2", corpus, 2, replace(uneven, ep=2))
    return out


def close(a: list[float], b: list[float], rel: float = 1e-4) -> bool:
    return all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b, strict=True))


def assert_states_close(a: dict, b: dict, cfg: TrainConfig) -> None:
    """Parameters within a few learning rates: summation order differs between layouts, and over 6 Adam steps a
    rounding difference moves a weight by at most its step size."""
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=cfg.lr * 0.05, rtol=0, msg=name)


@pytest.mark.parametrize("layout", ["w2ep2", "w4ep2"])
def test_layouts_give_the_same_losses_gradient_norms_and_weights(runs, layout):
    one, other = runs["w1"], runs[layout]
    assert close(other["loss"], one["loss"]), (other["loss"], one["loss"])
    assert min(one["grad_norm"]) > CFG.grad_clip  # clipping is active, so a wrong norm would change the run
    assert close(other["grad_norm"], one["grad_norm"]), (other["grad_norm"], one["grad_norm"])
    assert_states_close(other["state"], one["state"], CFG)
    assert all(r["loss"] == other["loss"] for r in other["ranks"])  # the logged loss is the global mean


def test_each_rank_holds_its_share_and_only_its_experts(runs):
    ranks, E = runs["w4ep2"]["ranks"], 8
    total = sum(runs["w1"]["local"].values())
    for r in ranks:
        assert abs(sum(r["local"].values()) - total / 4) < 0.02 * total  # ~1/world of every parameter
        assert r["experts_placements"] == ["S(1)", "S(0)"]  # Shard(1) over dp, Shard(0) over ep
        assert r["experts_local_shape"][0] == E // 2  # this EP rank's experts only
        assert r["experts_local_shape"][1] == 32 // 2  # each split over the 2 ranks sharing them


@pytest.mark.parametrize("name", ["w2ep1", "w1ep1"])
def test_a_world_4_checkpoint_resumes_at_world_2_and_1(runs, name):
    whole, first, resumed = runs["w4ep2"], runs["w4ep2_until3"], runs[f"resume_{name}"]
    assert first["steps"] == [1, 2, 3] and resumed["steps"] == [4, 5, 6]
    assert close(first["loss"] + resumed["loss"], whole["loss"])
    assert close(resumed["grad_norm"], whole["grad_norm"][3:])
    assert_states_close(resumed["state"], whole["state"], CFG)
    served = sorted(i for r in resumed["ranks"] for batch in r["seen"] for i in batch)
    want = sorted(i for r in whole["ranks"] for batch in r["seen"][3:] for i in batch)
    assert served == want == list(range(3 * GLOBAL_BATCH, 6 * GLOBAL_BATCH))


def test_an_unevenly_sharded_checkpoint_resumes_in_another_layout(runs):
    """World 3 splits the 8 experts 3/3/2 and the norms' 64 weights 22/22/20 (as 11-way data parallelism
    splits the 535B model's); its checkpoint resumes at world 2 x EP 2 as a world-1 run continues."""
    whole, first, resumed = runs["w1_b6"], runs["w3_until3"], runs["resume_w3_w2ep2"]
    assert sorted(r["experts_local_shape"][0] for r in first["ranks"]) == [2, 3, 3]
    assert sorted(r["local"]["blocks.0.attn_norm.weight"] for r in first["ranks"]) == [20, 22, 22]
    assert first["steps"] == [1, 2, 3] and resumed["steps"] == [4, 5, 6]
    assert close(first["loss"] + resumed["loss"], whole["loss"])
    assert close(resumed["grad_norm"], whole["grad_norm"][3:])
    assert_states_close(resumed["state"], whole["state"], CFG)


def test_a_kill_during_a_save_resumes_from_the_previous_checkpoint(runs, tmp_path):
    root, corpus = tmp_path, runs["corpus"]
    cfg = replace(CFG, checkpoint_dir=str(root / "killed"), checkpoint_every=2)
    with pytest.raises(mp.ProcessExitedException, match="SIGKILL"):
        run(root / "kill", corpus, 1, cfg, kill_at_save=2)  # dies writing step 4
    assert (root / "killed" / "latest").read_text() == "step-00000002"
    assert (root / "killed" / ".step-00000004.part").is_dir()  # the half-written one, not committed
    resumed = run(root / "after_kill", corpus, 1, cfg)
    assert resumed["steps"] == [3, 4, 5, 6]
    assert close(resumed["loss"], runs["w1"]["loss"][2:])
    assert_states_close(resumed["state"], runs["w1"]["state"], CFG)
    assert sorted(p.name for p in (root / "killed").glob("step-*")) == ["step-00000004", "step-00000006"]


def test_an_exported_checkpoint_loads_on_one_process_with_the_same_logits(runs, tmp_path):
    from marin_train.export import export_checkpoint, load_exported

    trained = runs["w4ep2_until3"]  # trained and evaluated at world 4, EP 2
    to = export_checkpoint(trained["checkpoint"], tmp_path / "model")
    assert sorted(p.name for p in to.iterdir()) == ["config.json", "model.safetensors", "training.json"]
    model = load_exported(to)
    torch.testing.assert_close(model(trained["tokens"]).logits, trained["logits"], atol=1e-5, rtol=1e-5)
