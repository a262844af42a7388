"""The translation server: a FastAPI app over one `Translator`, whose requests a scheduler translates
together: on the PyTorch engine, one running batch that each request's segments join and leave between
decoding steps (`iteration_scheduler`); on the exported engines, fair batches across requests (`batcher`).

LibreTranslate's API, so that its clients work unchanged (each reads its parameters from the query string,
a JSON object, a form or a multipart form):
- `POST /translate`: one text or a list, with alternatives;
- `POST /detect`: the likeliest languages of a text (py3langid; 501 where it is not installed);
- `POST /translate_file`: a .txt file, translated line by line (each line sentence by sentence), fetched
  from the URL it answers (`GET /download_file/NAME`);
- `GET /languages` and `GET /frontend/settings`.

The native API: `POST /v1/translate`, with the n best hypotheses, their scores, word alignments and the
attention behind them, and sentence splitting. `GET /health`, `GET /v1/info` (languages, limits, whether a
key is needed), `GET /v1/stats` (what the batches held), the page at `/` and the OpenAPI docs at `/docs`.

Every error is JSON, {"error": ...}: 400 for a value out of range or a language pair or format the server
lacks, 401/403 for a missing/wrong API key, 404 for no such endpoint or file, 405 for a method an endpoint
does not take, 413 for a request over a size limit, 422 for a body that is not what its type says or a
field of the wrong type or not Unicode text, 429 with Retry-After for a client over its request rate,
501 for detection without its library, 503 with Retry-After when the queue is full. The protocol
(`server`) adds 400 for a malformed request, 408 for one sent too slowly and 503 for a connection beyond
its cap. HEAD is answered wherever GET is.
"""

import asyncio
import copy
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..common import text_lines
from ..inference import long_segments, sentence_splitting
from ..inference.blank import is_blank
from ..inference.hypotheses import Translation
from ..inference.iteration_batching import unsupported
from ..inference.translator import Translator
from .batcher import Batcher, Decode, Options, QueueFull, Scheduler
from .detection import LanguageDetector
from .fields import FORM, MULTIPART, ClientGone, Fields, Upload, content_type, read_fields
from .files import TranslatedFiles
from .iteration_scheduler import IterationScheduler
from .limits import ApiKeys, Limits, Refusal, RequestRate
from .middleware import AnswerWhenStopped, Cors, HeadAsGet
from .openapi import error_responses, install, request_bodies, request_body
from .schemas import DetectRequest, LibreTranslateRequest, TranslateFileRequest, TranslateRequest

logger = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
# Status for a request whose client went away before its answer (nginx's "client closed request"): it
# reaches nobody, but the access log tells it apart from an answer.
CLIENT_GONE = 499
# LibreTranslate's page waits this long after a keystroke before it translates (its frontendTimeout).
FRONTEND_TIMEOUT_MS = 500
FILE_SUFFIXES = (".txt",)


@dataclass(frozen=True)
class ServerSettings:
    """How the server translates and what it accepts: the model's language pair, the per-request
    `limits`, the `api_keys` (none: open), the `scheduler` ("iteration": segments join and leave one
    running batch of at most `max_running` between decoding steps, `IterationScheduler`; "batch": whole
    batches of at most `max_batch_tokens` source tokens, padding included, each waiting `max_wait_ms` for
    more requests, `Batcher`, with `batching` off to run one request a batch; "auto": iteration where the
    engine and the decoding settings allow it, else batch), `max_queue` requests waiting, the `cors`
    origins whose pages may call it ("*": any; none: only pages it serves itself), the
    `max_segment_tokens` of a work item of batch scheduling (a longer segment is cut into pieces,
    `long_segments.pieces`; none: never cut), and the
    `requests_per_minute` each client may send to the
    endpoints that translate or detect (none: no limit; see `RequestRate`)."""

    source_lang: str
    target_lang: str
    limits: Limits = field(default_factory=Limits)
    api_keys: ApiKeys = field(default_factory=ApiKeys)
    max_batch_tokens: int = 256
    max_wait_ms: float = 10.0
    max_queue: int = 256
    batching: bool = True
    cors: frozenset[str] = frozenset()
    requests_per_minute: int | None = None
    scheduler: str = "auto"
    max_running: int = 32
    max_segment_tokens: int | None = 128


def translator_decode(translator: Translator) -> Decode:
    """The batcher's decode step on `translator`: `translate_n_best` on one batch of sentences (split into
    `batch_size` segments a `generate()` call)."""

    def decode(segments: list[str], options: Options, batch_size: int) -> list[Translation]:
        return translator.translate_n_best(
            segments,
            n_best=options.n_best,
            scores=options.scores,
            alignments=options.alignments,
            batch_size=batch_size,
        )

    return decode


SCHEDULERS = ("auto", "iteration", "batch")


def iteration_refusal(translator: Translator) -> str | None:
    """Why `translator` cannot be served by iteration-level scheduling (None: it can): only the PyTorch
    engine decodes step by step in this process, and only the paper's beam search and greedy search."""
    if translator.engine != "torch":
        return f"the {translator.engine} engine decodes whole batches; serve it with --scheduler batch"
    problems = unsupported(translator.model.generation_config)
    if problems:
        return f"the model decodes with {', '.join(problems)}; serve it with --scheduler batch"
    return None


def scheduler_for(translator: Translator, settings: ServerSettings) -> Scheduler:
    """The scheduler `settings` ask for (`ServerSettings.scheduler`). Raises ValueError where iteration
    scheduling is asked for and `translator` cannot have it (`iteration_refusal`)."""
    if settings.scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {settings.scheduler!r}: choose one of {', '.join(SCHEDULERS)}.")
    refusal = iteration_refusal(translator)
    if settings.scheduler == "iteration" and refusal:
        raise ValueError(f"iteration scheduling: {refusal}.")
    automatic = settings.scheduler == "auto" and settings.batching and not refusal
    if settings.scheduler == "iteration" or automatic:
        return IterationScheduler(translator, max_running=settings.max_running, max_queue=settings.max_queue)
    return Batcher(
        translator_decode(translator),
        max_batch_tokens=settings.max_batch_tokens,
        max_wait_s=settings.max_wait_ms / 1000,
        max_queue=settings.max_queue,
        batching=settings.batching,
    )


# A whole number as a form, a query string, or a LibreTranslate client's JSON spells it.
DIGITS = re.compile(r"0|[1-9][0-9]*")
# Integer fields whose JSON value may be a string of digits, as LibreTranslate reads them.
DIGITS_IN_JSON = frozenset({"alternatives"})


def validated(model: type[BaseModel], data: dict[str, Any], form: bool = False) -> Any:
    """`data` as a `model`, typed as its OpenAPI description says (`openapi`): a JSON body's booleans and
    integers as JSON's own (LibreTranslate's `alternatives` also as a string of digits), and in a `form` (a
    form body, a multipart form or the query string, where every value is text) "true" or "false" and a
    string of digits. A field missing or of another type is the same 422 as FastAPI's own."""
    typed = dict(data)
    for name, info in model.model_fields.items():
        value = typed.get(name)
        if info.annotation is int and isinstance(value, float) and value.is_integer():
            typed[name] = int(value)  # JSON Schema's integer: 3.0 is one
        if not isinstance(value, str):
            continue
        if info.annotation is bool and form and value in ("true", "false"):
            typed[name] = value == "true"
        elif info.annotation is int and (form or name in DIGITS_IN_JSON) and DIGITS.fullmatch(value):
            typed[name] = int(value)
    try:
        return model.model_validate(typed, strict=True)
    except ValidationError as error:
        raise RequestValidationError(error.errors(include_url=False, include_input=False)) from None


def api_key(request: Request, data: dict[str, Any]) -> str | None:
    """The key a request gives: `Authorization: Bearer KEY`, an X-API-Key header, or the api_key field."""
    authorization = request.headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    key = request.headers.get("x-api-key") or data.get("api_key")
    return key if isinstance(key, str) else None


def client_name(request: Request, key: str | None) -> str:
    """Who sends `request`, for its request rate: the API `key` it was let in with, else its address: the
    peer's, or behind a proxy that `--proxy-headers` and `--forwarded-allow-ips` trust, the address it names
    in X-Forwarded-For."""
    if key is not None:
        return f"key {key}"
    return f"address {request.client.host if request.client else 'unknown'}"


async def _disconnected(request: Request) -> None:
    """Returns once the client of `request` (whose body has been read) goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _texts(q: str | list[str]) -> list[str]:
    return [q] if isinstance(q, str) else q


def _one_or_list(q: str | list[str], values: list[Any]) -> Any:
    """`values`, one per text of `q`: the first alone where `q` is one text."""
    return values[0] if isinstance(q, str) else values


def create_app(translator: Translator, settings: ServerSettings) -> FastAPI:
    """The server's app: `translator` behind a `Batcher`, which starts and stops with the app."""
    # Requests are measured in tokens on the event loop while the worker tokenizes its batch: each thread
    # has its own tokenizer, as a fast tokenizer's settings are not to be changed by two threads at once.
    counter = copy.deepcopy(translator.tokenizer)
    if settings.max_segment_tokens is not None:
        long_segments.check_max_tokens(settings.max_segment_tokens)
    batcher = scheduler_for(translator, settings)
    detector = LanguageDetector.load()
    rate = RequestRate(settings.requests_per_minute) if settings.requests_per_minute else None
    files = TranslatedFiles()
    splittable = settings.source_lang in sentence_splitting.SPLITTER_LANGUAGES

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        # Shutting down: the server has answered every request in flight; stop the worker.
        batcher.close()

    app = FastAPI(title="vanilla-transformer translation server", description=__doc__, lifespan=lifespan)
    install(app)
    bodies = request_bodies(settings.source_lang, settings.target_lang, settings.limits, splittable)
    # The errors of the endpoints that translate or detect: the key and the rate where the server checks
    # them, and a full queue.
    refusals = (400, 413, 422, 503)
    if settings.api_keys.keys:
        refusals += (401, 403)
    if rate is not None:
        refusals += (429,)
    app.state.batcher = batcher
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    if settings.cors:
        app.add_middleware(Cors, origins=settings.cors)
    app.add_middleware(AnswerWhenStopped)
    app.add_middleware(HeadAsGet)

    @app.exception_handler(Refusal)
    async def refused(request: Request, error: Refusal) -> JSONResponse:
        headers = {}
        if error.status == 413:
            # A body refused for its size may still be arriving: the connection cannot carry another one.
            headers["Connection"] = "close"
        if error.retry_after is not None:
            headers["Retry-After"] = str(error.retry_after)
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = [
            {"loc": list(problem["loc"]), "msg": problem["msg"], "type": problem["type"]}
            for problem in error.errors()
        ]
        message = "; ".join(
            f"{'.'.join(str(part) for part in p['loc'] if part != 'body') or 'body'}: {p['msg']}"
            for p in problems
        )
        return JSONResponse({"error": f"invalid request: {message}", "detail": problems}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        where = f"{request.method} {request.url.path}"
        if error.status_code == 404:
            message = f"no such endpoint: {where}; the API is listed at /docs."
        elif error.status_code == 405:
            allowed = (error.headers or {}).get("Allow", "")
            message = f"{where}: this endpoint takes {allowed or 'other methods'}."
        else:
            message = str(error.detail)
        return JSONResponse({"error": message}, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> JSONResponse:
        logger.error("%s %s failed", request.method, request.url.path, exc_info=error)
        return JSONResponse({"error": "the server failed; its log says why."}, status_code=500)

    @app.exception_handler(ClientGone)
    async def gone(request: Request, error: ClientGone) -> Response:
        return Response(status_code=CLIENT_GONE)

    def check_languages(source: str | None, target: str | None) -> None:
        if source not in (None, settings.source_lang, "auto") or target not in (None, settings.target_lang):
            raise Refusal(
                400,
                f"this server translates {settings.source_lang} to {settings.target_lang}; asked for "
                f"{source} to {target}.",
            )

    def sentences_of(texts: list[str]) -> list[list[str]]:
        """Each text's sentences; a text whole (if not blank) where the source language has no splitter."""
        if splittable:
            return [sentence_splitting.split_sentences(text, settings.source_lang) for text in texts]
        return [[] if is_blank(text) else [text.strip()] for text in texts]

    def count_tokens(texts: list[str]) -> list[int]:
        return [len(ids) for ids in counter(texts, add_special_tokens=True)["input_ids"]]

    def work_items(segments: list[str], lengths: list[int]) -> list[list[tuple[str, int]]]:
        """Each segment's work items with their lengths in tokens: for whole-batch scheduling, a segment of
        more than `max_segment_tokens` cut into pieces of at most that many (`long_segments.pieces`)."""
        limit = settings.max_segment_tokens
        if not isinstance(batcher, Batcher) or not limit:
            return [[item] for item in zip(segments, lengths)]
        items = []
        for segment, length in zip(segments, lengths):
            if length <= limit:
                items.append([(segment, length)])
            else:
                pieces = long_segments.pieces(segment, lambda text: count_tokens([text])[0], limit)
                items.append(list(zip(pieces, count_tokens(pieces))))
        return items

    async def translated(request: Request, segments: list[str], options: Options) -> list[Translation]:
        """`segments` translated in the batches to come, or `ClientGone` once the client goes away; a long
        segment as its pieces' translations joined (`work_items`)."""
        if not segments:
            return []
        # On the event loop, the one thread that uses `counter`.
        items = work_items(segments, count_tokens(segments))
        flat = [item for pieces in items for item in pieces]
        translations = iter(await decoded(request, [text for text, _ in flat], [n for _, n in flat], options))
        return [
            next(translations)
            if len(pieces) == 1
            else long_segments.join_pieces(segment, [next(translations) for _ in pieces])
            for segment, pieces in zip(segments, items)
        ]

    async def decoded(
        request: Request, segments: list[str], lengths: list[int], options: Options
    ) -> list[Translation]:
        """`segments` (of `lengths` tokens) translated by the scheduler, or `ClientGone` once the client goes
        away."""
        try:
            job = batcher.submit(segments, lengths, options)
        except QueueFull as error:
            raise Refusal(503, str(error), retry_after=error.retry_after) from None
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({job.future, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server stops, and this request ran out of time
            batcher.cancel(job)
            raise
        finally:
            watcher.cancel()
        if not job.future.done():
            batcher.cancel(job)
            job.future.cancel()
            raise ClientGone
        try:
            return job.future.result()
        except ValueError as error:  # what the translator refuses in this input
            raise Refusal(400, str(error)) from None
        except Exception:
            logger.exception("translation failed")
            raise Refusal(500, "the translation failed; the server's log says why.") from None

    async def translate_sentences(
        request: Request, texts: list[str], options: Options
    ) -> list[list[Translation]]:
        """The translations of each text's sentences, in order, each sentence a segment of its own for the
        batcher."""
        # pysbd takes most of a second on a long paragraph: off the event loop.
        pieces = await run_in_threadpool(sentences_of, texts)
        parts = iter(await translated(request, [s for piece in pieces for s in piece], options))
        return [[next(parts) for _ in piece] for piece in pieces]

    async def translate(
        request: Request, texts: list[str], options: Options, split: bool = False
    ) -> list[Translation]:
        """Translate `texts`, each whole or (`split`) sentence by sentence, joined back into one
        translation a text."""
        if not split:
            return await translated(request, texts, options)
        sentences = await translate_sentences(request, texts, options)
        return [sentence_splitting.join_sentences(text, parts) for text, parts in zip(texts, sentences)]

    def check_splitting(n_best: int) -> None:
        try:
            sentence_splitting.check_n_best(n_best)
            sentence_splitting.check_language(settings.source_lang)
        except ValueError as error:
            raise Refusal(400, str(error)) from None

    def detected_language(text: str) -> dict:
        """LibreTranslate's `detectedLanguage` for "source": "auto": the model's source language, with the
        detector's confidence that `text` is in it (0 without a detector)."""
        confidence = detector.confidence(text, settings.source_lang) if detector else 0.0
        return {"confidence": confidence, "language": settings.source_lang}

    async def authorized_fields(request: Request) -> Fields:
        fields = await read_fields(request, settings.limits.max_body_bytes, settings.limits.max_segments)
        key = api_key(request, fields.values)
        try:
            settings.api_keys.check(key)
        except Refusal:
            if rate is not None:  # guesses at a key spend the guesser's address's requests
                rate.check(client_name(request, None))
            raise
        if rate is not None:
            # A key counts only where the server checks keys: made-up keys would give a client fresh tokens.
            rate.check(client_name(request, key if settings.api_keys.keys else None))
        return fields

    @app.post(
        "/translate",
        summary="Translate (LibreTranslate's API)",
        responses=error_responses(*refusals, 500),
        openapi_extra={
            "requestBody": request_body(bodies["LibreTranslateRequest"], "application/json", FORM, MULTIPART)
        },
    )
    async def libretranslate(request: Request) -> dict:
        """{"q": text or [texts], "source": "en", "target": "de", "alternatives": N} gives
        {"translatedText": text or [texts], "alternatives": [texts] or [[texts]]}, and with "source":
        "auto" the "detectedLanguage". Each line of a text is translated sentence by sentence (where
        pysbd knows the source language; else whole), as LibreTranslate translates."""
        fields = await authorized_fields(request)
        body = validated(LibreTranslateRequest, fields.values, not fields.json)
        check_languages(body.source, body.target)
        if body.format != "text":
            message = f"format {body.format!r}: this server translates plain text; send format text."
            raise Refusal(400, message)
        texts = _texts(body.q)
        settings.limits.check(texts, body.alternatives)
        # As LibreTranslate's engine (argos-translate) does: each line of a text, and each sentence of a
        # line, translated by itself; the k-th alternative joins every sentence's k-th next best.
        lines = [text_lines.split_lines(text) for text in texts]
        n_best = body.alternatives + 1
        every_line = [line for parts in lines for line in parts]
        sentences = iter(await translate_sentences(request, every_line, Options(n_best=n_best)))
        ranked = [
            sentence_splitting.joined_n_best([next(sentences) for _ in parts], n_best) for parts in lines
        ]
        answer = {
            "translatedText": _one_or_list(body.q, [best for best, *_ in ranked]),
            "alternatives": _one_or_list(body.q, [alternatives for _, *alternatives in ranked]),
        }
        if body.source == "auto":
            answer["detectedLanguage"] = _one_or_list(body.q, [detected_language(text) for text in texts])
        return answer

    @app.post(
        "/detect",
        summary="Detect the language of a text (LibreTranslate's API)",
        responses=error_responses(*refusals),
        openapi_extra={
            "requestBody": request_body(bodies["DetectRequest"], "application/json", FORM, MULTIPART)
        },
        # Without its library every request is answered 501: an operation the description leaves out.
        include_in_schema=detector is not None,
    )
    async def detect(request: Request) -> list[dict]:
        """{"q": text} gives the likeliest languages, best first: [{"confidence": percent, "language":
        code}]."""
        fields = await authorized_fields(request)
        if detector is None:
            raise Refusal(
                501,
                "language detection needs py3langid, which is not installed here: pip install "
                "'hf-vanilla-transformer[serve]' (or py3langid), then restart the server.",
            )
        text = "\n".join(_texts(validated(DetectRequest, fields.values, not fields.json).q))
        settings.limits.check_characters(len(text))
        if is_blank(text):
            raise Refusal(400, "q holds no text: send the text whose language to detect.")
        return detector.ranked(text)

    @app.post(
        "/translate_file",
        summary="Translate a .txt file (LibreTranslate's API)",
        responses=error_responses(*refusals, 500),
        openapi_extra={"requestBody": request_body(bodies["TranslateFileRequest"], MULTIPART)},
    )
    async def translate_file(request: Request) -> dict:
        """A multipart form of "file" (a .txt file in UTF-8, or a text part), "source" and "target" gives
        {"translatedFileUrl": URL}, where the translated file waits for 30 minutes."""
        fields = await authorized_fields(request)
        body = validated(TranslateFileRequest, fields.values, not fields.json)
        upload = fields.files.get("file")
        text = fields.values.get("file")
        if upload is None and isinstance(text, str) and content_type(request) == MULTIPART:
            # A part without a file name is a form field: its text is read as a .txt file's.
            upload = Upload("file.txt", text.encode("utf-8"))
        if upload is None:
            raise Refusal(400, "no file: send the file to translate as the multipart form field 'file'.")
        check_languages(body.source, body.target)
        name, suffix = Path(upload.filename).stem, Path(upload.filename).suffix.lower()
        if suffix not in FILE_SUFFIXES:
            raise Refusal(400, f"{upload.filename!r}: only {', '.join(FILE_SUFFIXES)} files are translated.")
        try:
            lines = text_lines.read_lines(upload.content, upload.filename)
        except text_lines.NotUTF8Error as error:
            raise Refusal(400, str(error)) from None
        settings.limits.check_characters(sum(len(line) for line in lines))
        translations = await translate(request, lines, Options(), split=splittable)
        ending = "\n" if upload.content.endswith(b"\n") else ""
        content = "\n".join(translation.text for translation in translations) + ending
        key = files.add(f"{name}_{settings.target_lang}{suffix}", content.encode("utf-8"))
        return {"translatedFileUrl": str(request.url_for("download_file", name=key))}

    @app.get(
        "/download_file/{name}",
        summary="A translated file, by the URL /translate_file gave",
        responses=error_responses(404, 422),
        response_class=PlainTextResponse,
    )
    async def download_file(name: str) -> Response:
        stored = files.get(name)
        if stored is None:
            message = f"no translated file {name!r}: it expired (files are kept 30 minutes); translate again."
            raise Refusal(404, message)
        disposition = f'attachment; filename="{stored.filename}"'
        return Response(
            stored.content,
            media_type="text/plain; charset=utf-8",
            headers={"Content-Disposition": disposition},
        )

    @app.post(
        "/v1/translate",
        summary="Translate, with scores, alignments and attention",
        responses=error_responses(*refusals, 500),
        openapi_extra={
            "requestBody": request_body(bodies["TranslateRequest"], "application/json", FORM, MULTIPART)
        },
    )
    async def native(request: Request) -> dict:
        """{"q": text or [texts], "n_best": N, "alignments": bool, "attention": bool, "split_sentences":
        bool} gives {"results": [one per text: {"translations": [n best: {"text", "score", "log_prob",
        "tokens", "alignment", "attention"}], "truncated"}]}."""
        fields = await authorized_fields(request)
        body = validated(TranslateRequest, fields.values, not fields.json)
        check_languages(body.source, body.target)
        texts = _texts(body.q)
        settings.limits.check(texts, body.n_best - 1)
        if body.split_sentences:
            check_splitting(body.n_best)
        options = Options(body.n_best, True, body.alignments or body.attention)
        translations = await translate(request, texts, options, split=body.split_sentences)
        results = []
        for translation in translations:
            result = translation.to_dict()
            if body.attention:
                for hypothesis, shown in zip(translation.hypotheses, result["translations"]):
                    shown["attention"] = hypothesis.attention_dict()
            results.append(result)
        return {"results": results}

    @app.get("/health", summary="Whether the server answers, and its queue", responses=error_responses())
    async def health() -> dict:
        return {"status": "ok", "queued": batcher.queued, "decoding": batcher.running}

    @app.get("/languages", summary="The language pair (LibreTranslate's shape)", responses=error_responses())
    async def languages() -> list[dict]:
        return [
            {"code": settings.source_lang, "name": settings.source_lang, "targets": [settings.target_lang]},
            {"code": settings.target_lang, "name": settings.target_lang, "targets": []},
        ]

    @app.get(
        "/frontend/settings",
        summary="What LibreTranslate's web page reads of its server",
        responses=error_responses(),
    )
    async def frontend_settings() -> dict:
        keys = bool(settings.api_keys.keys)
        return {
            "charLimit": settings.limits.max_characters,
            "frontendTimeout": FRONTEND_TIMEOUT_MS,
            "apiKeys": keys,
            "keyRequired": keys,
            "suggestions": False,
            "filesTranslation": True,
            "supportedFilesFormat": list(FILE_SUFFIXES),
            "language": {
                "source": {"code": settings.source_lang, "name": settings.source_lang},
                "target": {"code": settings.target_lang, "name": settings.target_lang},
            },
        }

    @app.get(
        "/v1/info",
        summary="The language pair, the engine, the limits, whether a key is needed",
        responses=error_responses(),
    )
    async def info() -> dict:
        return {
            "source": settings.source_lang,
            "target": settings.target_lang,
            "engine": translator.engine,
            "api_key_required": bool(settings.api_keys.keys),
            "detection": detector is not None,
            "limits": {
                "max_characters": settings.limits.max_characters,
                "max_segments": settings.limits.max_segments,
                "max_alternatives": settings.limits.max_alternatives,
                "max_body_bytes": settings.limits.max_body_bytes,
                "requests_per_minute": settings.requests_per_minute,
            },
            "batching": {
                "enabled": settings.batching,
                "max_batch_tokens": settings.max_batch_tokens,
                "max_wait_ms": settings.max_wait_ms,
                "max_queue": settings.max_queue,
            },
        }

    @app.get("/v1/stats", summary="What the batches so far held", responses=error_responses())
    async def stats() -> dict:
        return batcher.stats_dict()

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    return app


__all__ = [
    "SCHEDULERS",
    "ServerSettings",
    "create_app",
    "iteration_refusal",
    "scheduler_for",
    "translator_decode",
]
