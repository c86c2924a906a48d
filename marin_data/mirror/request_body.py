"""A request body as the HTTP front reads it: on its event loop, and as a blocking file for the app.

`Body` reads ``Content-Length`` or chunked framing from the connection, each read waiting at most
``timeout`` seconds for the client; `ThreadBody` is the same body as a raw file the WSGI app reads on its
worker thread, each read waiting on the loop (a stall or a malformed chunk reaches the app as `BodyError`,
which it answers). `Refuse` is an answer the front gives itself (a malformed chunk header, a body too large
or too slow) before closing the connection (`marin_data.mirror.front`).
"""

from __future__ import annotations

import asyncio
import io

from marin_data.mirror.http import BodyError

__all__ = ["Refuse", "Body", "ThreadBody"]


class Refuse(Exception):
    """The front answers ``status`` itself and closes the connection."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class Body:
    """A request body on the loop's side: ``Content-Length`` or chunked, each read bounded in time."""

    def __init__(self, reader: asyncio.StreamReader, length: int | None, timeout: float):
        self._reader, self._timeout = reader, timeout
        self.left = length  # bytes left (Content-Length), or of the current chunk (chunked)
        self._chunked = length is None
        self.done = length == 0

    async def _line(self) -> bytes:
        line = await asyncio.wait_for(self._reader.readuntil(b"\n"), self._timeout)
        if len(line) > 4096:
            raise Refuse(400, "chunk header too long")
        return line

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; b"" once the body is complete."""
        if self.done:
            return b""
        if self._chunked and not self.left:
            try:
                size = int(self._line_value(await self._line()), 16)
            except ValueError:
                raise Refuse(400, "malformed chunk size") from None
            if size == 0:
                while (await self._line()).strip():  # trailers, ignored
                    pass
                self.done = True
                return b""
            self.left = size
        data = await asyncio.wait_for(self._reader.read(min(n, self.left)), self._timeout)
        if not data:
            raise ConnectionError("the client closed the connection in the middle of a body")
        self.left -= len(data)
        if not self.left:
            if self._chunked:
                await self._line()  # the CRLF after a chunk
            else:
                self.done = True
        return data

    @staticmethod
    def _line_value(line: bytes) -> bytes:
        return line.split(b";", 1)[0].strip()


class ThreadBody(io.RawIOBase):
    """A streamed body as a blocking file for the app's worker thread; each read waits on the loop."""

    def __init__(self, body: Body, loop: asyncio.AbstractEventLoop, timeout: float):
        self._body, self._loop, self._timeout = body, loop, timeout

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        try:
            data = asyncio.run_coroutine_threadsafe(self._body.read(len(b)), self._loop).result(self._timeout + 5)
        except TimeoutError:
            raise BodyError(408, f"request body stalled for {self._timeout:g} s") from None
        except Refuse as e:
            raise BodyError(e.status, e.message) from None
        b[:len(data)] = data
        return len(data)
