#!/usr/bin/env python3
"""Mutation check of the emulated CUDA suite: do tests/test_cuda_emulated.py's tests notice a broken kernel?

Applies one simple mutation at a time to the code lines of cuda/*.cu and cuda/*.cuh (an arithmetic or logical
operator, a comparison, an index offset, an integer constant, a dropped statement), builds the host library
(tests/cuda_emu), runs the emulated suite on it with -x and a per-mutant timeout, and reports how many
mutants compiled, how many the tests killed, and which survived. A mutant that survives the plain build is
then run under the sanitizer builds (ASan + UBSan, ThreadSanitizer: tests/test_cuda_emulated.py's sanitizer
tests), which see what the plain build forgives (a read past an array, a race). Constants and lines that only
tune speed (unrolling, launch bounds, blocks per SM, batch sizes, scores per lane, the SM-count cache) and
the occupancy report are left out; the access widths are in, as a test names the kernel each launch took.
Slow (about ten minutes for 60 mutants on two cores): not part of `make test`; docs/cuda.md records its
figures.

    .venv/bin/python scripts/mutate_kernels.py                   # 60 mutants, seed 0
    .venv/bin/python scripts/mutate_kernels.py --count 80 --seed 1
    .venv/bin/python scripts/mutate_kernels.py --known-bugs      # the three bugs the old host tests missed
    .venv/bin/python scripts/mutate_kernels.py --list            # every candidate mutation, numbered
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "cuda_emu"))
from host_build import HostBuildError, build_host_library  # noqa: E402

CUDA = ROOT / "cuda"
FILES = ("common.cuh", "device.cuh", "route_topk.cuh", "permute.cuh", "route_topk.cu", "permute.cu", "unpermute.cu")
# Lines whose constants only tune speed (any value in range is correct: scores per lane, unrolling, launch
# bounds, batch sizes, permute's rounds per tile, the route grid's resident blocks) or only report (the
# occupancy table and its size).
SPEED_ONLY = re.compile(r"MARIN_UNROLL|__launch_bounds__|kRouteBlocksPerSM\s*=|kPullBatch\s*=|kRowMinBlocks\s*=|"
                        r"route_backward_blocks|route_forward_blocks|resident|needed|kScanBatch\s*=|"
                        r"kPermuteRounds\s*=|multiprocessor_count|cached\[|static_assert|#|return 132|count = 132|"
                        r"(?i:occupancy)|choices\[\]|launch\(std::integral_constant")
SKIP_LINE = re.compile(r"^\s*(//|\*|namespace|}|template|using|#|extern \"C\"|case \d+: return|default:)")

# The bugs the previous host tests let through: (file, old, new).
KNOWN_BUGS = {
    "permute stride kMaxExperts -> num_experts": (
        "permute.cu", "tile_rank(running[e], &warp_counts[0][e], kMaxExperts,",
        "tile_rank(running[e], &warp_counts[0][e], num_experts,"),
    "route_topk always renormalises": (
        "route_topk.cu", "combine_weight(mode, gate, gate_sum, scale, renormalize)",
        "combine_weight(mode, gate, gate_sum, scale, true)"),
    "unpermute reads w[u] for w[k0 + u]": (
        "unpermute.cu", "__fmul_rn(v[u][q], w[k0 + u])", "__fmul_rn(v[u][q], w[u])"),
}

SWAPS = [(" + ", " - "), (" - ", " + "), (" * ", " / "), (" / ", " * "), (" < ", " <= "), (" <= ", " < "),
         (" > ", " >= "), (" >= ", " > "), (" == ", " != "), (" != ", " == "), (" && ", " || "), (" || ", " && "),
         (" % ", " / "), (" |= ", " &= "), (" += ", " -= ")]


@dataclasses.dataclass(frozen=True)
class Mutant:
    file: str
    line: int  # 1-based
    kind: str
    old: str
    new: str

    def describe(self) -> str:
        return f"{self.file}:{self.line} [{self.kind}] {self.old.strip()}  ->  {self.new.strip()}"


def code_lines(text: str):
    """(line number, line) of the lines worth mutating: code, not comments, declarations or speed knobs."""
    in_comment = False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("/*"):
            in_comment = "*/" not in stripped
            continue
        if in_comment:
            in_comment = "*/" not in stripped
            continue
        if not stripped or SKIP_LINE.match(line) or SPEED_ONLY.search(line):
            continue
        yield number, line


def strip_comment(line: str) -> str:
    return line.split("//", 1)[0]


def candidates(cuda: Path) -> list[Mutant]:
    found: list[Mutant] = []
    for name in FILES:
        text = (cuda / name).read_text()
        for number, line in code_lines(text):
            code = strip_comment(line)
            for old, new in SWAPS:
                for m in re.finditer(re.escape(old), code):
                    found.append(Mutant(name, number, "operator", line, line[:m.start()] + new + line[m.end():]))
            for m in re.finditer(r"(?<![\w.])(\d+)(?![\w.])", code):  # integer constants
                value = int(m.group(1))
                replacement = str(value + 1) if value != 1 else "0"
                found.append(Mutant(name, number, "constant", line, line[:m.start()] + replacement + line[m.end():]))
            for m in re.finditer(r"\[([^\[\]]+)\]", code):  # index offsets
                if "__shared__" in code:
                    continue  # array sizes of declarations: a larger array is never wrong
                found.append(Mutant(name, number, "index", line,
                                    line[:m.start()] + f"[{m.group(1)} + 1]" + line[m.end():]))
            if code.rstrip().endswith(";") and not re.match(r"\s*(return|const |int |float |bool |uint|__shared__)",
                                                           code):
                found.append(Mutant(name, number, "dropped", line, re.sub(r"\S.*$", ";", line)))
    return found


def apply(mutant: Mutant, directory: Path) -> None:
    path = directory / mutant.file
    lines = path.read_text().splitlines(keepends=True)
    assert lines[mutant.line - 1].rstrip("\n") == mutant.old, mutant
    lines[mutant.line - 1] = mutant.new + "\n"
    path.write_text("".join(lines))


# The tests that exercise a file most directly run first, so that most mutants die within seconds.
FOCUS = {"route_topk": "route_topk", "permute": "permute and not unpermute", "unpermute": "unpermute"}
# The tests that run a subset of the suite on the sanitizer builds (each builds its flavour of the mutant).
SANITIZER_TESTS = ("clean_under_address_and_undefined_behaviour", "no_data_race_under_the_thread_sanitizer")
SANITIZER_TIMEOUT = 900  # two builds and two runs of a subset: minutes on two shared cores


def outcome(part: str, env: dict, timeout: float) -> str:
    """'failed', 'passed' or 'timeout' for the emulated tests that `part` selects."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--noconftest", "-p", "no:xdist",
           str(ROOT / "tests" / "test_cuda_emulated.py"), "-k", part]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        return "timeout"
    if done.returncode in (1, 3) or done.returncode < 0:  # test failures, internal errors, crashes
        return "failed"
    if done.returncode not in (0, 5):  # 5: nothing selected
        raise RuntimeError(f"pytest exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return "passed"


def run_suite(cuda_dir: Path, build_dir: Path, timeout: float, selection: str, focus: str = "",
              sanitizers: bool = True) -> str:
    """'killed', 'sanitizers' (killed by the sanitizer builds only), 'survived' or 'no-compile' for the
    sources in cuda_dir."""
    try:
        build_host_library(build_dir, cuda_dir=cuda_dir, extra_flags=("-Wno-error",))  # warnings: still code
    except HostBuildError:
        return "no-compile"
    env = dict(os.environ, MARIN_EMU_CUDA_DIR=str(cuda_dir), MARIN_EMU_BUILD_DIR=str(build_dir),
               MARIN_EMU_EXTRA_FLAGS="-Wno-error")
    deadline = time.time() + timeout
    for part in ([f"({selection}) and ({focus})", f"({selection}) and not ({focus})"] if focus else [selection]):
        if outcome(part, env, deadline - time.time()) != "passed":  # a hang or a crawl counts: the suite notices
            return "killed"
    if not sanitizers:
        return "survived"
    start = time.time()
    for test in SANITIZER_TESTS:
        # past its limit a sanitizer run is the machine's load, not the mutant's doing: no kill is counted
        if outcome(test, env, SANITIZER_TIMEOUT - (time.time() - start)) == "failed":
            return "sanitizers"
    return "survived"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=60, help="mutants to sample (default 60)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per mutant (default 120)")
    parser.add_argument("--select", default="not sanitizer", help="pytest -k expression for the subset "
                        "(default: all but the sanitizer runs)")
    parser.add_argument("--no-sanitizers", action="store_true",
                        help="do not run the survivors under the sanitizer builds")
    parser.add_argument("--known-bugs", action="store_true", help="run the three known bugs instead")
    parser.add_argument("--list", action="store_true", help="list the candidate mutations and exit")
    parser.add_argument("--replay", type=Path, default=None,
                        help="rerun the mutants a previous run's output lists as survived (after new tests)")
    args = parser.parse_args(argv)

    snapshot_dir = tempfile.TemporaryDirectory(prefix="marin-mutants-")
    tmp = Path(snapshot_dir.name)
    source = tmp / "cuda"  # a snapshot: cuda/ may change while the mutants run
    shutil.copytree(CUDA, source, ignore=shutil.ignore_patterns("build"))
    if args.known_bugs:
        mutants = []
        for label, (name, old, new) in KNOWN_BUGS.items():
            lines = (source / name).read_text().splitlines()
            number = next(i for i, line in enumerate(lines, 1) if old in line)
            mutants.append(Mutant(name, number, label, lines[number - 1], lines[number - 1].replace(old, new)))
    else:
        pool = candidates(source)
        if args.list:
            for i, mutant in enumerate(pool):
                print(i, mutant.describe())
            return 0
        if args.replay is not None:
            wanted = [m.group(1) for m in re.finditer(r"\] survived +[\d.]+s  (.*)", args.replay.read_text())]
            mutants = [mutant for mutant in pool if mutant.describe() in wanted]
            print(f"replaying {len(mutants)} of the {len(wanted)} survivors listed in {args.replay}")
        else:
            mutants = random.Random(args.seed).sample(pool, min(args.count, len(pool)))
            print(f"{len(pool)} candidate mutations; sampled {len(mutants)} with seed {args.seed}")

    results: dict[str, list[Mutant]] = {"killed": [], "sanitizers": [], "survived": [], "no-compile": []}
    start = time.time()
    with snapshot_dir:
        build_dir = tmp / "build"
        for i, mutant in enumerate(mutants, 1):
            work = tmp / f"cuda-{i}"
            shutil.copytree(source, work)
            apply(mutant, work)
            t0 = time.time()
            focus = FOCUS.get(mutant.file.split(".")[0], "")
            verdict = run_suite(work, build_dir, args.timeout, args.select, focus, not args.no_sanitizers)
            results[verdict].append(mutant)
            print(f"[{i}/{len(mutants)}] {verdict:10s} {time.time() - t0:5.1f}s  {mutant.describe()}", flush=True)
            shutil.rmtree(work)
            for stale in build_dir.glob("libmarin_kernels_host-*"):
                stale.unlink()
    killed = len(results["killed"]) + len(results["sanitizers"])
    compiled = killed + len(results["survived"])
    print(f"\n{len(mutants)} mutants, {compiled} compiled, {killed} killed "
          f"({100.0 * killed / max(compiled, 1):.1f}% of those that compiled; {len(results['sanitizers'])} of them "
          f"only by the sanitizer builds), {len(results['survived'])} survived; {time.time() - start:.0f}s")
    for mutant in results["survived"]:
        print("  survived:", mutant.describe())
    if args.known_bugs:
        return 0 if not results["survived"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
