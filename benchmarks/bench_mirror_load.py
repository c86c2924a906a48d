"""Ordinary clients of `marin-data serve` while 1,000 idle, slow and stalled connections are held open.

The mirror runs in its own process on 127.0.0.1 (as a user runs it). One ordinary client times
``--requests`` requests on a keep-alive connection, alternating the repo info (``GET /api/datasets/{repo}``)
and a 64 KiB file; the figure of a run is the median latency of its requests. Runs alternate between a quiet
server and a held one, starting with the other condition each time. Held means ``--connections`` sockets:
45% connect and send nothing, 50% send a request head one header line every 2 s and never finish it
(a slowloris), 5% request a 32 MiB file and never read the answer. The claim is the ratio of the held
median to the quiet one (a server with a thread per connection, cheroot's 16, answers nothing until the
held sockets time out, ~60 s). Bounded: every socket has a timeout, every loop a count, every run a deadline.

    .venv/bin/python benchmarks/bench_mirror_load.py --runs 6            # the record
    .venv/bin/python benchmarks/bench_mirror_load.py --runs 2 --connections 200   # quick check

``--memory`` measures instead what the server's own memory (its RSS) spends per stalled download: a fresh
server per run, its RSS read once it answered 10 requests (the baseline), then ``--rounds`` rounds of
``--connections`` downloads of a 400 MiB file that never read, held until the RSS stops moving, then
closed, and the RSS read again. Per connection is (held - baseline) / connections (the first round also
starts the worker threads), and "after" is the RSS after the close over the baseline. ``--compare DIR`` runs another checkout's server (a
git worktree of an older commit) in alternate runs, the order rotated, side by side with this one.

    .venv/bin/python benchmarks/bench_mirror_load.py --memory --runs 2 --compare /tmp/old   # the record
"""

from __future__ import annotations

import argparse
import http.client
import json
import resource
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from marin_data.testing.mirror import mirror_process, served_process
from marin_data.testing.stalls import settled_rss, stalled_downloads

REPO = "bench/corpus"


def make_root(root: Path) -> None:
    repo = root / REPO
    repo.mkdir(parents=True)
    (repo / "small.bin").write_bytes(bytes(range(256)) * 256)  # 64 KiB
    (repo / "big.bin").write_bytes(b"\0" * (32 << 20))
    with open(repo / "huge.bin", "wb") as f:
        f.truncate(400 << 20)  # sparse: what a stalled download asks for


def ordinary_client(host: str, port: int, requests: int) -> list[float]:
    """Latency in seconds of each request of one keep-alive client."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    out = []
    try:
        for i in range(requests):
            path = f"/api/datasets/{REPO}" if i % 2 else f"/datasets/{REPO}/resolve/main/small.bin"
            t0 = time.perf_counter()
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            out.append(time.perf_counter() - t0)
            if resp.status != 200 or not body:
                raise RuntimeError(f"{path}: HTTP {resp.status}")
    finally:
        conn.close()
    return out


class Held:
    """``n`` connections held open against the server: silent, slowloris and stalled readers."""

    def __init__(self, host: str, port: int, n: int):
        self.addr, self.stop = (host, port), threading.Event()
        self.silent = [self._connect() for _ in range(n * 45 // 100)]
        self.slow = [self._connect(b"GET /api/datasets HTTP/1.1\r\nHost: x\r\n") for _ in range(n // 2)]
        self.stalled = [self._connect(f"GET /datasets/{REPO}/resolve/main/big.bin HTTP/1.1\r\nHost: x\r\n\r\n"
                                      .encode(), rcvbuf=4096) for _ in range(n - len(self.silent) - n // 2)]
        self.thread = threading.Thread(target=self._dribble, daemon=True)
        self.thread.start()

    def _connect(self, first: bytes = b"", rcvbuf: int | None = None) -> socket.socket:
        s = socket.socket()
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(10)
        s.connect(self.addr)
        if first:
            s.sendall(first)
        return s

    def _dribble(self) -> None:
        for i in range(1000):  # bounded: at most ~2,000 s, far beyond a run
            if self.stop.wait(2.0):
                return
            for s in self.slow:
                try:
                    s.send(b"X-Slow-%d: 1\r\n" % i)
                except OSError:
                    pass  # cut by the head time limit (10 s): still a socket the server had to hold

    def still_open(self) -> int:
        """How many held sockets the server has not closed (a closed one reads as EOF or a reset)."""
        n = 0
        for s in self.silent + self.slow:
            try:
                s.setblocking(False)
                n += s.recv(1, socket.MSG_PEEK) != b""
            except BlockingIOError:
                n += 1
            except OSError:
                pass
        return n + len(self.stalled)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for s in self.silent + self.slow + self.stalled:
            s.close()


def memory_run(root: Path, tree: Path | None, connections: int, rounds: int) -> dict:
    """One server (this checkout's, or ``tree``'s): its RSS before any download, then per round the RSS
    with the stalled downloads held and after they closed."""
    path = f"/datasets/{REPO}/resolve/main/huge.bin"
    with served_process(root, checkout=tree) as (url, server):
        parts = urlsplit(url)
        ordinary_client(parts.hostname, parts.port, 10)  # imports and caches, as in the latency runs
        out = {"base": settled_rss(server.pid, quiet=2.0, timeout=60), "held": [], "after": []}
        for _ in range(rounds):
            with stalled_downloads(parts.hostname, parts.port, path, connections):
                out["held"].append(settled_rss(server.pid, quiet=2.0, timeout=60))
            out["after"].append(settled_rss(server.pid, quiet=2.0, timeout=60))
    return out


def memory(args) -> None:
    trees = {"this": None, **({"compare": args.compare} if args.compare else {})}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        root = _root(Path(tmp))
        for run in range(args.runs):
            order = list(trees) if run % 2 == 0 else list(reversed(trees))
            for name in order:
                r = memory_run(root, trees[name], args.connections, args.rounds)
                runs[name].append(r)
                per = [(h - r["base"]) / args.connections / 1024 for h in r["held"]]
                after = [(a - r["base"]) / 2**20 for a in r["after"]]
                print(f"run {run + 1} {name}: base {r['base'] / 2**20:.1f} MiB; per connection "
                      f"{', '.join(f'{x:.0f}' for x in per)} KiB; after closing "
                      f"{', '.join(f'{x:+.1f}' for x in after)} MiB", flush=True)
    summary = {}
    for name, rs in runs.items():
        per = sorted((h - r["base"]) / args.connections / 1024 for r in rs for h in r["held"])
        after = sorted((a - r["base"]) / 2**20 for r in rs for a in r["after"])
        summary[name] = {"per_connection_kib_median": round(statistics.median(per), 1),
                         "per_connection_kib_range": [round(per[0], 1), round(per[-1], 1)],
                         "after_close_mib_median": round(statistics.median(after), 1),
                         "after_close_mib_range": [round(after[0], 1), round(after[-1], 1)],
                         "base_mib": [round(r["base"] / 2**20, 1) for r in rs]}
    print(json.dumps({"connections": args.connections, "rounds": args.rounds, "runs": args.runs, **summary}))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=6, help="runs per condition; medians and spread are reported")
    ap.add_argument("--connections", type=int, default=1000, help="connections held open in the held runs")
    ap.add_argument("--requests", type=int, default=200, help="requests of the ordinary client per run")
    ap.add_argument("--memory", action="store_true", help="measure the server's memory per stalled download")
    ap.add_argument("--rounds", type=int, default=3, help="--memory: rounds of stalled downloads per server")
    ap.add_argument("--compare", type=Path, help="--memory: another checkout whose server runs alternately")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.connections + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    if args.memory:
        memory(args)
        return
    results: dict[str, list[float]] = {"quiet": [], "held": []}
    open_counts = []
    with tempfile.TemporaryDirectory() as tmp, mirror_process(_root(Path(tmp))) as url:
        parts = urlsplit(url)
        ordinary_client(parts.hostname, parts.port, 10)  # warm up: imports, caches
        for run in range(args.runs):
            for cond in (("quiet", "held") if run % 2 == 0 else ("held", "quiet")):
                held = Held(parts.hostname, parts.port, args.connections) if cond == "held" else None
                try:
                    if held:
                        time.sleep(1.0)  # let the server take every connection in
                    lat = ordinary_client(parts.hostname, parts.port, args.requests)
                    if held:
                        open_counts.append(held.still_open())
                finally:
                    if held:
                        held.close()
                results[cond].append(statistics.median(lat))
                print(f"run {run + 1} {cond}: median {statistics.median(lat) * 1e3:.2f} ms over {len(lat)} requests"
                      + (f", {open_counts[-1]} of {args.connections} held connections open" if held else ""),
                      flush=True)
    quiet, loaded = statistics.median(results["quiet"]), statistics.median(results["held"])
    summary = {"connections": args.connections, "requests": args.requests, "runs": args.runs,
               "quiet_ms": [round(x * 1e3, 3) for x in results["quiet"]],
               "held_ms": [round(x * 1e3, 3) for x in results["held"]],
               "quiet_median_ms": round(quiet * 1e3, 3), "held_median_ms": round(loaded * 1e3, 3),
               "ratio": round(loaded / quiet, 2), "held_open": open_counts}
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


def _root(tmp: Path) -> Path:
    make_root(tmp / "root")
    return tmp / "root"


if __name__ == "__main__":
    main()
