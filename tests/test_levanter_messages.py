"""What the commands print about an unpinned Levanter cache or store: each layout with the cells that have it,
no byte rate where no byte was hashed, counts that agree with their nouns."""

from __future__ import annotations

from levanter_env import make_cache, make_store
from shard_env import run_cli

from marin_data.corpus.verify import Problem, ProblemKind
from marin_data.errors import CacheCheckError
from marin_data.levanter.checks import refuse_problems


def test_info_names_the_cells_of_each_layout_when_they_differ(tmp_path):
    make_store(tmp_path / "store", {"cluster=0/quality=1": 30, "cluster=1/quality=1": 30})
    make_cache(tmp_path / "store" / "cluster=2/quality=1", 30, dtype="int64")
    out = run_cli("info", tmp_path / "store")
    assert out.returncode == 0, out.stderr
    layouts = [line for line in out.stdout.splitlines() if line.startswith("layout")]
    assert len(layouts) == 2
    assert any("int32" in line and "cluster=0/quality=1, cluster=1/quality=1" in line for line in layouts)
    assert any("int64" in line and line.endswith(": cluster=2/quality=1") for line in layouts)
    one = run_cli("info", tmp_path / "store" / "cluster=0/quality=1")
    assert [line for line in one.stdout.splitlines() if line.startswith("layout")] == [
        "layout           consolidated (int32, blosc lz4 clevel 5)"]


def test_verify_of_an_unpinned_cache_claims_no_bytes_checked(tmp_path):
    make_cache(tmp_path / "cache", 30)
    out = run_cli("verify", tmp_path / "cache")
    assert out.returncode == 0, out.stderr
    last = out.stdout.splitlines()[-1]
    assert last.startswith("OK: ") and "not pinned" in last and " B/s" not in last and "0 B in" not in last


def test_one_structural_problem_is_one_problem():
    try:
        refuse_problems([Problem(ProblemKind.BAD_OFFSETS, "a/input_ids/offsets", "decreasing")], "a")
    except CacheCheckError as e:
        assert "1 structural problem, nothing written" in str(e)
    else:
        raise AssertionError("refuse_problems raised nothing")
