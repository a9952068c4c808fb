"""A lean HTTP/1.1 client for the one request the generate client makes by the thousand: POST /generate.

aiohttp's general machinery (header multidicts, cookie jars, redirects, timers, tracing, payload
writers) costs more CPU per request than everything else the client does with an answer; at
thousands of short answers a second it is what bounds the client. This module keeps only what a
POST of a JSON body to SGLang needs: keep-alive connections (plain or TLS) per server, the request
written in one piece, and the answer read by Content-Length, chunked transfer encoding, or to the
connection's end. Everything else the client asks for (load, server info) goes through aiohttp.

Errors surface as `HTTPError` (connection refused, reset, closed mid-answer, malformed answer):
the caller retries them like any transient failure, with a new rid (a request is never sent twice
under one rid: SGLang would refuse the second while the first runs). A connection the server has
closed (uvicorn closes idle ones after a few seconds) is seen closed and not reused; a request
cancelled mid-way (a timeout, a stop) closes its connection.
"""

import asyncio
import ssl
from collections import deque
from urllib.parse import urlsplit


class HTTPError(Exception):
    """The request did not get a whole answer: a connection error or a malformed answer."""


class _Answer(asyncio.Protocol):
    """One connection: writes a request, reads its answer (status, body), then may serve the next."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self.keep_alive = True
        self._head: tuple[int, dict] | None = None
        self._body_start = 0

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is not None and not self.waiter.done():
            self._parse(eof=False)

    def eof_received(self):
        self._parse(eof=True)
        return False  # close the transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self._parse(eof=True)
            if not self.waiter.done():
                reason = f"{type(exc).__name__}: {exc}" if exc else "the server closed the connection"
                self.waiter.set_exception(HTTPError(f"connection lost before the whole answer: {reason}"))

    # -- one exchange
    def send(self, request: bytes) -> asyncio.Future:
        self.buffer.clear()
        self._head = None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def _parse(self, *, eof: bool) -> None:
        if self.waiter is None or self.waiter.done():
            return
        try:
            answer = self._answer(eof)
        except HTTPError as exc:
            self.keep_alive = False
            self.waiter.set_exception(exc)
            return
        if answer is not None:
            self.waiter.set_result(answer)

    def _answer(self, eof: bool) -> tuple[int, bytes] | None:
        buf = self.buffer
        if self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if eof:
                    raise HTTPError("the server closed the connection before the answer's headers")
                return None
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise HTTPError(f"not an HTTP answer: {lines[0][:100]!r}")
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            status = int(parts[1])
            if status == 100:  # a provisional answer: the real one follows
                del buf[: end + 4]
                return self._answer(eof)
            connection = headers.get("connection", "").lower()
            self.keep_alive = parts[0] == "HTTP/1.1" and "close" not in connection
            self._head = (status, headers)
            self._body_start = end + 4
        status, headers = self._head
        start = self._body_start
        if status in (204, 304) or 100 <= status < 200:
            return status, b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._chunks(start)
            if body is None:
                if eof:
                    raise HTTPError("the server closed the connection inside a chunked answer")
                return None
            return status, body
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise HTTPError(f"malformed Content-Length {length!r}")
            n = int(length)
            if len(buf) - start >= n:
                return status, bytes(buf[start : start + n])
            if eof:
                raise HTTPError(f"the server closed the connection after {len(buf) - start} of {n} bytes")
            return None
        self.keep_alive = False  # read to the connection's end
        return (status, bytes(buf[start:])) if eof else None

    def _chunks(self, pos: int) -> bytes | None:
        buf, parts = self.buffer, []
        while True:
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                return None
            size_text = bytes(buf[pos:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HTTPError(f"malformed chunk size {size_text[:20]!r}") from None
            pos = line_end + 2
            if size == 0:
                trailer_end = buf.find(b"\r\n", pos)
                while trailer_end > pos:  # skip trailers up to the empty line
                    pos = trailer_end + 2
                    trailer_end = buf.find(b"\r\n", pos)
                return b"".join(parts) if trailer_end == pos else None
            if len(buf) < pos + size + 2:
                return None
            parts.append(bytes(buf[pos : pos + size]))
            pos += size + 2


class Server:
    """Keep-alive connections to one server (`base_url`: scheme, host, port and any path prefix)."""

    def __init__(self, base_url: str, *, headers: dict | None = None, ssl_context: ssl.SSLContext | None = None):
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = (ssl_context or ssl.create_default_context()) if url.scheme == "https" else None
        self.prefix = url.path.rstrip("/")
        default_port = self.port == (443 if url.scheme == "https" else 80)
        host = self.host if default_port else f"{self.host}:{self.port}"
        if ":" in self.host and not self.host.startswith("["):
            host = f"[{self.host}]" + ("" if default_port else f":{self.port}")
        lines = [f"Host: {host}", "Connection: keep-alive"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items() if name.lower() not in ("host",)]
        self._head_lines = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._idle: deque[_Answer] = deque()

    async def _connection(self) -> _Answer:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and conn.keep_alive:
                return conn
            conn.transport.close()
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Answer, self.host, self.port, ssl=self.ssl)
        except OSError as exc:
            raise HTTPError(f"cannot connect to {self.host}:{self.port}: {type(exc).__name__}: {exc}") from None
        return conn

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST `body` (JSON) to `path`; (status, answer body)."""
        request = b"".join(
            (
                f"POST {self.prefix}{path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n".encode("latin-1"),
                self._head_lines,
                b"\r\n",
                body,
            )
        )
        conn = await self._connection()
        try:
            status, answer = await conn.send(request)
        except BaseException:
            conn.transport.close()  # cancelled mid-answer: the connection's state is unknown
            raise
        if conn.keep_alive and not conn.closed:
            self._idle.append(conn)
        else:
            conn.transport.close()
        return status, answer

    def close(self) -> None:
        while self._idle:
            self._idle.pop().transport.close()
