"""The lean HTTP/1.1 client against raw servers answering in each shape HTTP allows."""

import asyncio

import pytest

from eagle3_datagen.generation.http import HTTPError, Server


async def raw_server(answers, *, close_after=False):
    """A TCP server that reads one request at a time and writes the next of `answers` (bytes, or
    None: close without answering), closing the connection after an answer that says so, has no
    length, or (`close_after`) always. Returns (server, the requests it read, the connections made)."""
    seen, connections = [], []
    queue = list(answers)

    async def handle(reader, writer):
        connections.append(writer)
        while queue:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            )
            seen.append(head + await reader.readexactly(length))
            answer = queue.pop(0)
            if answer is None:
                break
            writer.write(answer)
            await writer.drain()
            if (
                close_after
                or b"Connection: close" in answer
                or b"Content-Length" not in answer
                and b"chunked" not in answer
            ):
                break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen, connections


def run(answers, posts, *, prefix="", headers=None, close_after=False):
    async def main():
        server, seen, connections = await raw_server(answers, close_after=close_after)
        port = server.sockets[0].getsockname()[1]
        client = Server(f"http://127.0.0.1:{port}{prefix}", headers=headers)
        results = []
        try:
            for body in posts:
                try:
                    results.append(await client.post("/generate", body))
                except HTTPError as exc:
                    results.append(exc)
        finally:
            client.close()
            server.close()
            await server.wait_closed()
        return results, seen, connections

    return asyncio.run(main())


def ok(body: bytes, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
        + body
    )


def test_keep_alive_answers_by_length_on_one_connection_with_the_request_written_whole():
    results, seen, connections = run([ok(b'{"a":1}'), ok(b'{"b":2}')], [b'{"x":1}', b'{"y":22}'], prefix="/sglang",
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer k"})  # fmt: skip
    assert results == [(200, b'{"a":1}'), (200, b'{"b":2}')]
    assert len(connections) == 1  # kept alive
    head, body = seen[1].split(b"\r\n\r\n")
    assert head.startswith(b"POST /sglang/generate HTTP/1.1\r\n") and body == b'{"y":22}'
    assert b"Content-Length: 8" in head and b"Authorization: Bearer k" in head and b"Host: 127.0.0.1:" in head


def test_chunked_answers_with_extensions_and_trailers_and_a_provisional_100():
    chunked = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\n{"a"\r\n3\r\n:1}\r\n0\r\nX-T: 1\r\n\r\n'
    cont = b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"{}")
    results, _, connections = run([chunked, cont], [b"{}", b"{}"])
    assert results == [(200, b'{"a":1}'), (200, b"{}")] and len(connections) == 1


def test_an_answer_read_to_the_end_of_its_connection_and_error_statuses_with_their_bodies():
    to_close = b'HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n{"detail":"busy"}'
    results, _, connections = run([to_close, ok(b'{"error":"x"}').replace(b"200 OK", b"400 Bad Request")], [b"{}"] * 2)
    assert results == [(503, b'{"detail":"busy"}'), (400, b'{"error":"x"}')]
    assert len(connections) == 2  # the first was closed by its answer: a new one for the next


@pytest.mark.parametrize(
    "answer, problem",
    [
        (None, "before the answer's headers"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", "after 2 of 10 bytes"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "malformed Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "inside a chunked answer"),
    ],
)
def test_a_cut_or_malformed_answer_is_an_error_and_the_next_request_gets_a_new_connection(answer, problem):
    results, _, connections = run([answer, ok(b"{}")], [b"{}", b"{}"], close_after=True)
    assert isinstance(results[0], HTTPError) and problem in str(results[0])
    assert results[1] == (200, b"{}") and len(connections) == 2


def test_a_connection_the_server_closed_while_idle_is_not_reused():
    async def main():
        server, seen, connections = await raw_server([ok(b"1"), ok(b"2")])
        port = server.sockets[0].getsockname()[1]
        client = Server(f"http://127.0.0.1:{port}")
        first = await client.post("/generate", b"{}")
        connections[0].close()  # as uvicorn closes an idle keep-alive connection
        for _ in range(100):
            if client._idle and client._idle[0].closed:
                break
            await asyncio.sleep(0.01)
        second = await client.post("/generate", b"{}")
        client.close()
        server.close()
        return first, second, len(connections)

    assert asyncio.run(main()) == ((200, b"1"), (200, b"2"), 2)


def test_nothing_listening_and_bad_urls():
    async def main():
        return await Server("http://127.0.0.1:9").post("/generate", b"{}")

    with pytest.raises(HTTPError, match="cannot connect to 127.0.0.1:9"):
        asyncio.run(main())
    with pytest.raises(ValueError, match="not an http"):
        Server("unix:///tmp/x")
    assert Server("https://example.org/api").port == 443 and Server("http://[::1]:30000")._head_lines.startswith(
        b"Host: [::1]:30000"
    )


def test_https_with_the_servers_certificate_checked(tmp_path):
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no certificate to serve")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip

    async def main():
        served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        served.load_cert_chain(cert, key)

        async def handle(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
            writer.write(ok(b'{"tls":true}'))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=served)
        port = server.sockets[0].getsockname()[1]
        trusted = ssl.create_default_context(cafile=str(cert))
        answer = await Server(f"https://127.0.0.1:{port}", ssl_context=trusted).post("/generate", b"{}")
        with pytest.raises(HTTPError, match="SSL|certificate"):  # an untrusted certificate is refused
            await Server(f"https://127.0.0.1:{port}").post("/generate", b"{}")
        server.close()
        return answer

    assert asyncio.run(main()) == (200, b'{"tls":true}')
