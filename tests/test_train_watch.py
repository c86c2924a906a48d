"""Watching a run: the metrics record (documented, MoE health per layer), TensorBoard and W&B (the real
libraries, W&B offline) read back across a resume, a missing extra named with its pip command, the plot."""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from test_train import CFG, corpus, loader_for  # noqa: F401 - corpus is a fixture

from marin_model.model import Transformer
from marin_train.cli import main
from marin_train.config import DataConfig
from marin_train.loop import train
from marin_train.metrics import FIELDS, MOE_FIELDS, moe_health
from marin_train.plot import plot_run

ROOT = Path(__file__).resolve().parent.parent


def read_wandb_history(run_file: Path) -> list[dict]:
    """The history rows of a W&B transaction log (``run-ID.wandb``), read without W&B's reader: a 7-byte
    header, then 32 KiB blocks of records (crc32c, length, type: full/first/middle/last), each a
    ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    rows, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        if room < 7:  # a block's tail too short for a record header is padding
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += room
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_moe_health_names_each_layer_s_fields():
    load = np.array([[4.0, 0.0, 2.0, 2.0], [1.0, 1.0, 1.0, 1.0]])
    got = moe_health(load, np.array([0.5, 0.25]), np.array([0.1, 0.0]), np.array([0.02, 0.0]))
    assert got == {"moe/layer00/max_over_mean": 2.0, "moe/layer00/idle_experts": 1.0,
                   "moe/layer00/bias_spread": pytest.approx(0.02), "moe/layer00/z_loss": 0.5,
                   "moe/layer00/dropped": pytest.approx(0.1), "moe/layer01/max_over_mean": 1.0,
                   "moe/layer01/idle_experts": 0.0, "moe/layer01/bias_spread": 0.0, "moe/layer01/z_loss": 0.25,
                   "moe/layer01/dropped": 0.0}


def test_a_step_s_moe_health_is_what_its_forward_routed_and_every_field_is_documented(corpus, tmp_path):  # noqa: F811
    cfg = replace(CFG, steps=2, model_overrides={**CFG.model_overrides, "moe_capacity_factor": 0.6})
    records = train(cfg, loader_for(corpus, cfg, tmp_path / "c"), log=lambda _: None).records
    # The first step by hand: the same initial weights (seeded), the same first batch, one plain forward.
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.model_config()).train()
    batch = next(iter(loader_for(corpus, cfg, tmp_path / "c")))
    with torch.no_grad():
        out = model(batch["input_ids"], batch["labels"], segment_ids_BS=batch["segment_ids"],
                    positions_BS=batch["positions"])
    first, layers = records[0], cfg.model_config().n_layers
    for i, stats in enumerate(out.router):
        counts = stats.counts_E.double()
        assert first[f"moe/layer{i:02d}/max_over_mean"] == pytest.approx(float(counts.max() / counts.mean()))
        assert first[f"moe/layer{i:02d}/idle_experts"] == int((counts == 0).sum())
        assert first[f"moe/layer{i:02d}/z_loss"] == pytest.approx(float(stats.z_loss), rel=1e-5)
        assert first[f"moe/layer{i:02d}/dropped"] == pytest.approx(float(stats.dropped), rel=1e-6)
        assert first[f"moe/layer{i:02d}/dropped"] > 0  # capacity factor 0.6 must drop
        assert first[f"moe/layer{i:02d}/bias_spread"] == 0.0  # step 1 routes with the initial, zero bias
        assert records[1][f"moe/layer{i:02d}/bias_spread"] > 0  # step 2 with the bias step 1 moved
    assert first["dropped"] == pytest.approx(np.mean([first[f"moe/layer{i:02d}/dropped"] for i in range(layers)]))
    assert first["imbalance"] == pytest.approx(
        np.mean([first[f"moe/layer{i:02d}/max_over_mean"] for i in range(layers)]))
    documented = set(FIELDS) | {f"moe/layer{i:02d}/{name}" for i in range(layers) for name in MOE_FIELDS}
    assert set(first) <= documented and set(records[1]) <= documented
    design = (ROOT / "docs" / "design.md").read_text()
    assert all(f"`{name}`" in design for name in [*FIELDS, *MOE_FIELDS])  # the docs table lists every field


def test_tensorboard_and_wandb_get_every_step_across_a_resume(corpus, tmp_path, monkeypatch):  # noqa: F811
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-root"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = replace(CFG, steps=3, checkpoint_dir=str(tmp_path / "run"), tensorboard_dir=str(tmp_path / "tb"),
                  wandb_project="marin-test", data=DataConfig(store_options={"token": "hf_s3cr3t"}))
    records = []
    for until in (2, None):  # a run to step 2, then its resume to step 3
        records += train(cfg, loader_for(corpus, cfg, tmp_path / "c"), log=lambda _: None, until=until).records
    assert [r["step"] for r in records] == [1, 2, 3]

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2  # one file per run
    for key in ("loss", "lr", "tokens_per_s", "moe/layer01/idle_experts"):
        assert [e.step for e in events.Scalars(key)] == [1, 2, 3]
        assert [e.value for e in events.Scalars(key)] == pytest.approx([r[key] for r in records], rel=1e-6)

    import wandb

    # `finish` ends a run, but W&B's service process may still be writing its file: a run's last history row
    # was once missing when read at once on a loaded machine. `teardown` waits until everything is written.
    wandb.teardown()
    run_id = (tmp_path / "run" / "wandb-run-id").read_text()
    runs = sorted((tmp_path / "wandb-root" / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 2  # the resumed run continued the same W&B run (`wandb sync` merges them)
    history = [row for d in runs for row in read_wandb_history(d / f"run-{run_id}.wandb")]
    assert [row["_step"] for row in history] == [1, 2, 3]
    for key in ("loss", "grad_norm", "moe/layer00/max_over_mean"):
        assert [row[key] for row in history] == pytest.approx([r[key] for r in records], rel=1e-12)
    logged = b"".join(p.read_bytes() for d in runs for p in d.rglob("*") if p.is_file())
    assert b"store_options" in logged and b"hf_s3cr3t" not in logged  # the config, without the credential


@pytest.mark.parametrize("flag, module", [("--tensorboard", "tensorboard"), ("--wandb", "wandb")])
def test_a_missing_extra_is_named_with_its_pip_command(corpus, tmp_path, monkeypatch, capsys, flag,
                                                      module):  # noqa: F811
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: import and find_spec fail
    with pytest.raises(SystemExit) as exit_:
        main(["--data", str(corpus.root), "--steps", "1", "--batch-size", "2", "--seq-len", "32", flag,
              str(tmp_path / "x")])
    assert exit_.value.code == 13
    assert f"{flag} needs {module}, which is not installed: pip install 'marin[{module}]'" in capsys.readouterr().err


def fake_run(path: Path) -> list[dict]:
    """A metrics.jsonl with known values: 10 steps of 512 tokens, two MoE layers, held-out loss every 5."""
    records = []
    for step in range(1, 11):
        r = {"step": step, "loss": 9.0 - 0.3 * step, "lr": 1e-3 * step / 10, "tokens": 512,
             "tokens_seen": 512 * step, "tokens_per_s": 1000.0 + step, "imbalance": 1.5 - 0.01 * step,
             "moe/layer00/max_over_mean": 1.4, "moe/layer01/max_over_mean": 1.6 - 0.02 * step}
        if step % 5 == 0:
            r.update({"eval/loss": 8.5 - 0.2 * step, "eval/code/loss": 8.0 - 0.2 * step})
        records.append(r)
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_plot_draws_the_run_s_own_numbers_into_a_png(tmp_path, capsys):
    import matplotlib.image

    records = fake_run(tmp_path / "run")
    fig = plot_run(tmp_path / "run")
    png = matplotlib.image.imread(tmp_path / "run" / "metrics.png")
    assert png.shape[:2] == (1000, 900)  # 9 x 10 inches at 100 dpi: it decodes
    loss, lr, speed, load = fig.axes[:4]
    lines = {line.get_label(): line for line in loss.lines}
    steps = [r["step"] for r in records]
    np.testing.assert_array_equal(lines["train loss"].get_xdata(), steps)
    np.testing.assert_array_equal(lines["train loss"].get_ydata(), [r["loss"] for r in records])
    np.testing.assert_array_equal(lines["eval/loss"].get_xdata(), [5, 10])
    np.testing.assert_array_equal(lines["eval/loss"].get_ydata(), [7.5, 6.5])
    np.testing.assert_array_equal(lines["eval/code/loss"].get_ydata(), [7.0, 6.0])
    np.testing.assert_array_equal(lr.lines[0].get_ydata(), [r["lr"] for r in records])
    np.testing.assert_array_equal(speed.lines[0].get_ydata(), [r["tokens_per_s"] for r in records])
    by_layer = {line.get_label(): line.get_ydata() for line in load.lines}
    np.testing.assert_array_equal(by_layer["layer01"], [r["moe/layer01/max_over_mean"] for r in records])
    np.testing.assert_array_equal(by_layer["mean over layers"], [r["imbalance"] for r in records])
    top = loss.child_axes[0]  # tokens, mapped from the steps
    assert top.get_xlabel() == "tokens"
    assert top.get_xlim() == pytest.approx(tuple(512 * np.array(loss.get_xlim())))
    with pytest.raises(SystemExit) as exit_:
        main(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "other.png")])
    assert exit_.value.code == 0 and f"wrote {tmp_path / 'other.png'}" in capsys.readouterr().out
    assert (tmp_path / "other.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_refuses_a_run_without_metrics_and_a_malformed_line_by_name(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main(["plot", str(tmp_path / "empty")])
    assert exit_.value.code == 2 and "metrics.jsonl" in capsys.readouterr().err
    fake_run(tmp_path / "bad")
    with open(tmp_path / "bad" / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "loss": \n')
    with pytest.raises(SystemExit) as exit_:
        main(["plot", str(tmp_path / "bad")])
    assert exit_.value.code == 2 and "metrics.jsonl:11: not a JSON line" in capsys.readouterr().err
