"""The translation server: a FastAPI app over one `Translator`, whose requests a `Batcher` translates in
batches across requests.

- `POST /translate`: LibreTranslate's API (JSON or form fields), so its clients work unchanged.
- `POST /v1/translate`: the native API, with the n best hypotheses, their scores, word alignments and the
  attention behind them, and sentence splitting.
- `GET /health`, `GET /languages` (LibreTranslate's), `GET /v1/info` (languages, limits, whether a key is
  needed), `GET /v1/stats` (what the batches held), the page at `/` and the OpenAPI docs at `/docs`.

Every error is JSON, {"error": ...}: 400 for a value out of range, 401/403 for a missing/wrong API key, 413
for a request over a size limit, 422 for invalid JSON or a field of the wrong type, 503 with Retry-After
when the queue is full.
"""

import asyncio
import copy
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from .. import sentence_splitting
from ..engines import Translator
from ..hypotheses import Translation
from .batcher import Batcher, Decode, Options, QueueFull
from .limits import ApiKeys, Limits, Refusal
from .schemas import LibreTranslateRequest, TranslateRequest

logger = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
FORM = "application/x-www-form-urlencoded"
# Status for a request whose client went away before its answer (nginx's "client closed request"): it
# reaches nobody, but the access log tells it apart from an answer.
CLIENT_GONE = 499


@dataclass(frozen=True)
class ServerSettings:
    """How the server translates and what it accepts: the model's language pair, the per-request
    `limits`, the `api_keys` (none: open), and the batching: `max_batch_tokens` source tokens a batch
    (padding included), `max_wait_ms` a batch waits for more requests, `max_queue` requests waiting,
    `batching` off to run one request a batch."""

    source_lang: str
    target_lang: str
    limits: Limits = field(default_factory=Limits)
    api_keys: ApiKeys = field(default_factory=ApiKeys)
    max_batch_tokens: int = 256
    max_wait_ms: float = 10.0
    max_queue: int = 256
    batching: bool = True


def translator_decode(translator: Translator, language: str) -> Decode:
    """The batcher's decode step on `translator`: `translate_n_best` on one batch (split into
    `batch_size` segments a `generate()` call), sentences split by the rules of `language`."""

    def decode(segments: list[str], options: Options, batch_size: int) -> list[Translation]:
        return translator.translate_n_best(
            segments,
            n_best=options.n_best,
            scores=options.scores,
            alignments=options.alignments,
            split_sentences=options.split_sentences,
            language=language,
            batch_size=batch_size,
        )

    return decode


class ClientGone(Exception):
    """The client went away before its request was read or translated."""


def _form_fields(body: bytes) -> dict[str, Any]:
    """A form body's fields: a repeated `q` is a list of texts, any other field its first value."""
    fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(body))
    data: dict[str, Any] = {key: values[0] for key, values in fields.items()}
    if len(fields.get("q", [])) > 1:
        data["q"] = fields["q"]
    return data


async def read_fields(request: Request, limits: Limits, form: bool = False) -> dict[str, Any]:
    """The fields of a request body: a JSON object, or where `form` and the body is one, form fields. A
    body over `limits.max_body_bytes` is refused (413) before it is read whole; one that is not a JSON
    object (or form) is a 422."""
    cap = limits.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise Refusal(413, f"a body of {declared} bytes; send at most {cap}.", "max_body_bytes", cap)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > cap:
                raise Refusal(413, f"a body over {cap} bytes; send at most {cap}.", "max_body_bytes", cap)
    except ClientDisconnect:
        raise ClientGone from None
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        data = _form_fields(bytes(body)) if form and content_type == FORM else json.loads(body)
    except (ValueError, RecursionError) as error:  # not UTF-8, not JSON, nested too deep, a bad form
        kind = "form fields" if form and content_type == FORM else "a JSON object"
        raise Refusal(422, f"the body is not {kind}: {str(error)[:200]}") from None
    if not isinstance(data, dict):
        raise Refusal(422, f"the body is a JSON {type(data).__name__}; send a JSON object.")
    return data


def validated(model: type[BaseModel], data: dict[str, Any]) -> Any:
    """`data` as a `model`; a field missing or of the wrong type is the same 422 as FastAPI's own."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise RequestValidationError(error.errors(include_url=False, include_input=False)) from None


def api_key(request: Request, data: dict[str, Any]) -> str | None:
    """The key a request gives: `Authorization: Bearer KEY`, an X-API-Key header, or the api_key field."""
    authorization = request.headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    key = request.headers.get("x-api-key") or data.get("api_key")
    return key if isinstance(key, str) else None


async def _disconnected(request: Request) -> None:
    """Returns once the client of `request` (whose body has been read) goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(translator: Translator, settings: ServerSettings) -> FastAPI:
    """The server's app: `translator` behind a `Batcher`, which starts and stops with the app."""
    # Requests are measured in tokens on the event loop while the worker tokenizes its batch: each thread
    # has its own tokenizer, as a fast tokenizer's settings are not to be changed by two threads at once.
    counter = copy.deepcopy(translator.tokenizer)
    batcher = Batcher(
        translator_decode(translator, settings.source_lang),
        max_batch_tokens=settings.max_batch_tokens,
        max_wait_s=settings.max_wait_ms / 1000,
        max_queue=settings.max_queue,
        batching=settings.batching,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        # Shutting down (SIGTERM): the server has answered every request in flight; stop the worker.
        batcher.close()

    app = FastAPI(
        title="vanilla-transformer translation server",
        description=__doc__,
        lifespan=lifespan,
    )
    app.state.batcher = batcher
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(Refusal)
    async def refused(request: Request, error: Refusal) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

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

    @app.exception_handler(QueueFull)
    async def full(request: Request, error: QueueFull) -> JSONResponse:
        headers = {"Retry-After": str(error.retry_after)}
        return JSONResponse({"error": str(error)}, status_code=503, headers=headers)

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

    async def translate(request: Request, q: str | list[str], options: Options) -> list[Translation]:
        """Translate a request's texts in the next batch, once its limits are checked."""
        segments = [q] if isinstance(q, str) else q
        settings.limits.check(segments, options.n_best - 1)
        if options.split_sentences:
            if options.n_best > 1:
                raise Refusal(
                    400,
                    "split_sentences joins each sentence's best translation: ask for n_best 1 with it.",
                )
            try:
                sentence_splitting.check_language(settings.source_lang)
            except ValueError as error:
                raise Refusal(400, str(error)) from None
        if not segments:
            return []
        lengths = [len(ids) for ids in counter(segments, add_special_tokens=True)["input_ids"]]
        job = batcher.submit(segments, lengths, options)
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({job.future, watcher}, return_when=asyncio.FIRST_COMPLETED)
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

    async def authorized_fields(request: Request, form: bool = False) -> dict[str, Any]:
        data = await read_fields(request, settings.limits, form=form)
        settings.api_keys.check(api_key(request, data))
        return data

    def documented_body(model: type[BaseModel], *content_types: str) -> dict:
        """OpenAPI's requestBody for a route that reads its body itself."""
        schema = model.model_json_schema()
        return {"required": True, "content": {kind: {"schema": schema} for kind in content_types}}

    @app.post(
        "/translate",
        summary="Translate (LibreTranslate's API)",
        openapi_extra={"requestBody": documented_body(LibreTranslateRequest, "application/json", FORM)},
    )
    async def libretranslate(request: Request) -> dict:
        """{"q": text or [texts], "source": "en", "target": "de", "alternatives": N} gives
        {"translatedText": text or [texts], "alternatives": [texts] or [[texts]]}."""
        body = validated(LibreTranslateRequest, await authorized_fields(request, form=True))
        check_languages(body.source, body.target)
        translations = await translate(request, body.q, Options(n_best=body.alternatives + 1))
        texts = [t.text for t in translations]
        alternatives = [[h.text for h in t.hypotheses[1:]] for t in translations]
        if isinstance(body.q, str):
            return {"translatedText": texts[0], "alternatives": alternatives[0]}
        return {"translatedText": texts, "alternatives": alternatives}

    @app.post(
        "/v1/translate",
        summary="Translate, with scores, alignments and attention",
        openapi_extra={"requestBody": documented_body(TranslateRequest, "application/json")},
    )
    async def native(request: Request) -> dict:
        """{"q": text or [texts], "n_best": N, "alignments": bool, "attention": bool, "split_sentences":
        bool} gives {"results": [one per text: {"translations": [n best: {"text", "score", "log_prob",
        "tokens", "alignment", "attention"}], "truncated"}]}."""
        body = validated(TranslateRequest, await authorized_fields(request))
        check_languages(body.source, body.target)
        options = Options(body.n_best, True, body.alignments or body.attention, body.split_sentences)
        translations = await translate(request, body.q, options)
        results = []
        for translation in translations:
            result = translation.to_dict()
            if body.attention:
                for hypothesis, shown in zip(translation.hypotheses, result["translations"]):
                    shown["attention"] = hypothesis.attention_dict()
            results.append(result)
        return {"results": results}

    @app.get("/health", summary="Whether the server answers, and its queue")
    async def health() -> dict:
        return {"status": "ok", "queued": batcher.queued, "decoding": batcher.running}

    @app.get("/languages", summary="The language pair (LibreTranslate's shape)")
    async def languages() -> list[dict]:
        return [
            {"code": settings.source_lang, "name": settings.source_lang, "targets": [settings.target_lang]},
            {"code": settings.target_lang, "name": settings.target_lang, "targets": []},
        ]

    @app.get("/v1/info", summary="The language pair, the engine, the limits, whether a key is needed")
    async def info() -> dict:
        return {
            "source": settings.source_lang,
            "target": settings.target_lang,
            "engine": translator.engine,
            "api_key_required": bool(settings.api_keys.keys),
            "limits": {
                "max_characters": settings.limits.max_characters,
                "max_segments": settings.limits.max_segments,
                "max_alternatives": settings.limits.max_alternatives,
                "max_body_bytes": settings.limits.max_body_bytes,
            },
            "batching": {
                "enabled": settings.batching,
                "max_batch_tokens": settings.max_batch_tokens,
                "max_wait_ms": settings.max_wait_ms,
                "max_queue": settings.max_queue,
            },
        }

    @app.get("/v1/stats", summary="What the batches so far held")
    async def stats() -> dict:
        return batcher.stats_dict()

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    return app


__all__ = ["ServerSettings", "create_app", "translator_decode"]
