"""Loading tokenizers (a path, a directory, a Hugging Face repo id through huggingface_hub) and framing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from shard_env import make_texts, run_cli, tiny_tokenizer, write_jsonl  # noqa: F401 - tiny_tokenizer is a fixture

from marin_data.errors import InvalidTokenizerError
from marin_data.layout import TOKENIZER
from marin_data.raw.tokenizer import load_tokenizer, tokenizer_from_bytes


def test_a_path_or_its_directory_loads_with_eos_found_among_special_tokens(tiny_tokenizer: Path):
    by_file = load_tokenizer(str(tiny_tokenizer))
    by_dir = load_tokenizer(str(tiny_tokenizer.parent))
    assert by_file.info == by_dir.info
    assert by_file.info.name == "tiny-bpe"  # named after its directory
    assert by_file.info.sha256 == hashlib.sha256(tiny_tokenizer.read_bytes()).hexdigest()
    assert (by_file.info.eos_id, by_file.info.bos_id, by_file.info.add_bos) == (0, None, False)
    assert by_file.info.vocab_size == by_file.tokenizer.get_vocab_size(with_added_tokens=True)
    assert load_tokenizer(str(tiny_tokenizer), add_bos=True).info.bos_id == 1


def test_framing_appends_eos_prepends_bos_and_drops_empty_documents(tiny_tokenizer: Path):
    texts = ["hello world", "", "bazo kiru.\n"]
    for add_bos in (False, True):
        tok = load_tokenizer(str(tiny_tokenizer), add_bos=add_bos)
        tokens, lengths = tok.encode_documents(texts)
        assert lengths[1] == 0 and len(tokens) == lengths.sum()
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for i in (0, 2):
            doc = tokens[offsets[i] : offsets[i + 1]].tolist()
            assert doc[-1] == 0
            body = doc[1:-1] if add_bos else doc[:-1]
            assert (doc[0] == 1) == add_bos
            assert tok.tokenizer.decode(body) == texts[i]


def test_no_recognisable_eos_is_a_clear_error_unless_named(tmp_path: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(make_texts(50, 1), trainers.BpeTrainer(vocab_size=300, special_tokens=["<sep>"],
                                                                   show_progress=False))
    path = tmp_path / TOKENIZER
    tok.save(str(path))
    with pytest.raises(InvalidTokenizerError, match=r"which token is EOS \(special tokens: <sep>\).*--eos-token"):
        load_tokenizer(str(path))
    assert load_tokenizer(str(path), eos_token="<sep>").info.eos_id == tok.token_to_id("<sep>")
    with pytest.raises(InvalidTokenizerError, match="not in the vocabulary"):
        load_tokenizer(str(path), eos_token="<nope>")


def test_unreadable_or_missing_tokenizers_are_invalid(tmp_path: Path, tiny_tokenizer: Path):
    (tmp_path / "garbage.json").write_text("{}")
    for spec in (str(tmp_path / "garbage.json"), str(tmp_path / "missing.json"), "./not/a/repo id"):
        with pytest.raises(InvalidTokenizerError):
            load_tokenizer(spec)
    info = load_tokenizer(str(tiny_tokenizer)).info
    with pytest.raises(InvalidTokenizerError, match="sha256"):
        tokenizer_from_bytes(tiny_tokenizer.read_bytes() + b" ", info)


def _hf_cache(root: Path, repo_id: str, tokenizer: Path) -> Path:
    """A Hugging Face cache as ``hf_hub_download`` leaves it: blob, snapshot link and ``refs/main``."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / f"models--{repo_id.replace('/', '--')}"
    data = tokenizer.read_bytes()
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    snapshot = repo / "snapshots" / commit / TOKENIZER
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(Path("..", "..", "blobs", blob.name))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return root


def test_a_repo_id_is_resolved_through_huggingface_hub(tmp_path: Path, tiny_tokenizer: Path):
    """The real client, offline, reading a populated cache: the corpus records the repo id and the digest."""
    cache = _hf_cache(tmp_path / "hf", "marin-test/tiny-bpe", tiny_tokenizer)
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in make_texts(20, 3)])
    done = run_cli("shard", inputs, "--subset", "s", "--tokenizer", "marin-test/tiny-bpe", "--out", tmp_path / "c",
                   "--workers", "1", env=env)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_bytes())
    assert manifest["tokenizer"]["name"] == "marin-test/tiny-bpe"
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(tiny_tokenizer.read_bytes()).hexdigest()
    assert (tmp_path / "c" / TOKENIZER).read_bytes() == tiny_tokenizer.read_bytes()

    missing = run_cli("shard", inputs, "--subset", "s", "--tokenizer", "marin-test/absent", "--out", tmp_path / "d",
                      env=env)
    assert missing.returncode == 8, missing.stderr  # RemoteError: not cached and the Hub is off
    assert "marin-test/absent" in missing.stderr and "HF_HUB_OFFLINE" in missing.stderr


def test_a_file_in_the_hub_cache_is_named_by_its_repo_and_a_name_can_be_given(tmp_path: Path, tiny_tokenizer: Path):
    """A snapshot path is named by the repo id, not by its revision's folder; --tokenizer-name overrides."""
    cache = _hf_cache(tmp_path / "hf", "marin-test/tiny-bpe", tiny_tokenizer)
    (snapshot,) = cache.glob(f"models--marin-test--tiny-bpe/snapshots/*/{TOKENIZER}")
    assert load_tokenizer(str(snapshot)).info.name == "marin-test/tiny-bpe"
    assert load_tokenizer(str(snapshot.parent)).info.name == "marin-test/tiny-bpe"
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in make_texts(5, 4)])
    done = run_cli("shard", inputs, "--subset", "s", "--tokenizer", snapshot, "--tokenizer-name", "Tiny BPE v1",
                   "--out", tmp_path / "c", "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "c" / "manifest.json").read_bytes())["tokenizer"]["name"] == "Tiny BPE v1"


def tokenizer_cli(capsys, *args) -> tuple[int, str, str]:
    """``marin-data tokenizer ARGS`` in this process: (exit code, stdout, stderr)."""
    from marin_data.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["tokenizer", *map(str, args)])
    return exit_.value.code, *capsys.readouterr()


def test_tokenizer_train_reads_what_shard_reads_and_its_tokenizer_shards_a_corpus(tmp_path: Path, capsys):
    from shard_env import write_parquet

    from marin_data.corpus.build import shard_subset
    from marin_data.corpus.show import show_documents
    from marin_data.raw.bpe import train_tokenizer_file

    texts = make_texts(120, 5, words=(1, 60))
    write_jsonl(tmp_path / "in/a.jsonl.zst", [{"body": t} for t in texts[:60]], compression="zstd")
    write_parquet(tmp_path / "in/more/b.parquet", {"body": texts[60:]})
    out = tmp_path / "tok/tokenizer.json"
    code, stdout, stderr = tokenizer_cli(capsys, "train", tmp_path / "in", "--text-field", "body", "--vocab-size", 400,
                                         "--out", out)
    assert code == 0, stderr
    assert "on 120 documents from 2 files" in stdout and hashlib.sha256(out.read_bytes()).hexdigest() in stdout
    again = train_tokenizer_file([tmp_path / "in/**/*.*"], text_field="body", vocab_size=400,
                                 out=tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == out.read_bytes() and again.vocab_size == 400  # deterministic
    loaded = load_tokenizer(str(out))
    assert (loaded.info.eos_id, loaded.tokenizer.token_to_id("<|begin_of_text|>")) == (0, 1)
    report = shard_subset([tmp_path / "in"], subset="s", tokenizer=str(out), out=tmp_path / "corpus",
                          text_field="body", workers=1)
    assert report.docs == 120
    shown = show_documents(tmp_path / "corpus", subset="s", n=2)
    assert [d.text for d in shown] == texts[:2]  # byte-level: the text comes back exactly

    before = out.read_bytes()
    code, _, stderr = tokenizer_cli(capsys, "train", tmp_path / "in/a.jsonl.zst", "--text-field", "body",
                                    "--vocab-size", 300, "--out", out.parent)  # a folder: FOLDER/tokenizer.json
    assert code == 2 and "--force" in stderr and str(out) in stderr
    assert out.read_bytes() == before
    forced = train_tokenizer_file([tmp_path / "in/a.jsonl.zst"], text_field="body", vocab_size=300, out=out, force=True)
    assert forced.documents == 60 and out.read_bytes() != before and not list(out.parent.glob("*.part"))
