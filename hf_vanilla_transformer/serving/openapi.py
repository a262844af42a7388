"""The server's OpenAPI description as the server enforces it: each request body with the language codes
of the model as enums and the limits as maxLength, maxItems and maximum, and each operation with every
error it answers, in the one shape {"error": ...} (`ERROR_SCHEMA`).

A request the description calls valid is translated; one it calls invalid is refused with a 4xx: what a
client generated from it, or a property-based tester such as schemathesis, can rely on. The one limit it
cannot state is the character limit over all the texts of a list together (JSON Schema bounds each text
alone); that one is stated in words.
"""

import copy
import unicodedata
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from .limits import Limits
from .schemas import DetectRequest, LibreTranslateRequest, TranslateFileRequest, TranslateRequest

ERROR_REF = "#/components/schemas/Error"
ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "description": 'Every error answer: {"error": "..."}, one line saying what was wrong and what to send '
    'instead; "limit" and "value" name the limit that refused the request, and a 422 lists its '
    '"detail", one problem a field.',
    "required": ["error"],
    "properties": {
        "error": {"type": "string", "minLength": 1},
        "limit": {"type": "string"},
        "value": {"type": "integer"},
        "detail": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["loc", "msg", "type"],
                "properties": {
                    "loc": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
                    "msg": {"type": "string"},
                    "type": {"type": "string"},
                },
            },
        },
    },
}
# Why each error status is answered, as the description tells it.
WHY = {
    400: "a malformed HTTP request, or a value the server refuses (see the message)",
    401: "no API key",
    403: "an API key that is not one of the server's",
    404: "no such translated file (they are kept 30 minutes)",
    408: "the request's head or body did not arrive in time",
    413: "a request over a size limit (characters, texts, bytes)",
    422: "a body that is not what its content type says, or a field missing, of the wrong type or not "
    "Unicode text (a path that is not Unicode text)",
    429: "the client sent more requests than its rate allows",
    500: "the translation failed; the server's log says why",
    501: "language detection is not installed",
    503: "the queue is full, the server is stopping, or it holds as many connections as it takes",
}
RETRY_AFTER = {
    "description": "whole seconds after which the request may pass",
    "required": True,
    "schema": {"type": "integer", "minimum": 0},
}
# Answered by the HTTP protocol to any request, whichever operation it was meant for.
PROTOCOL_ERRORS = (400, 408, 503)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses` of an operation that answers `statuses` (and the protocol's errors), each an
    `ERROR_SCHEMA` in JSON, with Retry-After where the server sends it."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in sorted({*statuses, *PROTOCOL_ERRORS}):
        response: dict[str, Any] = {
            "description": WHY[status],
            "content": {"application/json": {"schema": {"$ref": ERROR_REF}}},
        }
        if status in (429, 503):
            response["headers"] = {"Retry-After": RETRY_AFTER}
        responses[status] = response
    return responses


def _bmp_ranges(belongs: Callable[[str], bool]) -> str:
    """The code points of the Basic Multilingual Plane for which `belongs` holds, as the ranges of a
    regular expression's character class (escapes that Python's and ECMAScript's expressions both read)."""
    ranges, start = [], None
    for point in range(0x10000 + 1):
        inside = point < 0x10000 and not 0xD800 <= point < 0xE000 and belongs(chr(point))
        if inside and start is None:
            start = point
        elif not inside and start is not None:
            last = point - 1
            ranges.append(f"\\u{start:04X}" + (f"-\\u{last:04X}" if last > start else ""))
            start = None
    return "".join(ranges)


def _blank_character(char: str) -> bool:
    # As `inference.blank.is_blank` counts it.
    return char.isspace() or unicodedata.category(char) in ("Cc", "Cf")


# A text with something to translate: a character that is not white space, a control or a format
# character (`inference.blank.is_blank`).
NOT_BLANK = f"[^{_bmp_ranges(_blank_character)}]"


def _texts(limits: Limits, form: bool, pattern: str | None = None) -> dict[str, Any]:
    """`q`: one text of at most `max_characters`, or a list of such texts: of at most `max_segments`, or
    with `pattern` (the text whose language to detect, the list's texts joined), of any number, one
    matching `pattern`; at least one in a form, which cannot send an empty list."""
    text: dict[str, Any] = {"type": "string", "maxLength": limits.max_characters}
    texts: dict[str, Any] = {"type": "array", "maxItems": limits.max_segments, "items": dict(text)}
    if pattern is not None:
        del texts["maxItems"]
        text["pattern"] = pattern
        texts["contains"] = {"type": "string", "pattern": pattern}
    if form or pattern is not None:
        texts["minItems"] = 1
    return {
        "anyOf": [text, texts],
        "description": "the text, or a list of texts, of at most "
        f"{limits.max_characters} characters (Unicode code points) over all of them",
    }


def _languages(codes: list[str], nullable: bool = False) -> dict[str, Any]:
    choice: dict[str, Any] = {"type": "string", "enum": codes}
    return {"anyOf": [choice, {"type": "null"}]} if nullable else choice


def _json_alternatives(most: int) -> dict[str, Any]:
    """LibreTranslate's `alternatives` in JSON: a number, or its digits in a string, as LibreTranslate
    takes it."""
    return {
        "anyOf": [
            {"type": "integer", "minimum": 0, "maximum": most},
            {"type": "string", "enum": [str(count) for count in range(most + 1)]},
        ]
    }


def _constrained(model: type[BaseModel], constraints: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`model`'s JSON schema with each property in `constraints` updated by its keywords (those that
    name a new `anyOf` or `enum` replace the type's)."""
    schema = copy.deepcopy(model.model_json_schema())
    for name, keywords in constraints.items():
        prop = schema["properties"][name]
        if "anyOf" in keywords or "enum" in keywords:
            prop.pop("anyOf", None)
            prop.pop("type", None)
        prop.update(keywords)
    return schema


def request_bodies(
    source_lang: str, target_lang: str, limits: Limits, splittable: bool
) -> dict[str, Callable[[str], dict[str, Any]]]:
    """For each request model's name, the JSON schema of its body in a given content type: the model's
    fields with the language pair, the limits and the values the server takes."""
    sources, targets = [source_lang, "auto"], [target_lang]

    def libretranslate(kind: str) -> dict[str, Any]:
        return _constrained(
            LibreTranslateRequest,
            {
                "q": _texts(limits, kind != "application/json"),
                "source": _languages(sources),
                "target": _languages(targets),
                "format": {"enum": ["text"]},
                "alternatives": {"maximum": limits.max_alternatives}
                if kind != "application/json"
                else _json_alternatives(limits.max_alternatives),
            },
        )

    def detect(kind: str) -> dict[str, Any]:
        return _constrained(DetectRequest, {"q": _texts(limits, kind != "application/json", NOT_BLANK)})

    def translate_file(kind: str) -> dict[str, Any]:
        schema = _constrained(
            TranslateFileRequest, {"source": _languages(sources), "target": _languages(targets)}
        )
        schema["properties"]["file"] = {
            "type": "string",
            "contentMediaType": "text/plain",
            "maxLength": limits.max_characters,
            "description": "the text to translate line by line: a file named *.txt (UTF-8), or a text part",
        }
        schema["required"] = ["file", *schema.get("required", [])]
        return schema

    def native(kind: str) -> dict[str, Any]:
        schema = _constrained(
            TranslateRequest,
            {
                "q": _texts(limits, kind != "application/json"),
                "n_best": {"maximum": limits.max_alternatives + 1},
                "source": _languages(sources, nullable=True),
                "target": _languages(targets, nullable=True),
            },
        )
        if not splittable:
            schema["properties"]["split_sentences"]["enum"] = [False]
            return schema
        # A text split into sentences is translated as one hypothesis (n_best 1).
        split = copy.deepcopy(schema)
        split["properties"]["split_sentences"]["enum"] = [True]
        split["properties"]["n_best"]["enum"] = [1]
        split["required"] = [*schema["required"], "split_sentences"]
        whole = copy.deepcopy(schema)
        whole["properties"]["split_sentences"]["enum"] = [False]
        return {"title": schema["title"], "description": schema["description"], "anyOf": [whole, split]}

    return {
        "LibreTranslateRequest": libretranslate,
        "DetectRequest": detect,
        "TranslateFileRequest": translate_file,
        "TranslateRequest": native,
    }


def _without_null(schema: Any) -> Any:
    """`schema` with every "null" alternative (anyOf) left out: a form or a query string has no null."""
    if isinstance(schema, list):
        return [_without_null(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: _without_null(value) for key, value in schema.items()}
    choices = result.get("anyOf")
    if isinstance(choices, list) and {"type": "null"} in choices:
        kept = [choice for choice in choices if choice != {"type": "null"}]
        del result["anyOf"]
        result |= kept[0] if len(kept) == 1 else {"anyOf": kept}
    return result


def request_body(schema_of: Callable[[str], dict[str, Any]], *content_types: str) -> dict[str, Any]:
    """OpenAPI's requestBody for a route that reads its parameters itself, in each of `content_types`
    (null only in JSON)."""
    content = {
        kind: {"schema": schema_of(kind) if kind == "application/json" else _without_null(schema_of(kind))}
        for kind in content_types
    }
    return {"required": True, "content": content}


def install(app: FastAPI) -> None:
    """Make the application's `openapi()` method describe it with `ERROR_SCHEMA` among its components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = ["ERROR_SCHEMA", "NOT_BLANK", "error_responses", "install", "request_bodies", "request_body"]
