"""A request's parameters, wherever its client puts them, as LibreTranslate reads them: the query string,
and a JSON object, a form (urlencoded) or a multipart form body. The body's fields win over the query's.

In a form or a query string a repeated `q` is a list of texts, and a text's line ends are "\\n" (a browser
sends a text area's as "\\r\\n"), so that its characters count as LibreTranslate counts them. The body is
read up to a byte cap, and refused (413) before it is read whole where it declares more. Every text a
request holds, each field's name and value and a file's name, is checked here to be Unicode text: JSON's
"\\ud800" escapes can carry a lone surrogate, which no text may hold (422, naming the field).
"""

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Message

from .limits import Refusal

FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
# The fields a multipart body may hold besides its texts: LibreTranslate's, with room for what clients add.
MAX_FORM_FIELDS = 64


class ClientGone(Exception):
    """The client went away before its request was read or translated."""


@dataclass(frozen=True)
class Upload:
    """A file sent in a multipart form: its name as the client gave it, and its bytes."""

    filename: str
    content: bytes


@dataclass
class Fields:
    """A request's parameters: `values` (text, or a list of texts for a repeated `q`, or what a JSON body
    holds) and the `files` of a multipart form, by field name; `json`: whether the body was JSON, whose
    values have JSON's types (else every value is text)."""

    values: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Upload] = field(default_factory=dict)
    json: bool = False


def content_type(request: Request) -> str:
    """The media type of a request's body, lower case, without its parameters."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _pairs_to_values(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Form or query fields: a repeated `q` is a list of texts, any other field its first value; texts
    with "\\n" line ends."""
    values: dict[str, Any] = {}
    texts = [text.replace("\r\n", "\n") for key, text in pairs if key == "q"]
    for key, value in pairs:
        values.setdefault(key, value)
    if texts:
        values["q"] = texts if len(texts) > 1 else texts[0]
    return values


def _urlencoded(data: bytes, what: str) -> list[tuple[str, str]]:
    try:
        text = data.decode("utf-8")
        return parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text), errors="strict")
    except ValueError as error:  # not UTF-8, or not name=value pairs
        raise Refusal(422, f"the {what} is not form fields: {str(error)[:200]}") from None


def check_text(values: dict[str, Any], files: dict[str, Upload]) -> None:
    """Refuse (422) a request whose field names, texts (at any depth of a JSON body) or file names are not
    Unicode text: a lone surrogate, which cannot be encoded, nor translated, nor answered back. The error
    names the field (q, source, q[1], ...), and shows no more of the bad text than its code point."""
    for name, upload in files.items():
        _check_encodable(upload.filename, f"the file name in field {name}")
    pending: list[tuple[str | None, Any]] = [(None, values)]
    while pending:  # a stack, not recursion: a JSON body may nest as deep as its parser allows
        name, value = pending.pop()
        if isinstance(value, str):
            _check_encodable(value, f"field {name}")
        elif isinstance(value, list):
            pending += [(f"{name}[{index}]", item) for index, item in enumerate(value)]
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_encodable(key, f"a field name in {name or 'the request'}")
                pending.append((key if name is None else f"{name}.{key}", item))


def _check_encodable(text: str, what: str) -> None:
    """Refuse (422) `text`, `what` the request calls it, if it holds a lone surrogate."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise Refusal(
            422,
            f"{what} is not valid text: it holds a lone surrogate (U+{ord(text[error.start]):04X}) at "
            f"character {error.start}; send UTF-8 text (in JSON, a \\ud800-\\udbff escape must be "
            "followed by a \\udc00-\\udfff one).",
        ) from None


async def read_body(request: Request, cap: int) -> bytes:
    """The body of `request`, refused (413) once it is over `cap` bytes, or before it is read where its
    Content-Length says so."""
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
    return bytes(body)


async def _multipart(request: Request, body: bytes, max_texts: int) -> Fields:
    """The fields and files of a multipart form `body` (already read, within its cap), of at most
    `max_texts` texts and `MAX_FORM_FIELDS` other fields."""

    async def replay() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_files=1, max_fields=max_texts + MAX_FORM_FIELDS)
    except HTTPException as error:
        raise Refusal(422, f"the body is not multipart form data: {error.detail}") from None
    pairs, files = [], {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            files[key] = Upload(value.filename or "", await value.read())
        else:
            pairs.append((key, value))
    return Fields(_pairs_to_values(pairs), files)


async def read_fields(request: Request, cap: int, max_texts: int = 0) -> Fields:
    """The parameters of `request`: its query string's, updated with its body's (a JSON object, a form or a
    multipart form of up to `max_texts` texts; an empty body adds none). A body that is not what its type
    says, or a field that is not text, is a 422."""
    query = _pairs_to_values(_urlencoded(request.scope["query_string"], "query string"))
    body = await read_body(request, cap)
    kind = content_type(request)
    if kind == MULTIPART:
        fields = await _multipart(request, body, max_texts)
    elif kind == FORM:
        fields = Fields(_pairs_to_values(_urlencoded(body, "body")))
    elif not body:
        fields = Fields()
    else:
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as error:  # not UTF-8, not JSON, nested too deep
            raise Refusal(422, f"the body is not a JSON object: {str(error)[:200]}") from None
        if not isinstance(data, dict):
            raise Refusal(422, f"the body is a JSON {type(data).__name__}; send a JSON object.")
        fields = Fields(data, json=True)
    merged = Fields({**query, **fields.values}, fields.files, fields.json)
    check_text(merged.values, merged.files)
    return merged


__all__ = [
    "FORM",
    "MULTIPART",
    "ClientGone",
    "Fields",
    "Upload",
    "check_text",
    "content_type",
    "read_body",
    "read_fields",
]
