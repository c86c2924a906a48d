"""`make quickstart`: the main job end to end on the embedded sample corpus, printing what it does.

Each step is the `marin-data` or `marin-train` command a user would type, run as a subprocess so the output is
exactly what they will see. It ends with the run's held-out evaluation and two sampled lines.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "out" / "quickstart"
TRAIN_STEPS = 60  # ~30-60 s of training on 2 cores


def step(title: str, *args: str, command: str = "marin-data") -> None:
    print(f"\n== {title}\n$ {command} {shlex.join(args)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", command.replace("-", "_"), *args], check=True, cwd=ROOT)
    print(f"   ({time.perf_counter() - t0:.1f}s)", flush=True)


def main() -> None:
    corpus = OUT / "sample"
    step("Build the sample corpus offline from the Python standard library", "sample", str(corpus))
    step("What is in it", "info", str(corpus))
    step("Prove every byte is right", "verify", str(corpus))
    step("Document it: datasheet, dataset card, Croissant file and figures, computed from the data", "datasheet",
         str(corpus))
    publish_and_download(corpus)
    serve_and_download(corpus)
    train_on_it(corpus)
    evaluate_and_sample(corpus)
    print(f"\nDone. The sample corpus is in {corpus.relative_to(ROOT)}, the run in {(OUT / 'run').relative_to(ROOT)}.")


def evaluate_and_sample(corpus: Path) -> None:
    """The run's held-out loss and bits per byte per subset, then two lines sampled from it."""
    run = str((OUT / "run").relative_to(ROOT))
    step("Evaluate the run's latest checkpoint on the held-out split (sequences it never trained on)", "eval", run,
         "--data", str(corpus.relative_to(ROOT)), "--cache-dir", str((OUT / "loader-cache").relative_to(ROOT)),
         command="marin-train")
    step("Sample from it: two prompts continued with the run's tokenizer, through a KV cache", "generate", run,
         "--prompt", "def ", "--prompt", "The ", "--max-new-tokens", "24", command="marin-train")


def train_on_it(corpus: Path) -> None:
    """Iterate the loader over the sample with a two-phase mixture, checkpoint it, resume on another world size."""
    demo = ["-m", "marin_data.testing.demo", str(corpus.relative_to(ROOT)), "--cache-dir",
            str((OUT / "loader-cache").relative_to(ROOT))]
    print(f"\n== Feed training: a mixture schedule, a checkpoint, an exact resume on 2 ranks\n$ python "
          f"{shlex.join(demo)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *demo], check=True, cwd=ROOT)
    print(f"   ({time.perf_counter() - t0:.1f}s)", flush=True)


def publish_and_download(corpus: Path) -> None:
    """Publish to a throwaway S3 server on loopback (moto), download one subset back, verify it.

    A copy is published because publish records the bucket in the corpus's mirrors.json, and the local
    server's port changes every run: the sample corpus itself stays as built. The server is always stopped.
    """
    from marin_data.testing.local_s3 import LOCAL_S3_ENV, create_bucket, local_s3_server

    copy, fetched = OUT / "to-publish", OUT / "downloaded"
    for old in (copy, fetched):
        shutil.rmtree(old, ignore_errors=True)
    shutil.copytree(corpus, copy)
    os.environ.update(LOCAL_S3_ENV)  # dummy credentials for the local server, inherited by each step
    os.environ.pop("AWS_PROFILE", None)
    subset = "prose/docstrings"
    print("\n== Start a local S3 server (moto) on 127.0.0.1", flush=True)
    with local_s3_server() as endpoint:
        create_bucket(endpoint, "marin-quickstart")
        url = "s3://marin-quickstart/sample"
        print(f"   {endpoint}", flush=True)
        step("Publish it: one PUT per file with its SHA-256, manifest last", "publish", str(copy), "--to", url,
             "--endpoint-url", endpoint)
        step("Publishing recorded the bucket in mirrors.json (the manifest and its digest are unchanged): list it "
             "in the datasheet", "datasheet", str(copy))
        step("Publish again: only the datasheet changed, everything else is skipped", "publish", str(copy), "--to",
             url, "--endpoint-url", endpoint)
        step("Download one subset, verified as it streams", "download", url, "--subset", subset, "--to",
             str(fetched), "--endpoint-url", endpoint)
        step("Run it again: every file is already there and verified, nothing is fetched", "download", url,
             "--subset", subset, "--to", str(fetched), "--endpoint-url", endpoint)
        train_from_s3(url, endpoint)
    print("   (local S3 server stopped)", flush=True)
    step("Verify the download: a partial copy records what it fetched, so plain verify checks exactly that",
         "verify", str(fetched))


def train_args(data: str, *options: str, steps: int, cache: str) -> tuple[str, ...]:
    """``marin-data train`` on ``data`` with the quickstart's mixture, run directory and a 20 MiB shard cache."""
    return ("train", "--data", data, *options, "--mixture", "code/*=0.5", "--mixture", "prose/*=0.4", "--mixture",
            "reference/*=0.1", "--steps", str(steps), "--checkpoint-dir", str(OUT / "run"), "--cache-dir",
            str(OUT / cache), "--cache-gb", "0.02", "--log-every", "10")


def train_from_s3(url: str, endpoint: str) -> None:
    """Train the tiny model streaming the sample from the bucket through a bounded shard cache, with a mixture;
    stop at a checkpoint, resume from it to the end (the cache is warm by then), and summarize."""
    run = OUT / "run"
    for old in (run, OUT / "shard-cache"):
        shutil.rmtree(old, ignore_errors=True)
    args = train_args(url, "--endpoint-url", endpoint, steps=TRAIN_STEPS, cache="shard-cache")
    step(f"Train the tiny MoE model streaming from S3 (mixture 50/40/10, a 20 MiB shard cache); stop at step "
         f"{TRAIN_STEPS // 2}", *args, "--until", str(TRAIN_STEPS // 2))
    step("Resume from the checkpoint: same data position, optimizer, balancing bias and RNG", *args)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    head, tail = metrics[:5], metrics[-5:]

    def mean(rows: list[dict], key: str) -> float:
        return sum(r[key] for r in rows) / len(rows)

    warm = [r for r in metrics if r["step"] not in (1, TRAIN_STEPS // 2 + 1)]  # not each run's first batch
    wait = sum(r["data_wait"] for r in warm) / sum(r["seconds"] for r in warm)
    print(f"\n== What happened in training\n   {len(metrics)} steps of {metrics[0]['tokens']} tokens, resumed once at step "
          f"{TRAIN_STEPS // 2}\n   loss {mean(head, 'loss'):.3f} (first 5 steps) -> {mean(tail, 'loss'):.3f} (last 5); "
          f"uniform guessing over the vocabulary would be ~9.01\n   time waiting for data (each run's first batch aside): "
          f"{wait:.2%} of step time; experts max/mean load {mean(tail, 'imbalance'):.2f} at the end", flush=True)


def serve_and_download(corpus: Path) -> None:
    """Serve the sample as a Hugging Face Hub mirror on loopback, download one subset through it, verify it.

    The mirror serves ROOT/org/name as the dataset repo org/name, so the sample is linked into a fresh ROOT
    (hard links: no copy). It listens on a free port and is always stopped.
    """
    from marin_data.testing.mirror import mirror_process

    hub, fetched = OUT / "hub", OUT / "from-mirror"
    for old in (hub, fetched):
        shutil.rmtree(old, ignore_errors=True)
    shutil.copytree(corpus, hub / "marin" / "sample", copy_function=os.link)
    subset = "prose/docstrings"
    with mirror_process(hub) as url:
        print(f"\n== Serve it as a Hugging Face Hub mirror (any huggingface_hub client works with HF_ENDPOINT={url})\n"
              f"$ marin-data serve {hub} --port {url.rpartition(':')[2]}", flush=True)
        step("Download one subset through the mirror: the same verifying, resumable machinery", "download",
             "hf://datasets/marin/sample", "--subset", subset, "--to", str(fetched), "--endpoint", url)
        shutil.rmtree(OUT / "shard-cache-hf", ignore_errors=True)
        step("Extend the training run by 20 steps, streaming from the mirror: its stream is the S3 one (the loader's "
             "fingerprint covers the shards, not where they live), so the S3 run's checkpoint resumes",
             *train_args("hf://datasets/marin/sample", "--endpoint", url, steps=TRAIN_STEPS + 20,
                         cache="shard-cache-hf"))
    print("   (mirror stopped)", flush=True)
    step("Verify the subset downloaded through the mirror", "verify", str(fetched))


if __name__ == "__main__":
    main()
