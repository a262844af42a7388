"""The translation server (`vanilla-transformer serve`) over real HTTP on 127.0.0.1: LibreTranslate's API and
the native one, the limits and error codes, API keys, fair batching across requests (a paragraph's
sentences shared out with other requests'), a full queue, clients that go away, graceful shutdown on
SIGTERM, and the curl examples of docs/serve.md. Every error answer a test meets, here and in the other
server tests that import `every_error_has_one_shape`, must be {"error": "..."}.

Every translation the server gives is checked against the same text translated alone by the library
(`Translator.translate_n_best`), with a small model trained to reverse sequences of words, so that answers
mixed up between requests would show.
"""

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import forked_processes
import pytest
import torch
from conftest import REPO_ROOT, free_port
from test_export import train_reverse_model

pytest.importorskip("fastapi", reason="not installed (pip install -e '.[serve]')")
httpx = pytest.importorskip("httpx", reason="not installed (pip install -e '.[test]')")
pytest.importorskip("uvicorn", reason="not installed (pip install -e '.[serve]')")

from hf_vanilla_transformer import serving  # noqa: E402
from hf_vanilla_transformer.commands import main  # noqa: E402
from hf_vanilla_transformer.inference.translator import Translator, load_translator  # noqa: E402
from hf_vanilla_transformer.serving import (  # noqa: E402
    ApiKeys,
    Refusal,
    RequestRate,
    ServerSettings,
    Timeouts,
    create_app,
    server_for,
)

KEY = "test-key-1"
SENTENCES = ["w1 w2 w3", "w4 w5 w6 w7", "w8 w9", "w10 w11 w12 w13 w14", "w15 w0 w3", "w2 w2 w7 w9", "w6"]


# Every error answer the tests see, checked as it leaves an in-process server or reaches a test's client:
# those that are not {"error": "..."} are listed here, and fail the test that got them.
ERROR_SHAPE_VIOLATIONS: list[str] = []


def check_error_shape(status: int, body: bytes, where: str) -> None:
    """Note an answer of `status` 400 or more whose `body` is not a JSON object with a non-empty "error"
    text (499 is left out: it answers a client that has gone, and reaches nobody)."""
    if status < 400 or status == 499:
        return
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not (isinstance(data, dict) and isinstance(data.get("error"), str) and data["error"]):
        ERROR_SHAPE_VIOLATIONS.append(f"{where}: {status} {body[:200]!r}")


@pytest.fixture(autouse=True)
def every_error_has_one_shape() -> Iterator[None]:
    ERROR_SHAPE_VIOLATIONS.clear()
    yield
    assert not ERROR_SHAPE_VIOLATIONS, ERROR_SHAPE_VIOLATIONS


class RecordingApp:
    """An ASGI app around the server's, which checks the shape of every error answer it sends."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] == "HEAD":  # an answer to HEAD has no body
            await self.app(scope, receive, send)
            return
        status, chunks = 0, []

        async def recording(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    check_error_shape(status, b"".join(chunks), f"{scope['method']} {scope['path']}")
            await send(message)

        await self.app(scope, receive, recording)


# Named apart from the fixtures they define, so that the other server tests import them without their
# test functions' arguments shadowing the import.
@pytest.fixture(scope="module", name="model_dir")
def model_dir_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model trained to reverse sequences of the words w0-w15, with the paper's beam search (4)."""
    return train_reverse_model(tmp_path_factory.mktemp("serve-model"), "paper")


@pytest.fixture(scope="module", name="translator")
def translator_fixture(model_dir: Path) -> Translator:
    return load_translator(model_dir)


def alone(translator: Translator, text: str, n_best: int = 1, **options) -> list:
    """The hypotheses of `text` translated by itself, with the library."""
    return translator.translate_n_best([text], n_best=n_best, progress=False, **options)[0].hypotheses


def wait_until_up(url: str, process: subprocess.Popen | None = None, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the server exited: {process.stderr.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not come up")


def start_command(model_dir: Path, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`vanilla-transformer serve --model MODEL ARGS` on a free port of 127.0.0.1 (in the environment
    `env`), once it answers."""
    port = free_port()
    command = [sys.executable, "-m", "hf_vanilla_transformer", "serve", "--model", str(model_dir)]
    command += ["--source-lang", "en", "--target-lang", "de", "--port", str(port), *args]
    process = forked_processes.popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    url = f"http://127.0.0.1:{port}"
    wait_until_up(url, process)
    return process, url


@contextmanager
def command_in_process(model_dir: Path, *args: str) -> Iterator[str]:
    """`vanilla-transformer serve --model MODEL ARGS` through `main`, in a thread of this process, on a free
    port of 127.0.0.1: its URL once it answers. The server the command builds is stopped afterwards. For
    what the command serves, not how its process starts and stops (`start_command`)."""
    servers, server_for = [], serving.server_for

    def recorded(*server_args, **server_kwargs):
        servers.append(server_for(*server_args, **server_kwargs))
        return servers[-1]

    url = f"http://127.0.0.1:{free_port()}"
    argv = ["serve", "--model", str(model_dir), "--source-lang", "en", "--target-lang", "de"]
    argv += ["--port", url.rsplit(":", 1)[1], "--log-level", "warning", *args]
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            main(argv)
        except BaseException as failure:  # SystemExit too: a refusal, which the test reports
            failures.append(failure)

    thread = threading.Thread(target=serve, daemon=True)
    try:
        with pytest.MonkeyPatch.context() as patch:  # until the command has built its server
            patch.setattr(serving, "server_for", recorded)
            thread.start()
            deadline = time.monotonic() + 120
            while not servers or not servers[-1].started:
                assert thread.is_alive() and time.monotonic() < deadline, (
                    f"the command did not serve: {failures}"
                )
                time.sleep(0.05)
        wait_until_up(url)
        yield url
    finally:
        for server in servers:
            server.should_exit = True
        thread.join(60)
        assert not thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The command's server with API keys and small limits; its URL."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"# the test's keys\n{KEY}\n\nanother-key\n", encoding="utf-8")
    limits = ["--char-limit", "200", "--batch-limit", "4"]
    with command_in_process(model_dir, "--api-keys", str(keys), *limits) as url:
        yield url


def post(
    url: str,
    path: str,
    body: dict | str | bytes,
    key: str | None = KEY,
    headers: dict | None = None,
    **kwargs,
) -> httpx.Response:
    headers = {**({"X-API-Key": key} if key else {}), **(headers or {})}
    if isinstance(body, dict):
        response = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60, **kwargs)
    else:
        response = httpx.post(f"{url}{path}", content=body, headers=headers, timeout=60, **kwargs)
    check_error_shape(response.status_code, response.content, f"POST {path}")
    return response


class GatedTranslator(Translator):
    """A translator whose batches wait for `gate` to open: a batch that takes as long as a test needs. It
    records each batch's segments in `batches`."""

    gate: threading.Event
    started: threading.Event
    batches: list[list[str]]

    def translate_n_best(self, sentences, **options):
        self.batches.append(list(sentences))
        self.started.set()
        self.gate.wait(60)
        return super().translate_n_best(sentences, **options)


class InProcessServer:
    """`create_app` served as the command serves it (`server_for`, with `timeouts` and `server_options`) in a
    thread of this process, on a free port of 127.0.0.1, every error answer's shape checked."""

    def __init__(
        self,
        translator: Translator,
        settings: ServerSettings,
        timeouts: Timeouts | None = None,
        server_options: dict | None = None,
    ):
        self.translator = GatedTranslator(
            translator.model, translator.tokenizer, translator.target_tokenizer, translator.engine
        )
        self.translator.gate, self.translator.started = threading.Event(), threading.Event()
        self.translator.batches = []
        self.translator.gate.set()
        self.app = create_app(self.translator, settings)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = server_for(
            RecordingApp(self.app),
            port=port,
            timeouts=timeouts,
            max_head_bytes=settings.limits.max_body_bytes,
            log_level="warning",
            **(server_options or {}),
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "InProcessServer":
        self.thread.start()
        wait_until_up(self.url)
        return self

    def __exit__(self, *exc) -> None:
        self.translator.gate.set()
        self.server.should_exit = True
        self.thread.join(60)

    def close_gate(self) -> None:
        self.translator.started.clear()
        self.translator.gate.clear()

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/v1/stats", timeout=10).json()


def in_process(
    translator: Translator, timeouts: Timeouts | None = None, server_options: dict | None = None, **settings
) -> InProcessServer:
    return InProcessServer(translator, ServerSettings("en", "de", **settings), timeouts, server_options)


def wait_for(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# LibreTranslate's API


def test_libretranslate_api_translates_one_text_and_a_list(server: str, translator: Translator) -> None:
    response = post(server, "/translate", {"q": "w1 w2 w3", "source": "en", "target": "de"})
    assert response.status_code == 200
    assert response.json() == {"translatedText": alone(translator, "w1 w2 w3")[0].text, "alternatives": []}
    response = post(server, "/translate", {"q": SENTENCES[:3], "source": "auto", "target": "de"})
    assert response.json()["translatedText"] == [alone(translator, text)[0].text for text in SENTENCES[:3]]


def test_libretranslate_alternatives_are_the_beams_next_best(server: str, translator: Translator) -> None:
    response = post(
        server, "/translate", {"q": "w4 w5 w6 w7", "source": "en", "target": "de", "alternatives": 3}
    )
    hypotheses = alone(translator, "w4 w5 w6 w7", n_best=4)
    assert response.json() == {
        "translatedText": hypotheses[0].text,
        "alternatives": [h.text for h in hypotheses[1:]],
    }


def test_libretranslate_translates_each_line_sentence_by_sentence_as_argos_translate_does(
    server: str, translator: Translator
) -> None:
    """LibreTranslate's engine translates each line of a text, and each sentence of a line, by itself; its
    k-th alternative joins every sentence's k-th next best."""
    paragraph = "w1 w2 w3. w4 w5.\n\nw6 w7"
    body = {"q": [paragraph, "w8 w9"], "source": "en", "target": "de", "alternatives": 2}
    answer = post(server, "/translate", body).json()
    first, second, third = (alone(translator, text, n_best=3) for text in ("w1 w2 w3.", "w4 w5.", "w6 w7"))
    ranked = [f"{first[k].text} {second[k].text}\n\n{third[k].text}" for k in range(3)]
    assert answer["translatedText"][0] == ranked[0] and answer["alternatives"][0] == ranked[1:]
    assert answer["translatedText"][0] != alone(translator, paragraph)[0].text
    single = alone(translator, "w8 w9", n_best=3)
    assert answer["translatedText"][1] == single[0].text
    assert answer["alternatives"][1] == [hypothesis.text for hypothesis in single[1:]]


def test_libretranslate_form_fields_and_api_key_field(server: str, translator: Translator) -> None:
    """LibreTranslate's own Python client posts form fields, with the key as the api_key field."""
    form = {"q": "w8 w9", "source": "en", "target": "de", "api_key": KEY}
    response = httpx.post(f"{server}/translate", data=form, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == alone(translator, "w8 w9")[0].text


def test_languages_and_health(server: str) -> None:
    languages = httpx.get(f"{server}/languages", timeout=10).json()
    assert {"code": "en", "name": "en", "targets": ["de"]} in languages
    assert httpx.get(f"{server}/health", timeout=10).json()["status"] == "ok"
    docs = httpx.get(f"{server}/openapi.json", timeout=10).json()
    assert {"/translate", "/v1/translate", "/health", "/languages"} <= set(docs["paths"])
    assert httpx.get(f"{server}/docs", timeout=10).status_code == 200


# The native API


def test_native_api_gives_scores_alignments_and_attention(server: str, translator: Translator) -> None:
    body = {"q": ["w1 w2 w3", ""], "n_best": 2, "alignments": True, "attention": True}
    results = post(server, "/v1/translate", body).json()["results"]
    expected = alone(translator, "w1 w2 w3", n_best=2, alignments=True)
    shown = results[0]["translations"]
    assert [h["text"] for h in shown] == [h.text for h in expected]
    assert [h["alignment"] for h in shown] == [h.alignment for h in expected]
    assert shown[0]["score"] == pytest.approx(expected[0].score, abs=1e-4)
    assert shown[0]["log_prob"] == pytest.approx(expected[0].log_prob, abs=1e-4)
    attention = shown[0]["attention"]
    assert attention["source_words"] == ["w1", "w2", "w3"]
    assert len(attention["weights"]) == len(attention["target_words"]) == len(expected[0].text.split())
    assert all(sum(row) == pytest.approx(1, abs=1e-4) for row in attention["weights"])
    assert results[1]["translations"][0]["text"] == ""


def test_native_api_splits_sentences(server: str, translator: Translator) -> None:
    text = "w1 w2 w3. w4 w5."
    body = {"q": text, "split_sentences": True}
    shown = post(server, "/v1/translate", body).json()["results"][0]["translations"]
    expected = translator.translate_n_best([text], split_sentences=True, progress=False)[0]
    assert [h["text"] for h in shown] == [expected.text]
    assert shown[0]["text"] != alone(translator, text)[0].text  # each sentence by itself, then joined


# Texts with nothing to translate: zero-width characters (space, non-joiner, joiner, word joiner, byte-order
# mark), control characters and NUL bytes, a soft hyphen, alone or mixed with white space.
NOTHING_TO_TRANSLATE = [
    "\u200b", "\u200c\u200d", "\ufeff", "\u2060", "\x00", "\x00\x00\x01", " \u200b \u00ad\t", "\x7f\x1b",
]  # fmt: skip


def test_a_text_with_nothing_to_translate_gets_an_empty_translation_as_white_space_does(
    translator: Translator,
) -> None:
    texts = ["   ", *NOTHING_TO_TRANSLATE]
    for text in texts:
        assert alone(translator, text)[0].text == ""  # the library's rule
    with in_process(translator) as server:
        answer = post(server.url, "/translate", {"q": texts, "source": "en", "target": "de"})
        assert answer.json()["translatedText"] == [""] * len(texts)
        for split in (False, True):
            body = {"q": texts, "split_sentences": split}
            results = post(server.url, "/v1/translate", body).json()["results"]
            assert [result["translations"][0]["text"] for result in results] == [""] * len(texts)
        # A text with words among zero-width characters is translated as its words are.
        answer = post(server.url, "/translate", {"q": "w1\u200b w2\x00", "source": "en", "target": "de"})
        assert answer.json()["translatedText"] == alone(translator, "w1\u200b w2\x00")[0].text != ""
        refused = post(server.url, "/detect", {"q": "\u200b\x00"})
        assert refused.status_code == 400 and "no text" in refused.json()["error"]


def test_head_is_answered_wherever_get_is(translator: Translator) -> None:
    with in_process(translator) as server:
        schema = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
        paths = [path for path, methods in schema["paths"].items() if "get" in methods and "{" not in path]
        paths += ["/", "/docs", "/openapi.json", "/static/index.html", "/download_file/none", "/translate"]
        assert {"/health", "/languages", "/v1/info"} <= set(paths)
        for path in paths:
            got = httpx.get(f"{server.url}{path}", timeout=10)
            head = httpx.head(f"{server.url}{path}", timeout=10)
            assert head.status_code == got.status_code != 405 or path == "/translate", path
            assert head.headers.get("content-type") == got.headers.get("content-type"), path
            assert head.headers.get("content-length") == got.headers.get("content-length"), path
            assert head.content == b"", path
        assert httpx.head(f"{server.url}/translate", timeout=10).headers["allow"] == "POST"


# Limits and errors


@pytest.mark.parametrize(
    ("body", "status", "limit", "value"),
    [
        ({"q": ["w1"] * 5, "source": "en", "target": "de"}, 413, "max_segments", 4),
        ({"q": "w1 " * 70, "source": "en", "target": "de"}, 413, "max_characters", 200),
        ({"q": "w1", "source": "en", "target": "de", "alternatives": 4}, 400, "max_alternatives", 3),
        ({"q": "w1", "source": "en", "target": "de", "alternatives": 10**30}, 400, "max_alternatives", 3),
    ],
)
def test_requests_over_a_limit_name_it(server: str, body: dict, status: int, limit: str, value: int) -> None:
    response = post(server, "/translate", body)
    assert response.status_code == status
    assert response.json()["limit"] == limit and response.json()["value"] == value
    assert str(value) in response.json()["error"]


def test_a_body_over_the_size_limit_is_refused_before_it_is_read(server: str) -> None:
    response = post(server, "/v1/translate", b'{"q": "' + b"w" * 10**6 + b'"}')
    assert response.status_code == 413
    assert response.json()["limit"] == "max_body_bytes"


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        b"\xff\xfe",
        b"[" * 5000,  # nested deeper than the JSON parser goes
        b'{"q": 5}',
        b'{"q": ["w1", 2]}',
        b'{"q": "w1", "n_best": "two"}',
        b'{"q": "w1", "n_best": 0}',
        b'{"q": "w1", "n_best": 1.5}',
        b'{"q": "\\ud800"}',
        b'{"n_best": 1}',
        b'{"q": "w1", "model": "/etc/passwd"}',
        b'{"q": "w1", "model_path": "../../runs"}',
    ],
)
def test_invalid_json_and_wrong_types_are_422_with_a_json_error(server: str, body: bytes) -> None:
    response = post(server, "/v1/translate", body)
    assert response.status_code == 422
    assert response.json()["error"]


# Lone surrogates, which JSON's \\u escapes can carry, wherever a text goes: (endpoint, body, the field the
# error names).
NOT_TEXT = [
    ("/translate", b'{"q": "w1", "source": "\\ud800", "target": "de"}', "source"),
    ("/translate", b'{"q": "w1", "source": "en", "target": "\\udfff"}', "target"),
    ("/translate", b'{"q": ["w1", "w2\\ud83d"], "source": "en", "target": "de"}', "q[1]"),
    ("/translate", b'{"q": "w1", "source": "en", "target": "de", "format": "\\ud800"}', "format"),
    ("/translate", b'{"q": "w1", "source": "en", "target": "de", "alternatives": "\\ud800"}', "alternatives"),
    ("/translate", b'{"q": "w1", "source": "en", "target": "de", "x": {"y": ["\\ud800"]}}', "x.y[0]"),
    (
        "/translate",
        b'{"q": "w1", "source": "en", "target": "de", "\\ud800": 1}',
        "a field name in the request",
    ),
    ("/v1/translate", b'{"q": "w1", "source": "\\ud800"}', "source"),
    ("/v1/translate", b'{"q": "\\udc00w1"}', "q"),
    ("/detect", b'{"q": "\\ud800"}', "q"),
    ("/translate_file", b'{"source": "en", "target": "\\ud800"}', "target"),
]


@pytest.mark.parametrize("path, body, name", NOT_TEXT)
def test_a_lone_surrogate_in_any_field_is_422_naming_the_field(
    server: str, path: str, body: bytes, name: str
) -> None:
    response = post(server, path, body)
    assert response.status_code == 422, response.text
    assert f"{name} is not valid text" in response.json()["error"]


def test_a_lone_surrogate_in_the_api_key_field_is_422_not_a_wrong_key(server: str) -> None:
    body = b'{"q": "w1", "source": "en", "target": "de", "api_key": "\\ud800"}'
    response = post(server, "/translate", body, key=None)
    assert response.status_code == 422 and "api_key is not valid text" in response.json()["error"]


def test_a_file_or_a_query_string_that_is_not_utf8_is_refused(server: str) -> None:
    # A surrogate's UTF-8 bytes (ED A0 80) are not UTF-8 text, in a file as in a URL.
    files = {"file": ("notes.txt", b"w1 w2\n\xed\xa0\x80\n")}
    fields = {"source": "en", "target": "de"}
    response = httpx.post(
        f"{server}/translate_file", data=fields, files=files, headers={"X-API-Key": KEY}, timeout=60
    )
    check_error_shape(response.status_code, response.content, "POST /translate_file")
    assert response.status_code == 400 and "line 2: not valid UTF-8" in response.json()["error"]
    response = post(server, "/translate?q=w1&source=%ED%A0%80&target=de", b"")
    assert response.status_code == 422


def test_libretranslate_ignores_fields_it_does_not_know_and_no_field_names_a_file(
    server: str, translator: Translator
) -> None:
    body = {"q": "w8 w9", "source": "en", "target": "de", "model": "/etc/passwd", "path": "/"}
    assert post(server, "/translate", body).json()["translatedText"] == alone(translator, "w8 w9")[0].text
    paths = httpx.get(f"{server}/openapi.json", timeout=10).json()["paths"]
    schemas = [
        schema
        for route in ("/translate", "/v1/translate")
        for content in paths[route]["post"]["requestBody"]["content"].values()
        for schema in content["schema"].get("anyOf", [content["schema"]])  # the native API's: two shapes
    ]
    fields = {field for schema in schemas for field in schema["properties"]}
    assert fields == {"q", "source", "target", "format", "alternatives", "api_key", "n_best", "alignments",
                      "attention", "split_sentences"}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"q": "w1", "source": "fr", "target": "de"}, "translates en to de"),
        ({"q": "w1", "source": "en", "target": "en"}, "translates en to de"),
        ({"q": "w1", "source": "en", "target": "de", "format": "html"}, "format"),
    ],
)
def test_a_language_pair_or_format_the_server_lacks_is_refused(server: str, body: dict, message: str) -> None:
    response = post(server, "/translate", body)
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_split_sentences_with_several_hypotheses_is_400(server: str) -> None:
    response = post(server, "/v1/translate", {"q": "w1. w2.", "n_best": 2, "split_sentences": True})
    assert response.status_code == 400 and "n_best 1" in response.json()["error"]


def test_api_keys_401_when_missing_403_when_wrong(server: str) -> None:
    body = {"q": "w1", "source": "en", "target": "de"}
    assert post(server, "/translate", body, key=None).status_code == 401
    assert post(server, "/translate", body, key="wrong").status_code == 403
    assert post(server, "/translate", {**body, "api_key": "wrong"}, key=None).status_code == 403
    bearer = {"Authorization": "Bearer another-key"}
    assert httpx.post(f"{server}/translate", json=body, headers=bearer, timeout=60).status_code == 200
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200  # no key needed to ask if it runs


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refused_after(rate: RequestRate, client: str) -> int | None:
    """The Retry-After of `rate` refusing a request of `client`, or None if it counts the request."""
    try:
        rate.check(client)
    except Refusal as refusal:
        assert refusal.status == 429 and refusal.limit == "req_limit" and refusal.value == rate.per_minute
        return refusal.retry_after
    return None


# Requests a minute: the whole seconds until a token is back after a full bucket is spent, 60/N rounded up.
RETRY_AFTER = {1: 60, 3: 20, 7: 9, 60: 1, 1000: 1}


@pytest.mark.parametrize("per_minute", RETRY_AFTER)
def test_a_request_rate_lets_a_full_bucket_through_at_once_then_one_every_60_over_n_seconds(
    per_minute: int,
) -> None:
    clock = Clock()
    rate = RequestRate(per_minute, clock=clock)
    assert [refused_after(rate, "a") for _ in range(per_minute)] == [None] * per_minute
    assert refused_after(rate, "a") == RETRY_AFTER[per_minute]
    assert refused_after(rate, "b") is None  # each client has its own bucket
    interval = 60 / per_minute
    clock.now += interval * 0.99
    assert refused_after(rate, "a") is not None
    clock.now += interval * 0.01
    assert refused_after(rate, "a") is None and refused_after(rate, "a") is not None
    clock.now += 3600  # an idle hour refills the bucket, and no more than the bucket
    answers = [refused_after(rate, "a") for _ in range(per_minute + 1)]
    assert answers[:-1] == [None] * per_minute and answers[-1] == RETRY_AFTER[per_minute]


def test_a_request_rate_forgets_the_clients_whose_buckets_are_full_again() -> None:
    clock = Clock()
    rate = RequestRate(2, clock=clock)
    for client in range(RequestRate.FORGET_ABOVE):
        rate.check(f"old {client}")
    clock.now += 30  # their buckets are full again
    rate.check("new 1")
    rate.check("new 2")
    assert rate.clients == 2
    assert refused_after(rate, "new 1") is None and refused_after(rate, "new 1") is not None


def test_a_request_rate_of_less_than_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RequestRate(0)


def test_a_client_over_its_request_rate_is_answered_429_with_retry_after(translator: Translator) -> None:
    body = {"q": "w1 w2", "source": "en", "target": "de"}
    with in_process(translator, requests_per_minute=2) as server:
        assert [post(server.url, "/translate", body).status_code for _ in range(2)] == [200, 200]
        refused = post(server.url, "/v1/translate", body)
        assert refused.status_code == 429 and refused.json()["limit"] == "req_limit"
        assert refused.json()["value"] == 2 and 1 <= int(refused.headers["Retry-After"]) <= 30
        assert post(server.url, "/detect", {"q": "w1"}).status_code == 429  # detection counts too
        assert httpx.get(f"{server.url}/languages", timeout=10).status_code == 200  # reading is free
        # Another address of this machine is another client.
        other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=60)
        with other:
            answer = other.post(f"{server.url}/translate", json=body)
        assert (
            answer.status_code == 200
            and answer.json()["translatedText"] == alone(translator, "w1 w2")[0].text
        )
        info = httpx.get(f"{server.url}/v1/info", timeout=10).json()
        assert info["limits"]["requests_per_minute"] == 2


def test_with_api_keys_each_key_has_its_own_request_rate(translator: Translator) -> None:
    body = {"q": "w1", "source": "en", "target": "de"}
    with in_process(
        translator, api_keys=ApiKeys(frozenset({"key-a", "key-b"})), requests_per_minute=1
    ) as server:
        assert post(server.url, "/translate", body, key="key-a").status_code == 200
        assert post(server.url, "/translate", body, key="key-a").status_code == 429
        assert post(server.url, "/translate", body, key="key-b").status_code == 200
        # A guess at a key spends one of its address's requests: the second guess is refused unheard.
        assert post(server.url, "/translate", body, key="made-up").status_code == 403
        assert post(server.url, "/translate", body, key="made-up-2").status_code == 429
        assert post(server.url, "/translate", body, key=None).status_code == 429
        assert post(server.url, "/translate", body, key="key-b").status_code == 429  # its own bucket is spent


def test_without_api_keys_a_made_up_key_gives_no_fresh_requests(translator: Translator) -> None:
    body = {"q": "w1", "source": "en", "target": "de"}
    with in_process(translator, requests_per_minute=1) as server:
        assert post(server.url, "/translate", body, key="first").status_code == 200
        assert post(server.url, "/translate", body, key="second").status_code == 429


def test_x_forwarded_for_is_ignored_unless_the_proxy_is_trusted(translator: Translator) -> None:
    """Without trusted proxies every request from this machine is this machine's, whatever X-Forwarded-For
    says; with 127.0.0.1 trusted, each forwarded address has a bucket of its own."""
    body = {"q": "w1", "source": "en", "target": "de"}

    def statuses(server: InProcessServer, addresses: list[str]) -> list[int]:
        forwarded = [{"X-Forwarded-For": address} for address in addresses]
        return [post(server.url, "/translate", body, headers=each).status_code for each in forwarded]

    others = [f"203.0.113.{number}" for number in range(6)]
    with in_process(translator, requests_per_minute=3) as server:
        assert statuses(server, others) == [200] * 3 + [429] * 3
    trusted = {"forwarded_allow_ips": "127.0.0.1"}
    with in_process(translator, server_options=trusted, requests_per_minute=3) as server:
        assert statuses(server, others) == [200] * 6
        assert statuses(server, ["198.51.100.7"] * 4) == [200] * 3 + [429]
        # The proxy adds the address it saw last: one a client writes before it is not taken.
        assert statuses(server, ["198.51.100.8, 198.51.100.7"]) == [429]


def test_the_server_listens_on_loopback_only_by_default(model_dir: Path) -> None:
    from hf_vanilla_transformer.commands import serve

    assert serve.build_parser().parse_args(["--model", str(model_dir)]).host == "127.0.0.1"


def test_command_refusals_are_one_line(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through `main`, as `vanilla-transformer serve` runs it; the tests that start the server run the
    command in a process of its own, and test_commands.py checks the console script's exit status 2."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        free = str(free_port())
        cases = [
            (["--model", str(model_dir), "--port", str(port)], "in use"),
            (["--model", str(model_dir), "--port", free], "--source-lang and --target-lang"),
            (
                ["--model", str(model_dir), "--port", free, "--api-keys", str(tmp_path / "none.txt")],
                "none.txt",
            ),
            (["--model", str(model_dir), "--port", free, "--proxy-headers"], "go together"),
            (
                ["--model", str(model_dir), "--port", free, "--forwarded-allow-ips", "127.0.0.1"],
                "go together",
            ),
            (
                [
                    "--model",
                    str(model_dir),
                    "--port",
                    free,
                    "--proxy-headers",
                    "--forwarded-allow-ips",
                    "a.b",
                ],
                "'a.b' is not an IP address",
            ),
            (
                [
                    *["--model", str(model_dir), "--port", free, "--source-lang", "en"],
                    *["--target-lang", "de", "--max-segment-tokens", "1"],
                ],
                "max_segment_tokens 1: a piece needs room for a token and the end token",
            ),
        ]
        for args, message in cases:
            with pytest.raises(SystemExit) as exited:
                main(["serve", *args])
            output = capsys.readouterr()
            assert exited.value.code == 2, output.err
            assert output.err.count("\n") == 1 and message in output.err and not output.out, output


# Batching across requests


def test_concurrent_requests_are_batched_together_and_each_gets_its_own_answer(
    translator: Translator,
) -> None:
    with in_process(translator, scheduler="batch", max_wait_ms=50) as server:
        server.close_gate()
        with ThreadPoolExecutor(len(SENTENCES) + 1) as pool:
            first = pool.submit(post, server.url, "/translate", {"q": "w0", "source": "en", "target": "de"})
            assert server.translator.started.wait(30)  # a batch decodes (held at the gate) ...
            answers = [  # ... while these arrive, and wait for the next batch
                pool.submit(post, server.url, "/translate", {"q": text, "source": "en", "target": "de"})
                for text in SENTENCES
            ]
            wait_for(lambda: httpx.get(f"{server.url}/health").json()["queued"] == len(SENTENCES))
            server.translator.gate.set()
            texts = [answer.result().json()["translatedText"] for answer in answers]
        assert first.result().json()["translatedText"] == alone(translator, "w0")[0].text
        assert texts == [alone(translator, text)[0].text for text in SENTENCES]
        stats = server.stats()
        assert stats["max_requests_in_batch"] == len(SENTENCES)
        assert [batch["requests"] for batch in stats["recent_batches"]] == [1, len(SENTENCES)]


@pytest.mark.parametrize("scheduler", ["batch", "iteration"])
def test_an_answer_goes_out_once_the_work_that_made_it_is_counted(
    translator: Translator, monkeypatch: pytest.MonkeyPatch, scheduler: str
) -> None:
    """A client that reads /v1/stats after its answer finds the batch (or decoding step) that made the
    answer counted: each scheduler records its work before it delivers what the work made."""
    import asyncio

    from hf_vanilla_transformer.serving import batcher as batcher_module
    from hf_vanilla_transformer.serving.app import scheduler_for
    from hf_vanilla_transformer.serving.batcher import Options

    chosen = scheduler_for(translator, ServerSettings("en", "de", scheduler=scheduler))
    counted_when_delivered = []
    deliver = batcher_module.deliver

    def counting_deliver(job, result=None, error=None) -> None:
        counted_when_delivered.append(chosen.stats_dict()["segments"])
        deliver(job, result=result, error=error)

    monkeypatch.setattr(batcher_module, "deliver", counting_deliver)

    texts = ["w1 w2 w3", "w4 w5"]

    async def ask() -> list:
        return await chosen.submit(texts, [4, 3], Options()).future

    chosen.start()
    try:
        translations = asyncio.run(asyncio.wait_for(ask(), 60))
    finally:
        chosen.close()
    assert [t.text for t in translations] == [alone(translator, text)[0].text for text in texts]
    assert counted_when_delivered == [2]


def test_a_batch_mixing_alternatives_and_alignments_slices_each_answer(translator: Translator) -> None:
    """One batch decodes with the most hypotheses any request asks for; each gets what it asked for."""
    requests = [
        {"q": "w1 w2 w3", "n_best": 1},
        {"q": "w1 w2 w3", "n_best": 3, "alignments": True},
        {"q": ["w4 w5", "w6 w7 w8"], "n_best": 2},
    ]
    with in_process(translator, scheduler="batch", max_wait_ms=50) as server:
        server.close_gate()
        with ThreadPoolExecutor(4) as pool:
            first = pool.submit(post, server.url, "/v1/translate", {"q": "w0"})
            assert server.translator.started.wait(30)
            answers = [pool.submit(post, server.url, "/v1/translate", body) for body in requests]
            wait_for(lambda: httpx.get(f"{server.url}/health").json()["queued"] == len(requests))
            server.translator.gate.set()
            results = [answer.result().json()["results"] for answer in answers]
            first.result()
        assert server.stats()["max_requests_in_batch"] == len(requests)
    for body, result in zip(requests, results):
        texts = [body["q"]] if isinstance(body["q"], str) else body["q"]
        for text, shown in zip(texts, result, strict=True):
            expected = alone(translator, text, n_best=body["n_best"], alignments=True)
            assert [h["text"] for h in shown["translations"]] == [h.text for h in expected]
            aligned = [h.get("alignment") for h in shown["translations"]]
            assert aligned == (
                [h.alignment for h in expected] if body.get("alignments") else [None] * len(expected)
            )


def test_batches_keep_to_the_token_budget(translator: Translator) -> None:
    lengths = {text: len(translator.tokenizer(text)["input_ids"]) for text in SENTENCES}
    budget = 2 * max(lengths.values())  # two of the longest
    with in_process(translator, scheduler="batch", max_wait_ms=50, max_batch_tokens=budget) as server:
        server.close_gate()
        with ThreadPoolExecutor(len(SENTENCES) + 1) as pool:
            pool.submit(post, server.url, "/translate", {"q": "w0", "source": "en", "target": "de"})
            assert server.translator.started.wait(30)
            answers = [
                pool.submit(post, server.url, "/translate", {"q": text, "source": "en", "target": "de"})
                for text in SENTENCES
            ]
            wait_for(lambda: httpx.get(f"{server.url}/health").json()["queued"] == len(SENTENCES))
            server.translator.gate.set()
            texts = [answer.result().json()["translatedText"] for answer in answers]
        assert texts == [alone(translator, text)[0].text for text in SENTENCES]
        batches = server.stats()["recent_batches"]
    assert all(batch["padded_tokens"] <= budget for batch in batches[1:])
    assert sum(batch["requests"] for batch in batches[1:]) == len(SENTENCES) and len(batches) > 2


def beside_a_long_request(server: InProcessServer, translator: Translator, body: dict) -> list[dict]:
    """Send `body` to /v1/translate and, while its first batch is held at the gate, a one-sentence request,
    which must be answered with its translation alone; the long request's translations."""
    server.close_gate()
    with ThreadPoolExecutor(2) as pool:
        long = pool.submit(post, server.url, "/v1/translate", body)
        assert server.translator.started.wait(30)  # the long request's first batch decodes, held at the gate
        short = pool.submit(post, server.url, "/translate", {"q": "w5 w6", "source": "en", "target": "de"})
        wait_for(lambda: httpx.get(f"{server.url}/health").json()["queued"] == 2)
        server.translator.gate.set()
        assert short.result().json()["translatedText"] == alone(translator, "w5 w6")[0].text
        return long.result().json()["results"][0]["translations"]


def test_a_split_paragraphs_sentences_share_batches_with_other_requests(translator: Translator) -> None:
    """A paragraph's sentences are segments of their own: batched by the token budget like any others, with
    a request that arrives meanwhile in the very next batch, answered while the paragraph goes on."""
    paragraph = " ".join(f"{text}." for text in SENTENCES * 2)
    sentences = len(SENTENCES) * 2
    longest = max(len(translator.tokenizer(f"{text}.")["input_ids"]) for text in SENTENCES)
    with in_process(translator, scheduler="batch", max_batch_tokens=3 * longest) as server:
        shown = beside_a_long_request(server, translator, {"q": paragraph, "split_sentences": True})
        expected = translator.translate_n_best([paragraph], split_sentences=True, progress=False)[0]
        assert [h["text"] for h in shown] == [expected.text]
        batches = server.stats()["recent_batches"]
    assert batches[1]["requests"] == 2  # the short request went into the batch right after the first
    assert sum(batch["segments"] for batch in batches) == sentences + 1
    assert all(1 < batch["segments"] for batch in batches[:-1])  # sentences decoded together, not one by one
    assert len(batches) < sentences


def test_a_long_segment_without_a_sentence_break_is_cut_into_bounded_work_items(
    translator: Translator,
) -> None:
    """Batch scheduling (the exported engines' only one): a text no splitter can split is cut into pieces
    of at most --max-segment-tokens, each a work item of its own, so a request that arrives meanwhile goes
    into the very next batch; the text's translation is its pieces' translations by the library, joined."""
    from hf_vanilla_transformer.inference.long_segments import join_pieces, pieces

    text = " ".join(f"w{index % 16}" for index in range(60))  # one sentence: no break to split at

    def count_tokens(piece: str) -> int:
        return len(translator.tokenizer(piece)["input_ids"])

    cut = pieces(text, count_tokens, 8)
    assert len(cut) > 7 and all(count_tokens(piece) <= 8 for piece in cut)
    with in_process(translator, scheduler="batch", max_segment_tokens=8, max_batch_tokens=16) as server:
        shown = beside_a_long_request(server, translator, {"q": text, "n_best": 2})
        batches = server.stats()["recent_batches"]
    expected = join_pieces(text, translator.translate_n_best(cut, n_best=2, progress=False))
    assert [h["text"] for h in shown] == [h.text for h in expected.hypotheses]
    assert len(shown) == 2 and shown[0]["text"] == " ".join(alone(translator, piece)[0].text for piece in cut)
    assert batches[1]["requests"] == 2  # the short request went into the batch right after the first
    assert sum(batch["segments"] for batch in batches) == len(cut) + 1


def test_requests_whose_pieces_fill_every_batch_take_turns_and_a_new_one_goes_first(
    translator: Translator,
) -> None:
    """Three long texts, each cut into pieces, two pieces a batch: each request's next piece waits for the
    others' turns, and a one-sentence request that arrives goes into the next batch with the one request
    not yet served, not behind the older two's every piece."""
    from hf_vanilla_transformer.inference.long_segments import pieces

    texts = [" ".join(f"w{(index + shift) % 16}" for index in range(40)) for shift in (1, 2, 3)]

    def count_tokens(piece: str) -> int:
        return len(translator.tokenizer(piece)["input_ids"])

    cut = [pieces(text, count_tokens, 8) for text in texts]
    with in_process(translator, scheduler="batch", max_segment_tokens=8, max_batch_tokens=16) as server:
        server.close_gate()
        with ThreadPoolExecutor(5) as pool:
            pool.submit(post, server.url, "/translate", {"q": "w0", "source": "en", "target": "de"})
            assert server.translator.started.wait(30)  # a first batch decodes, held at the gate
            longs = []
            for count, text in enumerate(texts, start=1):
                longs.append(pool.submit(post, server.url, "/v1/translate", {"q": text}))
                wait_for(lambda count=count: httpx.get(f"{server.url}/health").json()["queued"] == count)
            short = pool.submit(
                post, server.url, "/translate", {"q": "w5 w6", "source": "en", "target": "de"}
            )
            wait_for(lambda: httpx.get(f"{server.url}/health").json()["queued"] == 4)
            server.translator.gate.set()
            assert short.result().json()["translatedText"] == alone(translator, "w5 w6")[0].text
            for answer in longs:
                assert answer.result().status_code == 200
        batches = server.translator.batches
    assert batches[1] == [cut[0][0], cut[1][0]]
    assert batches[2] == [cut[2][0], "w5 w6"]  # the request not yet served, then the new one
    assert batches[3] == [cut[0][1], cut[1][1]]  # then the two served longest ago


def test_a_paragraph_whose_client_leaves_stops_at_the_next_batch(translator: Translator) -> None:
    paragraph = " ".join(f"{text}." for text in SENTENCES * 2)
    longest = max(len(translator.tokenizer(f"{text}.")["input_ids"]) for text in SENTENCES)
    with in_process(translator, scheduler="batch", max_batch_tokens=2 * longest) as server:
        server.close_gate()
        leaving = open_request(server.url, {"q": paragraph, "split_sentences": True}, "/v1/translate")
        assert server.translator.started.wait(30)
        leaving.close()
        wait_for(lambda: httpx.get(f"{server.url}/health").json()["queued"] == 0)
        server.translator.gate.set()
        # The worker drops the request's other sentences once its first batch is done.
        wait_for(lambda: server.stats()["dropped_requests"] == 1)
        stats = server.stats()
    assert stats["batches"] == 1 and stats["segments"] <= 2 < 2 * len(SENTENCES)


def test_without_batching_each_request_is_its_own_batch(translator: Translator) -> None:
    with in_process(translator, batching=False) as server:
        with ThreadPoolExecutor(4) as pool:
            bodies = [{"q": text, "source": "en", "target": "de"} for text in SENTENCES]
            texts = [
                r.json()["translatedText"]
                for r in pool.map(lambda b: post(server.url, "/translate", b), bodies)
            ]
        assert texts == [alone(translator, text)[0].text for text in SENTENCES]
        assert server.stats()["max_requests_in_batch"] == 1


def test_health_answers_during_a_long_batch_and_a_full_queue_is_503(translator: Translator) -> None:
    body = {"q": "w1 w2", "source": "en", "target": "de"}
    with in_process(translator, scheduler="batch", max_queue=2, max_wait_ms=0) as server:
        server.close_gate()
        with ThreadPoolExecutor(4) as pool:
            decoding = pool.submit(post, server.url, "/translate", body)
            assert server.translator.started.wait(30)
            health = httpx.get(f"{server.url}/health", timeout=5)
            assert health.status_code == 200 and health.json()["decoding"] == 1
            queued = [pool.submit(post, server.url, "/translate", body) for _ in range(2)]
            wait_for(lambda: httpx.get(f"{server.url}/health").json()["queued"] == 2)
            refused = post(server.url, "/translate", body)
            assert refused.status_code == 503
            assert int(refused.headers["Retry-After"]) >= 1 and "queue" in refused.json()["error"]
            server.translator.gate.set()
            expected = alone(translator, "w1 w2")[0].text
            assert [r.result().json()["translatedText"] for r in [decoding, *queued]] == [expected] * 3
        assert post(server.url, "/translate", body).status_code == 200  # the queue drained


def open_request(url: str, body: dict, path: str = "/translate") -> socket.socket:
    """A request sent on a raw connection whose answer is never read: close it to hang up."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    connection = socket.create_connection((host, int(port)))
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    connection.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return connection


def test_clients_that_go_away_cost_the_others_nothing(translator: Translator) -> None:
    def body(text: str) -> dict:
        return {"q": text, "source": "en", "target": "de"}

    with in_process(translator, scheduler="batch", max_wait_ms=500) as server:
        server.close_gate()
        with ThreadPoolExecutor(2) as pool:
            # One batch: a request that stays and one whose client hangs up while the batch decodes.
            staying = pool.submit(post, server.url, "/translate", body("w3 w4"))
            leaving = open_request(server.url, body("w5 w6"))
            assert server.translator.started.wait(30)
            leaving.close()
            # A request whose client hangs up while it waits for the next batch is dropped unseen.
            waiting = open_request(server.url, body("w7 w8"))
            after = pool.submit(post, server.url, "/translate", body("w9 w10"))
            wait_for(lambda: httpx.get(f"{server.url}/health").json()["queued"] == 2)
            waiting.close()
            wait_for(lambda: httpx.get(f"{server.url}/health").json()["queued"] == 1)
            server.translator.gate.set()
            assert staying.result().json()["translatedText"] == alone(translator, "w3 w4")[0].text
            assert after.result().json()["translatedText"] == alone(translator, "w9 w10")[0].text
        stats = server.stats()
    assert [batch["requests"] for batch in stats["recent_batches"]] == [2, 1]
    assert stats["dropped_requests"] == 1 and stats["failed_batches"] == 0


# Graceful shutdown


def test_sigterm_answers_the_request_in_flight_then_stops(model_dir: Path, translator: Translator) -> None:
    # A batch waits 3 s for company: the request is in flight when SIGTERM comes.
    process, url = start_command(model_dir, "--scheduler", "batch", "--max-wait-ms", "3000")
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(
            post, url, "/translate", {"q": SENTENCES[1], "source": "en", "target": "de"}, None
        )
        wait_for(lambda: httpx.get(f"{url}/health").json()["queued"] == 1)
        process.send_signal(signal.SIGTERM)
        response = answer.result()
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "Application shutdown complete" in stderr
    assert response.status_code == 200
    assert response.json()["translatedText"] == alone(translator, SENTENCES[1])[0].text
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=5)


# The curl examples of docs/serve.md


def documented_curl_commands() -> list[str]:
    """The curl commands in the shell blocks of docs/serve.md, with the printf commands that write the
    files they send, in order."""
    commands, language = [], None
    for line in (REPO_ROOT / "docs" / "serve.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            language = None if language is not None else line[3:].strip() or "text"
        elif language == "bash" and line.startswith(("curl ", "printf ")):
            commands.append(line)
    return commands


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_the_documented_curl_examples_work(translator: Translator, tmp_path: Path) -> None:
    commands = documented_curl_commands()
    assert len([command for command in commands if command.startswith("curl ")]) >= 4
    with in_process(translator) as server:
        for command in commands:
            command = command.replace("http://127.0.0.1:8000", server.url)
            result = subprocess.run(
                ["bash", "-c", command],
                capture_output=True,
                text=True,
                timeout=120,
                env=os.environ,
                cwd=tmp_path,
            )
            assert result.returncode == 0, (command, result.stderr)
            if command.startswith("curl "):
                answer = json.loads(result.stdout)
                assert answer and "error" not in answer, (command, result.stdout)


# The load test


@pytest.mark.slow
def test_bench_serve_quick_loses_mixes_up_and_garbles_nothing(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shipped_onednn_sizes: None
) -> None:
    """benchmarks/bench_serve.py --quick: every answer under load, with faults mixed in, is the sentence's
    own translation; oversize requests are 413, malformed ones 422, and bursts get answers or 503s.

    The benchmark runs through its `main`, in this process (its servers in processes of their own, forked as
    the other server tests' are): its references decode with the products the servers decode with
    (`shipped_onednn_sizes`, one thread)."""
    data = tmp_path / "sentences.txt"
    data.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    output = tmp_path / "results.json"
    monkeypatch.setattr(sys, "path", list(sys.path))  # the benchmark puts its folder first
    spec = importlib.util.spec_from_file_location("bench_serve", REPO_ROOT / "benchmarks" / "bench_serve.py")
    bench_serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_serve)
    # Its own module object: the benchmark's `subprocess.Popen` is forked_processes.popen, nobody else's.
    bench_serve.subprocess = types.SimpleNamespace(Popen=forked_processes.popen, PIPE=subprocess.PIPE)
    threads = torch.get_num_threads()
    try:
        bench_serve.main(["--model", str(model_dir), "--data", str(data), "--quick", "--threads", "1",
                          "--output", str(output)])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    result = json.loads(output.read_text())
    assert result["answers"] == {"mixed_up": 0, "garbled": 0, "lost": 0, "examples": []}
    schedulers = result["schedulers"]
    assert set(schedulers) == {"iteration", "batch", "unbatched"}
    for run in [*(r for scheduler in schedulers.values() for r in scheduler["rounds"]), result["main"]]:
        assert run["correct"] == run["answered"] > 0 and run["errors"] == 0
    seen = result["faults"]["faults"]
    assert set(seen["oversize"]) == {"413"} and set(seen["malformed"]) == {"422"}
    assert set(seen["burst"]) <= {"200 correct", "503"}
    assert result["faults"]["wellformed"]["correct"] == result["faults"]["wellformed"]["answered"] > 0
    assert result["healthy_after_faults"] and schedulers["unbatched"]["mean_requests_per_batch"] == 1
    fairness = result["fairness"]
    assert fairness["paragraph_correct"] == fairness["rounds"] == 1 and fairness["short_errors"] == 0
    assert fairness["short_correct"] == fairness["short_answered"] > 0
    for scheduler in ("iteration", "batch"):
        for run in result["beside_long_texts"][scheduler]:
            assert run["short_wrong"] == run["long_wrong"] == 0 and run["short_correct"] > 0
