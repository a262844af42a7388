"""LibreTranslate's API as its clients use it, against the translation server over real HTTP on 127.0.0.1:
LibreTranslate's documented request shapes, its Python client (libretranslatepy: form bodies, a GET with
a body) and deep-translator's LibreTranslator (the parameters in the query string), with and without API
keys; parameters from the query string, a form, a multipart form or JSON on every endpoint; `/detect`,
`/translate_file` and `/frontend/settings`; and limits counted in characters, as LibreTranslate counts
them.

Every translation is checked against the same text translated by the library (`Translator`), with the
small model of test_serve.py trained to reverse sequences of words; every language detection against
py3langid run directly.
"""

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.error import HTTPError

import pytest
from conftest import free_port
from test_serve import (  # noqa: F401 (the fixtures: every_error_has_one_shape checks each test's errors)
    KEY,
    alone,
    check_error_shape,
    command_in_process,
    every_error_has_one_shape,
    in_process,
    model_dir_fixture,
    start_command,
    translator_fixture,
)

httpx = pytest.importorskip("httpx", reason="not installed (pip install -e '.[test]')")
pytest.importorskip("fastapi", reason="not installed (pip install -e '.[serve]')")
libretranslatepy = pytest.importorskip("libretranslatepy", reason="not installed (pip install -e '.[test]')")
deep_translator = pytest.importorskip("deep_translator", reason="not installed (pip install -e '.[test]')")
py3langid = pytest.importorskip("py3langid", reason="not installed (pip install -e '.[serve]')")

from hf_vanilla_transformer.commands import main  # noqa: E402
from hf_vanilla_transformer.inference.translator import Translator  # noqa: E402
from hf_vanilla_transformer.serving import ApiKeys  # noqa: E402

PARAGRAPH = "w1 w2 w3. w4 w5 w6 w7. w8 w9."


@pytest.fixture(scope="module", params=["open", "keys"])
def server(request: pytest.FixtureRequest, translator: Translator) -> Iterator[tuple[str, str | None]]:
    """A server without API keys and one with; its URL and the key its clients give (None: none)."""
    keys = ApiKeys(frozenset({KEY})) if request.param == "keys" else ApiKeys()
    with in_process(translator, api_keys=keys) as running:
        yield running.url, KEY if keys.keys else None


def split_alone(translator: Translator, text: str) -> str:
    """`text` translated sentence by sentence by the library."""
    return translator.translate_n_best([text], split_sentences=True, progress=False)[0].text


@functools.cache
def _identifier():
    """py3langid's own model, loaded once (the server's is its own)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def detected(text: str) -> list[dict]:
    """py3langid's three likeliest languages of `text`, in percent, as the server should list them."""
    return [{"confidence": round(100 * p, 2), "language": code} for code, p in _identifier().rank(text)[:3]]


def confidence(text: str, language: str) -> float:
    """py3langid's probability, in percent, that `text` is in `language`."""
    return 100 * dict(_identifier().rank(text))[language]


def checked(response: httpx.Response) -> httpx.Response:
    check_error_shape(response.status_code, response.content, str(response.url))
    return response


# The real clients


def test_libretranslatepy_translates_detects_and_lists_languages(
    server: tuple[str, str | None], translator: Translator
) -> None:
    """LibreTranslate's own Python client posts form bodies (and its languages() is a GET with one)."""
    url, key = server
    client = libretranslatepy.LibreTranslateAPI(url, api_key=key)
    assert client.translate("w4 w5 w6", "en", "de", timeout=60) == alone(translator, "w4 w5 w6")[0].text
    text = "Ein Hund rennt durch den Park und spielt mit einem Ball."
    assert client.detect(text, timeout=60) == detected(text)
    assert {"code": "en", "name": "en", "targets": ["de"]} in client.languages(timeout=60)


def test_libretranslatepy_without_the_key_gets_401_and_with_a_wrong_one_403(translator: Translator) -> None:
    with in_process(translator, api_keys=ApiKeys(frozenset({KEY}))) as running:
        for given, status in ((None, 401), ("wrong-key", 403)):
            client = libretranslatepy.LibreTranslateAPI(running.url, api_key=given)
            with pytest.raises(HTTPError) as raised:
                client.translate("w1", "en", "de", timeout=60)
            assert raised.value.code == status
            check_error_shape(status, raised.value.read(), "libretranslatepy")


def test_deep_translator_sends_the_query_string_and_translates(
    server: tuple[str, str | None], translator: Translator
) -> None:
    """deep-translator's LibreTranslator puts every parameter in the query string of its POST; it needs
    some key even where the server needs none."""
    url, key = server
    client = deep_translator.LibreTranslator(
        source="en", target="de", api_key=key or "unused", custom_url=f"{url}/"
    )
    assert client.translate("w7 w8 w9") == alone(translator, "w7 w8 w9")[0].text
    texts = ["w1 w2", "w3 w4 w5"]
    assert client.translate_batch(texts) == [alone(translator, text)[0].text for text in texts]
    if key is not None:
        wrong = deep_translator.LibreTranslator(
            source="en", target="de", api_key="wrong", custom_url=f"{url}/"
        )
        with pytest.raises(deep_translator.exceptions.AuthorizationException):
            wrong.translate("w1 w2")


# LibreTranslate's documented requests: JSON with Content-Type, as its README's fetch examples send them


def test_documented_examples(server: tuple[str, str | None], translator: Translator) -> None:
    url, key = server
    extra = {"api_key": key} if key else {}
    headers = {"Content-Type": "application/json"}

    def send(path: str, body: dict) -> httpx.Response:
        return checked(httpx.post(f"{url}{path}", content=json.dumps({**body, **extra}), headers=headers))

    simple = send("/translate", {"q": "w1 w2 w3", "source": "en", "target": "de"}).json()
    assert simple == {"translatedText": alone(translator, "w1 w2 w3")[0].text, "alternatives": []}

    auto = send("/translate", {"q": "w3 w4 w5", "source": "auto", "target": "de", "format": "text"}).json()
    assert auto["translatedText"] == alone(translator, "w3 w4 w5")[0].text
    assert auto["detectedLanguage"]["language"] == "en"
    assert auto["detectedLanguage"]["confidence"] == pytest.approx(confidence("w3 w4 w5", "en"), abs=0.01)

    body = {"q": "w4 w5 w6 w7", "source": "auto", "target": "de", "format": "text", "alternatives": 3}
    alternatives = send("/translate", body).json()
    hypotheses = alone(translator, "w4 w5 w6 w7", n_best=4)
    assert alternatives["translatedText"] == hypotheses[0].text
    assert alternatives["alternatives"] == [h.text for h in hypotheses[1:]]

    html = send("/translate", {"q": "<p>w1</p>", "source": "en", "target": "de", "format": "html"})
    assert html.status_code == 400 and "format" in html.json()["error"]

    text = "Tout philosophe a deux philosophies : la sienne et celle de Spinoza."
    assert send("/detect", {"q": text}).json() == detected(text)


# Parameters wherever the client puts them


@pytest.mark.parametrize("where", ["json", "form", "multipart", "query", "query and form"])
def test_parameters_from_the_query_string_a_form_a_multipart_form_or_json(
    server: tuple[str, str | None], translator: Translator, where: str
) -> None:
    url, key = server
    fields = {"q": "w2 w3 w4", "source": "en", "target": "de", **({"api_key": key} if key else {})}
    sent = {
        "json": {"json": fields},
        "form": {"data": fields},
        "multipart": {"files": {name: (None, value) for name, value in fields.items()}},
        "query": {"params": fields},
        "query and form": {
            "params": {"q": fields["q"]},
            "data": {k: v for k, v in fields.items() if k != "q"},
        },
    }[where]
    response = checked(httpx.post(f"{url}/translate", timeout=60, **sent))
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == alone(translator, "w2 w3 w4")[0].text
    native = checked(httpx.post(f"{url}/v1/translate", timeout=60, params={**fields, "q": "w6 w7"}))
    assert native.json()["results"][0]["translations"][0]["text"] == alone(translator, "w6 w7")[0].text


def test_a_form_text_counts_its_line_ends_as_one_character(translator: Translator) -> None:
    """A browser sends a text area's line ends as \\r\\n; LibreTranslate counts each as one character, and
    translates each line by itself."""
    text = "w1 w2\nw3 w4\n" * 20
    with in_process(translator, limits=_limits(len(text))) as running:
        response = checked(
            httpx.post(
                f"{running.url}/translate",
                data={"q": text.replace("\n", "\r\n"), "source": "en", "target": "de"},
                timeout=60,
            )
        )
        assert response.status_code == 200, response.text
        lines = [alone(translator, line)[0].text if line else "" for line in text.split("\n")]
        assert response.json()["translatedText"] == "\n".join(lines)


def _limits(characters: int):
    from hf_vanilla_transformer.serving import Limits

    return Limits(max_characters=characters)


# Limits in characters


@pytest.mark.parametrize("character", ["狗", "😀", "é"])
@pytest.mark.parametrize("where", ["json", "form", "query"])
def test_texts_within_the_character_limit_pass_whatever_their_bytes(
    translator: Translator, character: str, where: str
) -> None:
    """5000 characters of CJK or emoji, escaped in JSON (6 or 12 bytes each) or percent-encoded in a
    form or a URL (9 or 12), are within the 5000-character limit; one more is over it."""
    with in_process(translator) as running:
        for count, status in ((5000, 200), (5001, 413)):
            fields = {"q": character * count, "source": "en", "target": "de"}
            sent = {"json": {"json": fields}, "form": {"data": fields}, "query": {"params": fields}}[where]
            response = checked(httpx.post(f"{running.url}/translate", timeout=120, **sent))
            assert response.status_code == status, response.text[:300]
            if status == 413:
                assert response.json()["limit"] == "max_characters"


# /detect, /translate_file, /frontend/settings


def test_detect_lists_the_likeliest_languages(server: tuple[str, str | None]) -> None:
    url, key = server
    fields = {"api_key": key} if key else {}
    for text in ("Der Hund spielt im Garten mit seinem Ball.", "Le chat dort sur le canapé depuis ce matin."):
        answer = checked(httpx.post(f"{url}/detect", data={"q": text, **fields}, timeout=60)).json()
        assert answer == detected(text)
        assert answer[0]["language"] == py3langid.classify(text)[0]
    empty = checked(httpx.post(f"{url}/detect", data={"q": " ", **fields}, timeout=60))
    assert empty.status_code == 400


def test_detect_without_py3langid_is_501(model_dir: Path, tmp_path: Path) -> None:
    """A server where py3langid cannot be imported answers /detect 501 with what to install, and still
    translates."""
    # Python imports sitecustomize at start-up; a None in sys.modules makes py3langid unimportable.
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['py3langid'] = None\n")
    environment = {**os.environ, "PYTHONPATH": str(tmp_path)}
    process, url = start_command(model_dir, env=environment)
    try:
        response = checked(httpx.post(f"{url}/detect", json={"q": "Der Hund spielt im Garten."}, timeout=60))
        assert response.status_code == 501 and "py3langid" in response.json()["error"]
        translated = checked(
            httpx.post(f"{url}/translate", json={"q": "w1 w2", "source": "auto", "target": "de"})
        )
        assert translated.json()["detectedLanguage"] == {"confidence": 0.0, "language": "en"}
    finally:
        process.terminate()
        process.communicate(timeout=60)


def test_translate_file_returns_a_url_to_the_translated_file(
    server: tuple[str, str | None], translator: Translator
) -> None:
    url, key = server
    lines = ["w1 w2 w3", "", PARAGRAPH, "w15 w0"]
    content = ("\n".join(lines) + "\n").encode()
    fields = {"source": "en", "target": "de", **({"api_key": key} if key else {})}
    response = checked(
        httpx.post(f"{url}/translate_file", data=fields, files={"file": ("notes.txt", content)}, timeout=60)
    )
    assert response.status_code == 200, response.text
    link = response.json()["translatedFileUrl"]
    assert link.startswith(f"{url}/download_file/")
    download = checked(httpx.get(link, timeout=60))
    assert download.status_code == 200
    assert 'filename="notes_de.txt"' in download.headers["content-disposition"]
    expected = [split_alone(translator, line) if line else "" for line in lines]
    assert download.text == "\n".join(expected) + "\n"
    missing = checked(httpx.get(f"{url}/download_file/0000.notes_de.txt", timeout=60))
    assert missing.status_code == 404


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [("notes.pdf", b"w1 w2", ".txt"), ("notes.txt", b"w1 \xff w2", "UTF-8"), (None, b"", "file")],
)
def test_translate_file_refuses_what_it_cannot_translate(
    translator: Translator, name: str | None, content: bytes, message: str
) -> None:
    with in_process(translator) as running:
        files = {"file": (name, content)} if name else {"other": ("x.txt", b"w1")}
        response = checked(
            httpx.post(
                f"{running.url}/translate_file",
                data={"source": "en", "target": "de"},
                files=files,
                timeout=60,
            )
        )
        assert response.status_code == 400 and message in response.json()["error"]


def test_frontend_settings_has_the_fields_libretranslates_page_reads(server: tuple[str, str | None]) -> None:
    url, key = server
    settings = checked(httpx.get(f"{url}/frontend/settings", timeout=60)).json()
    assert settings["charLimit"] == 5000 and settings["frontendTimeout"] > 0
    assert settings["apiKeys"] is settings["keyRequired"] is (key is not None)
    assert settings["filesTranslation"] is True and settings["supportedFilesFormat"] == [".txt"]
    assert settings["suggestions"] is False
    assert settings["language"] == {
        "source": {"code": "en", "name": "en"},
        "target": {"code": "de", "name": "de"},
    }


def test_the_command_takes_libretranslates_limit_flags(model_dir: Path) -> None:
    """Through `main`, in this process: the flags reach the server the command runs."""
    limits = ["--char-limit", "20", "--batch-limit", "2", "--req-limit", "3"]
    with command_in_process(model_dir, *limits) as url:
        over = checked(httpx.post(f"{url}/translate", json={"q": "w1 " * 10, "source": "en", "target": "de"}))
        assert over.status_code == 413 and over.json()["limit"] == "max_characters"
        many = checked(httpx.post(f"{url}/translate", json={"q": ["w1"] * 3, "source": "en", "target": "de"}))
        assert many.status_code == 413 and many.json()["limit"] == "max_segments"
        assert checked(httpx.get(f"{url}/frontend/settings")).json()["charLimit"] == 20
        # Two requests of three this minute are spent above, refused or not.
        one = {"q": "w1", "source": "en", "target": "de"}
        assert checked(httpx.post(f"{url}/translate", json=one)).status_code == 200
        over_rate = checked(httpx.post(f"{url}/translate", json=one))
        assert over_rate.status_code == 429 and over_rate.json()["limit"] == "req_limit"
        assert 10 <= int(over_rate.headers["Retry-After"]) <= 20  # 60 s / 3, less the time the four took


def test_cors_is_off_unless_asked_for(translator: Translator) -> None:
    """Without --cors a page on another origin gets no permission: its preflight is a 405."""
    with in_process(translator) as running:
        preflight = checked(
            httpx.options(
                f"{running.url}/translate",
                headers={"Origin": "http://elsewhere.test", "Access-Control-Request-Method": "POST"},
            )
        )
        assert preflight.status_code == 405
        assert "access-control-allow-origin" not in preflight.headers


def test_cors_preflights_and_answers(translator: Translator) -> None:
    origin = "http://pages.test:8080"
    with in_process(translator, cors=frozenset({origin})) as running:
        asked = {
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, x-api-key",
        }
        preflight = checked(httpx.options(f"{running.url}/translate", headers={"Origin": origin, **asked}))
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == origin
        assert "POST" in preflight.headers["access-control-allow-methods"]
        allowed = {h.strip() for h in preflight.headers["access-control-allow-headers"].split(",")}
        assert {"content-type", "x-api-key"} <= allowed
        answer = checked(
            httpx.post(
                f"{running.url}/translate",
                json={"q": "w1 w2", "source": "en", "target": "de"},
                headers={"Origin": origin},
            )
        )
        assert answer.headers["access-control-allow-origin"] == origin and "Origin" in answer.headers["vary"]
        refused = checked(
            httpx.options(f"{running.url}/translate", headers={"Origin": "http://other.test", **asked})
        )
        assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
        odd = {**asked, "Access-Control-Request-Headers": "x-secret"}
        assert (
            checked(httpx.options(f"{running.url}/translate", headers={"Origin": origin, **odd})).status_code
            == 403
        )


def test_cors_origins_are_checked_by_the_command(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--model", str(model_dir), "--source-lang", "en", "--target-lang", "de", "--port",
              str(free_port()), "--cors", "example.org"])  # fmt: skip
    error = capsys.readouterr().err
    assert exited.value.code == 2 and error.count("\n") == 1 and "scheme://host" in error
