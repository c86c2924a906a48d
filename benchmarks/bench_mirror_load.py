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

from marin_data.testing.mirror import mirror_process

REPO = "bench/corpus"


def make_root(root: Path) -> None:
    repo = root / REPO
    repo.mkdir(parents=True)
    (repo / "small.bin").write_bytes(bytes(range(256)) * 256)  # 64 KiB
    (repo / "big.bin").write_bytes(b"\0" * (32 << 20))


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=6, help="runs per condition; medians and spread are reported")
    ap.add_argument("--connections", type=int, default=1000, help="connections held open in the held runs")
    ap.add_argument("--requests", type=int, default=200, help="requests of the ordinary client per run")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.connections + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
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
