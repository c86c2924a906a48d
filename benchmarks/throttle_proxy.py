"""A bandwidth-limiting TCP proxy on 127.0.0.1, for benchmarks: a loopback S3 server made to look like a real
bucket's link, where bytes cost time.

Every connection through it is paced to ``--rate`` bytes/s in each direction (a token bucket per connection,
``--burst`` bytes deep), and at most ``--connections`` connections move bytes at once: a connection takes a
slot when it has bytes to move and gives it back once it has moved none for ``--idle`` seconds (or closes),
so a client's idle keep-alive connections never starve its busy ones; a connection that finds every slot
taken waits for one. The proxy is HTTP-unaware: it forwards bytes as they come.

    python benchmarks/throttle_proxy.py --upstream http://127.0.0.1:5000 --rate 100e6 --connections 4
    # prints the endpoint to use ("http://127.0.0.1:PORT") on its first line, then serves until killed

`bench_loader_cold.py --throttle RATE CONNECTIONS` starts one in front of its moto server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

CHUNK = 64 << 10


class Link:
    """One client connection's pacing (shared by both directions) and its hold on a slot."""

    def __init__(self, slots: asyncio.Semaphore, rate: float, burst: int, idle: float) -> None:
        self.slots, self.rate, self.burst, self.idle = slots, rate, burst, idle
        self.ready = time.monotonic()  # when the bucket has room for the next byte
        self.held, self.last = False, 0.0

    async def send(self, n: int) -> None:
        """Take a slot if none is held, then wait until ``n`` more bytes fit this connection's rate."""
        if not self.held:
            await self.slots.acquire()
            self.held = True
            asyncio.get_running_loop().create_task(self._give_back_when_idle())
        now = time.monotonic()
        self.ready = max(self.ready, now - self.burst / self.rate) + n / self.rate
        if self.ready > now:
            await asyncio.sleep(self.ready - now)
        self.last = time.monotonic()

    async def _give_back_when_idle(self) -> None:
        while self.held:
            await asyncio.sleep(self.idle)
            if self.held and time.monotonic() - self.last >= self.idle:
                self.release()

    def release(self) -> None:
        if self.held:
            self.held = False
            self.slots.release()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link) -> None:
    try:
        while data := await reader.read(CHUNK):
            await link.send(len(data))
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(upstream: str, rate: float, connections: int, burst: int, idle: float, port: int = 0) -> None:
    host, up_port = urlsplit(upstream).hostname, urlsplit(upstream).port
    slots = asyncio.Semaphore(connections)

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        link = Link(slots, rate, burst, idle)
        try:
            server_r, server_w = await asyncio.open_connection(host, up_port)
        except OSError:
            client_w.close()
            return
        try:
            await asyncio.gather(_pump(client_r, server_w, link), _pump(server_r, client_w, link))
        finally:
            link.release()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def throttled(upstream: str, rate: float, connections: int) -> Iterator[str]:
    """Run the proxy in its own process in front of ``upstream``; yield its endpoint; always stop it."""
    proc = subprocess.Popen([sys.executable, __file__, "--upstream", upstream, "--rate", str(rate),
                             "--connections", str(connections)], stdout=subprocess.PIPE, text=True)
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="http://host:port of the server behind it")
    ap.add_argument("--rate", type=float, default=100e6, help="bytes/s per connection, each direction")
    ap.add_argument("--connections", type=int, default=4, help="connections moving bytes at once")
    ap.add_argument("--burst", type=int, default=1 << 20, help="bytes a connection may send at once")
    ap.add_argument("--idle", type=float, default=0.05, help="seconds without bytes before a slot is given back")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    asyncio.run(serve(args.upstream, args.rate, args.connections, args.burst, args.idle, args.port))


if __name__ == "__main__":
    main()
