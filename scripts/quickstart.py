"""`make quickstart`: the main job end to end on the embedded sample corpus, printing what it does.

Each step is the `marin-data` command a user would type, run as a subprocess so the output is exactly what
they will see.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "out" / "quickstart"
MARIN = [sys.executable, "-m", "marin_data"]


def step(title: str, *args: str) -> None:
    print(f"\n== {title}\n$ marin-data {shlex.join(args)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run([*MARIN, *args], check=True, cwd=ROOT)
    print(f"   ({time.perf_counter() - t0:.1f}s)", flush=True)


def main() -> None:
    corpus = OUT / "sample"
    step("Build the sample corpus offline from the Python standard library", "sample", str(corpus))
    step("What is in it", "info", str(corpus))
    step("Prove every byte is right", "verify", str(corpus))
    print(f"\nDone. The sample corpus is in {corpus.relative_to(ROOT)}.")


if __name__ == "__main__":
    main()
