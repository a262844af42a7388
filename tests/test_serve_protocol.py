"""The translation server against clients that send slowly, partly or badly, over raw sockets on 127.0.0.1:
headers and bodies that do not arrive in time are answered 408, requests that cannot be parsed 400, unknown
endpoints 404 and wrong methods 405, all as {"error": ...}; SIGTERM drains the requests in flight and exits
0 whatever such clients do. The servers run with timeouts of a second or two, so the tests stay short.
"""

import json
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_serve import (  # noqa: F401 (the fixtures: every_error_has_one_shape checks each test's errors)
    SENTENCES,
    alone,
    check_error_shape,
    every_error_has_one_shape,
    in_process,
    model_dir_fixture,
    post,
    start_command,
    translator_fixture,
    wait_for,
)

httpx = pytest.importorskip("httpx", reason="not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="not installed (pip install -e '.[serve]')")

from hf_vanilla_transformer.inference.translator import Translator  # noqa: E402
from hf_vanilla_transformer.serving import Timeouts  # noqa: E402

SHORT = Timeouts(header_s=1.0, body_s=1.5, keep_alive_s=5.0, shutdown_s=10.0)
# How long a test waits for an answer before it calls the server stuck: far beyond any limit under test.
PATIENCE_S = 30


@pytest.fixture(scope="module")
def server(translator: Translator) -> Iterator[str]:
    with in_process(translator, timeouts=SHORT) as running:
        yield running.url


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)), timeout=PATIENCE_S)
    return connection


def read_answer(connection: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of the answer on `connection`, read until the server closes it; its
    shape is checked where it is an error."""
    data = b""
    while chunk := connection.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    check_error_shape(status, body, lines[0])
    return status, headers, body


def closed_without_answer(connection: socket.socket) -> bool:
    return connection.recv(65536) == b""


def head(path: str = "/translate", length: int | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# Slow and half-sent requests


def test_headers_sent_slowly_are_answered_408(server: str) -> None:
    """A client that trickles its headers a byte at a time gets 408 once its time for them is up, however
    often it sends a byte."""
    connection = connect(server)
    request = head(length=10)
    sent = 0
    try:
        while sent < len(request):
            connection.sendall(request[sent : sent + 1])
            sent += 1
            time.sleep(0.1)
    except OSError:  # the server closed the connection mid-head
        pass
    assert sent < len(request)  # the head was never finished
    status, headers, body = read_answer(connection)
    assert status == 408 and "headers" in json.loads(body)["error"] and headers["connection"] == "close"


def test_a_half_sent_body_is_answered_408(server: str) -> None:
    """A request that announces 30,000 bytes and sends a few gets 408 once its time for the body is up."""
    connection = connect(server)
    connection.sendall(head(length=30_000) + b'{"q": "w1 w2", ')
    status, _, body = read_answer(connection)
    assert status == 408 and "body" in json.loads(body)["error"]


def test_a_body_trickling_to_an_endpoint_that_does_not_read_it_is_cut_off(server: str) -> None:
    connection = connect(server)
    connection.sendall(head("/no-such-endpoint", length=30_000))
    data = b""
    while chunk := connection.recv(65536):  # the 404 comes at once; the connection closes later
        data += chunk
        try:
            connection.sendall(b"x")
        except OSError:
            break
    assert data.startswith(b"HTTP/1.1 404")


def test_a_connection_that_sends_nothing_is_closed(server: str) -> None:
    assert closed_without_answer(connect(server))


def test_a_kept_alive_connection_may_send_its_next_request(server: str, translator: Translator) -> None:
    """The clocks are per request: a client that sends two requests on one connection gets both."""
    connection = connect(server)
    for text in ("w1 w2", "w3 w4"):
        body = json.dumps({"q": text, "source": "en", "target": "de"}).encode()
        connection.sendall(head(length=len(body)) + body)
        answer = b""
        while b"}" not in answer:
            answer += connection.recv(65536)
        assert (
            json.loads(answer.partition(b"\r\n\r\n")[2])["translatedText"] == alone(translator, text)[0].text
        )
    connection.close()


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nw1 w2",
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"GET /" + b"a" * 200_000 + b" HTTP/1.1\r\n\r\n",
    ],
)
def test_malformed_requests_are_400_in_json(server: str, request_bytes: bytes) -> None:
    connection = connect(server)
    try:
        connection.sendall(request_bytes)
    except OSError:  # the server answered and closed before the whole (overlong) request was sent
        pass
    status, headers, _ = read_answer(connection)
    assert status == 400 and headers["content-type"] == "application/json"


def test_unknown_endpoints_are_404_and_wrong_methods_405(server: str) -> None:
    missing = httpx.get(f"{server}/no-such-endpoint", timeout=PATIENCE_S)
    check_error_shape(missing.status_code, missing.content, "GET /no-such-endpoint")
    assert missing.status_code == 404 and "/docs" in missing.json()["error"]
    for method, path in (("GET", "/translate"), ("DELETE", "/detect"), ("POST", "/languages")):
        wrong = httpx.request(method, f"{server}{path}", timeout=PATIENCE_S)
        check_error_shape(wrong.status_code, wrong.content, f"{method} {path}")
        assert wrong.status_code == 405 and wrong.headers["allow"] in wrong.json()["error"]


def test_an_oversized_body_is_refused_at_once_and_the_connection_closed(server: str) -> None:
    connection = connect(server)
    connection.sendall(head(length=10**7) + b'{"q": "')
    status, headers, body = read_answer(connection)
    assert status == 413 and json.loads(body)["limit"] == "max_body_bytes"


# Stopping


def test_sigterm_drains_the_requests_in_flight_and_exits_0_whatever_the_clients_do(
    model_dir: Path, translator: Translator
) -> None:
    """Under SIGTERM, with a connection that sends nothing, one halfway through its headers and one
    halfway through its body: the translation in flight is answered, the half-sent body 408, and the
    process exits 0 on its own."""
    process, url = start_command(
        model_dir, "--scheduler", "batch", "--max-wait-ms", "2000", "--header-timeout", "1",
        "--body-timeout", "2", "--shutdown-timeout", "10",
    )  # fmt: skip
    idle, half_head, half_body = connect(url), connect(url), connect(url)
    half_head.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    half_body.sendall(head(length=1000) + b'{"q": ')
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(
            post, url, "/translate", {"q": SENTENCES[1], "source": "en", "target": "de"}, None
        )
        wait_for(lambda: httpx.get(f"{url}/health").json()["queued"] == 1)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=PATIENCE_S)
        response = answer.result()
    assert process.returncode == 0, stderr
    assert response.json()["translatedText"] == alone(translator, SENTENCES[1])[0].text
    assert read_answer(half_body)[0] == 408
    assert closed_without_answer(idle)
    for connection in (idle, half_head, half_body):
        connection.close()


def test_sigterm_answers_503_what_cannot_finish_in_time(translator: Translator) -> None:
    """A translation still held when the time to stop runs out is answered 503 in JSON, and the server
    stops."""
    with in_process(translator, scheduler="batch", timeouts=Timeouts(shutdown_s=1.0)) as running:
        running.close_gate()
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(
                post, running.url, "/translate", {"q": "w1 w2", "source": "en", "target": "de"}
            )
            assert running.translator.started.wait(PATIENCE_S)
            running.server.should_exit = True
            response = answer.result()
            running.translator.gate.set()
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
