"""``datasheets/sample/`` is exactly what `marin-data datasheet` makes of the sample corpus today.

The copy in the repository was generated on one Python installation; the sample built elsewhere differs
(another standard library, Unicode or ``tokenizers`` version, or a pyarrow that writes other Parquet
footers). ``datasheets/sample-generated-from.json`` records those inputs: when this machine's differ the
test skips and says which, and otherwise it regenerates everything and requires the same bytes — a stale
copy fails with the command that refreshes it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "sample_datasheet.py"
REFRESH = "python scripts/sample_datasheet.py"


def _script():
    spec = importlib.util.spec_from_file_location("sample_datasheet", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _differences(recorded: dict, current: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(recorded) | set(current)):
        a, b = recorded.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: recorded {a!r}, here {b!r}")
    return out


@pytest.mark.slow
def test_repository_datasheets_match_a_fresh_generation(request, tmp_path):
    from PIL import Image

    from marin_data.corpus.sample import sample_documents

    script = _script()
    recorded = json.loads(script.RECORD.read_text())
    _, fingerprint = sample_documents()  # seconds; building the sample takes longer, so check this first
    if diff := _differences({k: recorded["sample.json"][k] for k in fingerprint}, fingerprint):
        pytest.skip("the sample here is built from another Python standard library: " + "; ".join(diff))
    corpus = request.getfixturevalue("sample_corpus")  # built by this session's code, shared with test_sample
    here = script.provenance(corpus)
    if diff := _differences({k: v for k, v in recorded.items() if k != "matplotlib"},
                            {k: v for k, v in here.items() if k != "matplotlib"}):
        pytest.skip("the sample here differs for reasons outside marin: " + "; ".join(diff))
    script.generate(corpus, tmp_path / "out")
    fresh = {p.relative_to(tmp_path / "out").as_posix(): p for p in (tmp_path / "out").rglob("*") if p.is_file()}
    kept = {p.relative_to(script.DEST).as_posix(): p for p in script.DEST.rglob("*") if p.is_file()}
    assert sorted(kept) == sorted(fresh), f"datasheets/sample/ has other files; run `{REFRESH}`"
    same_renderer = recorded["matplotlib"] == here["matplotlib"]
    for rel, path in fresh.items():
        if rel.endswith(".png") and not same_renderer:  # PNG bytes are reproducible per matplotlib release
            with Image.open(kept[rel]) as old, Image.open(path) as new:
                assert old.size == new.size, rel
            continue
        assert kept[rel].read_bytes() == path.read_bytes(), f"datasheets/sample/{rel} is stale; run `{REFRESH}`"
