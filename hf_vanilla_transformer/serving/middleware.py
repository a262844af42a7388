"""The ASGI layers around the server's app: cross-origin requests (`Cors`, for the origins `--cors` names),
the answer to a request still running when the server stops (`AnswerWhenStopped`), and HEAD answered
wherever GET is (`HeadAsGet`)."""

import asyncio
import json

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# What a page on another origin may send: LibreTranslate's methods, and the headers that carry a body's
# type and an API key.
CORS_METHODS = "GET, POST"
CORS_HEADERS = ("authorization", "content-type", "x-api-key")
# How long a browser may reuse a preflight's answer, in seconds.
CORS_MAX_AGE = 600


async def respond(send: Send, status: int, headers: dict[str, str], body: bytes = b"") -> None:
    """Answer with `status`, `headers` and `body`."""
    raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, data: object, headers: dict[str, str] | None = None) -> None:
    """Answer with `status` and the JSON `data`."""
    body = json.dumps(data).encode()
    fields = {"content-type": "application/json", "content-length": str(len(body)), **(headers or {})}
    await respond(send, status, fields, body)


def parse_origins(text: str) -> frozenset[str]:
    """The origins of `--cors`: "*" (any), or a comma-separated list of scheme://host[:port]. A ValueError
    names one that is not an origin."""
    origins = frozenset(origin.strip().rstrip("/") for origin in text.split(",") if origin.strip())
    if not origins:
        raise ValueError("--cors: give '*' or origins such as https://example.org,http://localhost:3000.")
    for origin in origins - {"*"}:
        scheme, _, rest = origin.partition("://")
        if scheme not in ("http", "https") or not rest or "/" in rest:
            raise ValueError(
                f"--cors: {origin!r} is not an origin; write scheme://host[:port], e.g. https://example.org."
            )
    return origins


class Cors:
    """Lets pages on `origins` ("*": any) call the app from a browser: a preflight (OPTIONS with
    Access-Control-Request-Method) from one of them is answered 204 with the methods and headers allowed,
    and every answer to one of them says it may read it. Requests from other origins pass through
    unmarked, so that the browser keeps their answers from the page; their preflights are answered 403."""

    def __init__(self, app: ASGIApp, origins: frozenset[str]):
        self.app, self.origins = app, origins

    def allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin in self.origins

    def _granted(self, origin: str) -> dict[str, str]:
        return {
            "access-control-allow-origin": "*" if "*" in self.origins else origin,
            "access-control-expose-headers": "Retry-After",
            "vary": "Origin",
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        preflight = scope["method"] == "OPTIONS" and "access-control-request-method" in headers
        if origin is None:
            await self.app(scope, receive, send)
        elif preflight:
            await self._preflight(origin, headers, send)
        elif self.allowed(origin):

            async def marked(message: Message) -> None:
                if message["type"] == "http.response.start":
                    MutableHeaders(scope=message).update(self._granted(origin))
                await send(message)

            await self.app(scope, receive, marked)
        else:
            await self.app(scope, receive, send)

    async def _preflight(self, origin: str, headers: Headers, send: Send) -> None:
        if not self.allowed(origin):
            await send_json(send, 403, {"error": f"pages on {origin} may not call this server."})
            return
        method = headers["access-control-request-method"]
        asked = headers.get("access-control-request-headers", "").split(",")
        refused = [name.strip().lower() for name in asked if name.strip().lower() not in ("", *CORS_HEADERS)]
        if method not in ("GET", "POST", "HEAD") or refused:
            what = f"the headers {', '.join(refused)}" if refused else f"the method {method}"
            message = (
                f"{what} may not be sent from another origin; send {CORS_METHODS} with at most "
                f"{', '.join(CORS_HEADERS)}."
            )
            await send_json(send, 403, {"error": message})
            return
        granted = {
            **self._granted(origin),
            "access-control-allow-methods": CORS_METHODS,
            "access-control-allow-headers": ", ".join(CORS_HEADERS),
            "access-control-max-age": str(CORS_MAX_AGE),
        }
        await respond(send, 204, granted)


class AnswerWhenStopped:
    """Answers 503 (JSON, with Retry-After) a request whose handling the server cancels because it is
    stopping and the request ran past the time it had to finish; uvicorn would answer it in plain text."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            # The server cancels the request's task when its time to stop has passed; the answer ends it.
            if not started:
                message = "the server is stopping and could not finish this request; send it again later."
                await send_json(send, 503, {"error": message}, {"retry-after": "5", "connection": "close"})


class HeadAsGet:
    """Answers a HEAD request as the same GET request would be answered, status and headers (Content-Length
    included), without the body (RFC 9110, section 9.3.2): FastAPI's routes take only the methods they
    name, so a HEAD to a page or a GET endpoint would be answered 405."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


__all__ = ["AnswerWhenStopped", "Cors", "HeadAsGet", "parse_origins", "respond", "send_json"]
