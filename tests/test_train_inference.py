"""A saved model at work. ``marin-train eval`` and ``--eval-every``: held-out loss and bits per byte, checked by
hand, the same on 1 and 2 ranks, and the same numbers during training as afterwards. ``marin-train generate``:
text from a checkpoint, a run or an export, with the tokenizer the run recorded."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import build_corpus, build_text_corpus

from marin_data.layout import TOKENIZER
from marin_data.raw.tokenizer import load_tokenizer, token_byte_lengths
from marin_model.model import Transformer
from marin_train.cli import main
from marin_train.config import DataConfig, TrainConfig
from marin_train.data import eval_config, eval_stream
from marin_train.run import run_training
from marin_train.export import export_checkpoint, load_exported
from marin_train.inference import evaluate_saved

ROOT = Path(__file__).resolve().parent.parent
SEQ = 32


def raw_bytes(tokenizer, ids: list[int]) -> bytes:
    """The bytes a byte-level BPE's tokens spell, by GPT-2's table (printable bytes stand for themselves, the
    other 68 for U+0100 on, in order): the slow, obvious reference for the byte counts."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {chr(b): b for b in printable} | {chr(256 + n): b for n, b in
                                              enumerate(b for b in range(256) if b not in printable)}
    special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    return bytes(table[c] for i in ids if i not in special for c in tokenizer.id_to_token(i))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A text corpus and a 4-step run on it, evaluated at steps 2 and 4 (5% held out, so ~90 sequences)."""
    tmp = tmp_path_factory.mktemp("eval")
    corpus, docs = build_text_corpus(tmp / "corpus", {"code": 300, "prose/a": 300})
    cfg = TrainConfig(steps=4, batch_size=4, seq_len=SEQ, log_every=100, eval_every=2, eval_batch=8,
                      checkpoint_dir=str(tmp / "run"), data=DataConfig(source=str(corpus.root), val_fraction=0.05))
    run_training(cfg, resume=False, threads=1, log=lambda _: None)  # the count the bit-equal checks below use
    return {"corpus": corpus, "docs": docs, "run": tmp / "run", "tmp": tmp}


@contextmanager
def torch_threads(n: int):
    """Run the block at ``n`` intra-op threads: the bits of a forward follow the count (marin_train.threads),
    and another test of this worker may have left it elsewhere."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_token_bytes_sum_to_each_documents_utf8_length(trained):
    tokenizer = load_tokenizer(str(trained["corpus"].root / TOKENIZER))
    table = token_byte_lengths(tokenizer)
    assert table[tokenizer.info.eos_id] == 0
    texts = [t for texts in trained["docs"].values() for t in texts]
    assert any(len(t.encode()) > len(t) for t in texts)  # multi-byte characters are there
    for text in texts:
        ids = tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
        assert table[ids].sum() == len(text.encode())


def test_eval_equals_a_plain_forward_over_each_sequence_by_hand(trained):
    model_dir = export_checkpoint(trained["run"] / "step-00000004", trained["tmp"] / "model")
    result = evaluate_saved(str(model_dir), str(trained["corpus"].root), batch_size=8)
    model = load_exported(model_dir)
    tokenizer = load_tokenizer(str(trained["corpus"].root / TOKENIZER)).tokenizer
    stream = eval_stream(str(trained["corpus"].root), eval_config(SEQ, 0.05))
    n = stream.stop("validation")
    want: dict[str, list[float]] = {}  # subset -> [sequences, tokens, bytes, nats]
    for p in range(n):  # one sequence at a time, in float64 from the logits on
        row = stream.read(range(p, p + 1), "validation")
        ids, labels = torch.from_numpy(row.input_ids), torch.from_numpy(row.labels)
        with torch.no_grad():
            logits = model(ids, segment_ids_BS=torch.from_numpy(row.segment_ids),
                           positions_BS=torch.from_numpy(row.positions)).logits
        nats = -logits.double().log_softmax(-1).gather(-1, labels[..., None]).sum().item()
        spelled = raw_bytes(tokenizer, labels[0].tolist())
        # What the tokenizer's own decode makes of them (a window may cut a character: U+FFFD there).
        assert spelled.decode(errors="replace") == tokenizer.decode(labels[0].tolist(), skip_special_tokens=True)
        acc = want.setdefault(stream.subsets[row.subset[0]], [0, 0, 0, 0.0])
        for k, v in enumerate((1, SEQ, len(spelled), nats)):
            acc[k] += v
    assert set(result.subsets) == set(want) == {"code", "prose/a"} and result.overall.sequences == n > 30
    for name, (sequences, tokens, nbytes, nats) in want.items():
        got = result.subsets[name]
        assert (got.sequences, got.tokens, got.bytes) == (sequences, tokens, nbytes)
        assert got.loss == pytest.approx(nats / tokens, rel=1e-6)
        assert got.bits_per_byte == pytest.approx(nats / math.log(2) / nbytes, rel=1e-6)
    all_nats = sum(v[3] for v in want.values())
    assert result.overall.loss == pytest.approx(all_nats / (n * SEQ), rel=1e-6)
    assert result.overall.bytes == sum(v[2] for v in want.values())


def test_eval_every_records_what_eval_reports_afterwards(trained):
    records = [json.loads(line) for line in (trained["run"] / "metrics.jsonl").read_text().splitlines()]
    assert ["eval/loss" in r for r in records] == [False, True, False, True]
    last = records[-1]
    with torch_threads(1):  # as the run evaluated
        result = evaluate_saved(str(trained["run"]), str(trained["corpus"].root), batch_size=8)  # its latest
    assert result.meta["step"] == 4
    # The sharded training model and the whole loaded one compute the same bits (fp32, no expert parallelism).
    assert {k: v for k, v in result.metrics().items() if k != "eval/seconds"} == \
        {k: v for k, v in last.items() if k.startswith("eval/") and k != "eval/seconds"}
    assert set(last) >= {"eval/code/loss", "eval/prose/a/bpb", "eval/tokens"}


def test_max_tokens_evaluates_the_splits_first_sequences(trained):
    part = evaluate_saved(str(trained["run"]), str(trained["corpus"].root), max_tokens=10 * SEQ + 5)
    assert part.overall.sequences == 10 and part.overall.tokens == 10 * SEQ
    one = evaluate_saved(str(trained["run"]), str(trained["corpus"].root), subsets=["code"])
    assert list(one.subsets) == ["code"]


def test_eval_command_prints_a_table_and_json_and_maps_its_errors(trained, tmp_path, capsys):
    run, data = str(trained["run"]), str(trained["corpus"].root)
    with pytest.raises(SystemExit) as exit_:
        main(["eval", run, "--data", data])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "bits/byte" in out and "prose/a" in out and "\nall " in out
    with pytest.raises(SystemExit) as exit_:
        main(["eval", run, "--data", data, "--json", "--subset", "code", "--cache-dir", str(tmp_path / "decoded")])
    doc = json.loads(capsys.readouterr().out)
    assert exit_.value.code == 0 and list(doc["subsets"]) == ["code"] and doc["step"] == 4
    assert list((tmp_path / "decoded").rglob("tokens.npy"))  # a local corpus's decoded shards went there
    other = build_corpus(tmp_path / "other", {"code": [200]})  # another tokenizer
    cases = [(["eval", str(tmp_path), "--data", data], 24, "not a checkpoint"),
             (["eval", run, "--data", str(other.root)], 4, "tokenizer"),
             (["eval", run, "--data", data, "--max-tokens", "10"], 2, "less than one sequence")]
    for args, code, words in cases:
        with pytest.raises(SystemExit) as exit_:
            main(args)
        assert exit_.value.code == code and words in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("threads", [None, 2])
def test_eval_on_two_ranks_equals_one_rank_to_the_bit(trained, threads):
    """Real gloo processes, with the product's own thread policy (one per process under torchrun, whatever the
    process count; torchrun sets OMP_NUM_THREADS only for several) or an explicit --threads: the CPU kernels'
    sums follow the thread count, so both runs must use the same, whatever the CPU's SIMD width."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    results = []
    for ranks in (1, 2):
        run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                              str(ranks), "-m", "marin_train", "eval", str(trained["run"]), "--data",
                              str(trained["corpus"].root), "--batch-size", "4", "--json",
                              *(["--threads", str(threads)] if threads else [])],
                             capture_output=True, text=True, timeout=600, cwd=ROOT,
                             env={**env, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"})
        assert run.returncode == 0, run.stderr[-8000:]  # a crashed rank's threads, from the fault handler
        assert f"torch intra-op threads: {threads or 1} " in run.stderr
        results.append(json.loads(run.stdout))
    assert results[0] == results[1] and results[0]["threads"] == (threads or 1)
    assert np.isfinite(results[0]["overall"]["loss"]) and results[0]["overall"]["sequences"] > 30


def generate_cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(["generate", *args])
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def test_generate_continues_each_prompt_reproducibly_from_a_run_or_an_export(trained, capsys):
    run = str(trained["run"])
    code, out, _ = generate_cli(capsys, run, "--prompt", "café", "--prompt", "alpha beta", "--seed", "3")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2 and lines[0].startswith("café") and lines[1].startswith("alpha beta")
    assert generate_cli(capsys, run, "--prompt", "café", "--prompt", "alpha beta", "--seed", "3")[1] == out
    model_dir = export_checkpoint(trained["run"] / "step-00000004", trained["tmp"] / "model-gen")  # the same step
    assert (model_dir / TOKENIZER).is_file()
    code, exported, _ = generate_cli(capsys, str(model_dir), "--prompt", "café", "--prompt", "alpha beta", "--seed",
                                     "3")
    assert code == 0 and exported == out
    greedy = [json.loads(generate_cli(capsys, run, "--prompt", "gamma", "--temperature", "0", "--json", *extra)[1])
              for extra in ((), ("--no-cache",))]
    for sample in greedy:
        sample[0].pop("seconds")
    assert greedy[0] == greedy[1] and 0 < greedy[0][0]["tokens"] <= 64


def test_generate_needs_the_models_tokenizer(trained, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(export_checkpoint(trained["run"] / "step-00000004", tmp_path / "model"), bare)
    (bare / TOKENIZER).unlink()
    code, _, err = generate_cli(capsys, str(bare), "--prompt", "café")
    assert code == 2 and "records no tokenizer" in err and "--tokenizer" in err
    code, out, _ = generate_cli(capsys, str(bare), "--prompt", "café", "--data", str(trained["corpus"].root))
    assert code == 0 and out.startswith("café")
    other = build_corpus(tmp_path / "other", {"code": [200]})
    assert generate_cli(capsys, str(trained["run"]), "--prompt", "x", "--data", str(other.root))[0] == 4
    assert generate_cli(capsys, str(trained["run"]), "--prompt", "")[0] == 2


def test_a_prompt_longer_than_the_context_keeps_its_last_tokens_and_the_model_never_sees_more(trained, capsys):
    """Attention over a prompt costs memory with the square of its length: a 120 KB prompt asked 20 GB of a model
    with 128 positions. The longest input the model is called with is the bound."""
    seen = []

    def record(module, args):
        if isinstance(module, Transformer):
            seen.append(args[0].shape[1])

    hook = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        code, out, err = generate_cli(capsys, str(trained["run"]), "--prompt", "alpha beta gamma " * 200,
                                      "--prompt", "short", "--max-new-tokens", "16", "--temperature", "0", "--json")
    finally:
        hook.remove()
    context = json.loads((trained["run"] / "step-00000004" / "config.json").read_text())["model"]["max_seq_len"]
    assert max(seen) == context - 16  # the prompt's last tokens, as many as leave room for the new ones
    samples = json.loads(out)
    assert code == 0 and samples[0]["dropped"] > 0 and samples[1]["dropped"] == 0
    assert "prompt 1 lost its first" in err and "prompt 2" not in err
    code, _, err = generate_cli(capsys, str(trained["run"]), "--prompt", "x", "--max-new-tokens", str(context))
    assert code == 2 and "--max-new-tokens" in err and "Traceback" not in err

