"""The translation server against clients that send slowly, partly or badly, over raw sockets on 127.0.0.1:
headers and bodies that do not arrive in time are answered 408, requests that cannot be parsed 400, unknown
endpoints 404 and wrong methods 405, connections beyond the cap 503, all as {"error": ...}; SIGTERM drains
the requests in flight and exits 0 whatever such clients do, and a second signal ends the process at once.
The servers run with timeouts of a second or two, so the tests stay short.
"""

import json
import os
import resource
import signal
import socket
import subprocess
import sys
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
    wait_until_up,
)

httpx = pytest.importorskip("httpx", reason="not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="not installed (pip install -e '.[serve]')")

from hf_vanilla_transformer.inference.translator import Translator  # noqa: E402
from hf_vanilla_transformer.serving import Timeouts, default_max_connections  # noqa: E402

SHORT = Timeouts(header_s=1.0, body_s=1.5, keep_alive_s=5.0, shutdown_s=10.0)
# How long a test waits for an answer before it calls the server stuck: far beyond any limit under test.
PATIENCE_S = 30


@pytest.fixture(scope="module")
def server(translator: Translator) -> Iterator[str]:
    with in_process(translator, timeouts=SHORT) as running:
        yield running.url


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained model over the words w0-w15 whose beam search may not end a translation before its
    1000th token: a text of 1000 words decodes for seconds, a translation in flight as long as a test
    needs."""
    torch = pytest.importorskip("torch")
    from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
    from hf_vanilla_transformer.conversion import tokenizer_from_fairseq_dictionary
    from hf_vanilla_transformer.vanilla_transformer.generation_vanilla_transformer import (
        paper_generation_config,
    )

    folder = tmp_path_factory.mktemp("slow-model")
    tokenizer = tokenizer_from_fairseq_dictionary(
        ["<s>", "<pad>", "</s>", "<unk>"] + [f"w{i}" for i in range(16)]
    )
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset(
        "base", vocab_size=len(tokenizer), d_model=32, N=1, h=2, d_ff=32, max_position_embeddings=512
    )
    model = VanillaTransformerForConditionalGeneration(config).eval()
    model.generation_config = paper_generation_config(config, min_new_tokens=1000)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


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


def test_a_request_framed_both_by_content_length_and_chunked_is_refused_and_its_connection_closed(
    server: str,
) -> None:
    """A translation request with both Content-Length and Transfer-Encoding: chunked, and a GET /health
    pipelined after it on the same connection (what a proxy that framed the first by Content-Length would
    pass on as a request of its own): the first is answered 400 in JSON, the connection closes, and the
    second is never answered (RFC 9112, section 6.1)."""
    body = json.dumps({"q": "w1 w2", "source": "en", "target": "de"}).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    framing = f"Content-Length: {len(chunked)}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    first = head().removesuffix(b"\r\n") + framing + chunked
    pipelined = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    connection = connect(server)
    connection.sendall(first + pipelined)
    data = b""
    while chunk := connection.recv(65536):  # until the server closes the connection
        data += chunk
    connection.close()
    assert data.count(b"HTTP/1.1 ") == 1, data
    head_lines, _, answer = data.partition(b"\r\n\r\n")
    assert head_lines.startswith(b"HTTP/1.1 400 ") and b"connection: close" in head_lines.lower()
    check_error_shape(400, answer, "POST /translate with Content-Length and Transfer-Encoding")
    assert "Transfer-Encoding" in json.loads(answer)["error"]


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


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT] * 2, ids=lambda sig: sig.name)
def test_a_second_signal_ends_the_server_at_once_while_a_long_translation_decodes(
    slow_model: Path, second: signal.Signals
) -> None:
    """SIGTERM, then SIGTERM or SIGINT again 0.3 s later, while a translation of seconds decodes: the process
    ends within seconds of the second signal with 0 (SIGTERM) or 130 (SIGINT) and one line saying so, never
    with a traceback or an abort (which a server stopped so ended with, every time). Twice a signal."""
    process, url = start_command(slow_model, "--shutdown-timeout", "60")
    try:
        with ThreadPoolExecutor(1) as pool:
            body = {"q": " ".join(["w1"] * 1000), "source": "en", "target": "de"}
            answer = pool.submit(httpx.post, f"{url}/translate", json=body, timeout=PATIENCE_S)
            wait_for(lambda: httpx.get(f"{url}/health", timeout=PATIENCE_S).json()["decoding"] == 1)
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            signalled = time.monotonic()
            process.send_signal(second)
            _, stderr = process.communicate(timeout=PATIENCE_S)
            assert time.monotonic() - signalled < 5
            assert process.returncode == (130 if second == signal.SIGINT else 0), stderr
            assert "Traceback" not in stderr and "terminate called" not in stderr, stderr
            last = stderr.splitlines()[-1]
            assert last == f"{second.name} again: stopping now, without answering the requests in flight."
            with pytest.raises(httpx.TransportError):  # cut off: nothing is left to answer it
                answer.result()
    finally:
        process.kill()


@pytest.mark.parametrize("when", ["at once", "0.2 s later", "once the server has stopped"])
def test_a_second_sigterm_at_any_moment_of_a_stop_exits_0(model_dir: Path, when: str) -> None:
    """SIGTERM with no request in flight, then SIGTERM again: at once, 0.2 s later, or once the server has
    logged that it stopped (while the process is on its way out). The process exits 0 each time, never
    killed by the signal."""
    process, _ = start_command(model_dir)
    try:
        process.send_signal(signal.SIGTERM)
        if when == "0.2 s later":
            time.sleep(0.2)
        elif when == "once the server has stopped":
            lines = []
            while (line := process.stderr.readline()) and "Finished server process" not in line:
                lines.append(line)
            assert line, "".join(lines)  # stderr ended without the line: the process exited already
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=PATIENCE_S)
        assert process.returncode == 0, stderr
        assert "Traceback" not in stderr, stderr
    finally:
        process.kill()


# Connections


def test_connections_beyond_the_cap_are_answered_503_in_json(translator: Translator) -> None:
    with in_process(translator, timeouts=SHORT, server_options={"max_connections": 3}) as running:
        connections = running.server.server_state.connections
        wait_for(lambda: not connections)  # the check that the server was up has hung up
        held = [connect(running.url) for _ in range(3)]
        wait_for(lambda: len(connections) == 3)
        for _ in range(2):  # refused, whether or not it sends its request first
            refused = connect(running.url)
            refused.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, headers, body = read_answer(refused)
            refused.close()
            assert status == 503 and headers["retry-after"] == "1" and headers["connection"] == "close"
            assert "(3)" in json.loads(body)["error"]
        # The connections held are served, and once one closes, a new one is.
        held[0].sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert read_answer(held[0])[0] == 200
        held[0].close()
        wait_for(lambda: len(connections) == 2)
        assert httpx.get(f"{running.url}/health", timeout=PATIENCE_S).status_code == 200
        for connection in held[1:]:
            connection.close()


def test_the_default_cap_on_connections_is_half_the_open_file_limit_where_memory_allows() -> None:
    """With `ulimit -n 200` (and far more memory than 100 connections need), the cap is 100; a process with
    more files is capped by a quarter of the memory at two requests' worth each."""

    def capped_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    code = "from hf_vanilla_transformer.serving import default_max_connections as d; print(d(126560))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=capped_files, timeout=300
    )
    assert result.stdout.strip() == "100", result.stderr
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert default_max_connections(memory) == 1  # a request as large as the memory: one connection
