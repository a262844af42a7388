"""Running the translation server: uvicorn on one host and port, guarded against clients that send slowly or
not at all, the language pair a trained model records, and the checks made before a model loads (the port
is free, the host is this machine's).

uvicorn itself waits as long as a client likes for a request's headers and body, keeps as many connections
open as the process may open files, and answers a request it cannot parse, or one over its own concurrency
limit, in plain text. `GuardedH11Protocol` gives each request `Timeouts.header_s` for its headers and then
`Timeouts.body_s` for its body, answers 408 in JSON when one runs out, answers a malformed request 400 in
JSON, and answers a connection beyond `max_connections` 503 in JSON, so that every answer has the server's
one error shape. A request that gives both Content-Length and Transfer-Encoding is refused 400 (JSON) and
its connection closed (RFC 9112, section 6.1): a proxy in front that framed it by Content-Length would read
the rest of its chunked body as a request of its own (request smuggling). A SIGTERM or Ctrl-C stops the
server once the requests in flight are answered (`Timeouts.shutdown_s` at most), and the process exits 0; a
second one, however late it comes, ends it at once.

uvicorn trusts X-Forwarded-For from 127.0.0.1 unless told otherwise, which would let any process on the
machine pass for any address (and so escape a request rate): here the headers are read only where
`server_for` is given `proxy_headers`, and only from the `forwarded_allow_ips` it names.
"""

import asyncio
import contextlib
import errno
import ipaddress
import json
import os
import resource
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from types import FrameType
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import HANDLED_SIGNALS

from ..common.model_location import RESULTS_FILE, read_json_object

LOOPBACK_HOSTS = ("localhost",)
# Seconds a refused client has to read its answer before the connection closes.
LINGER_S = 2.0
# Seconds after which a client refused for want of a connection may try again.
CONNECTIONS_RETRY_AFTER_S = 1
# Of the process's open-file limit, the share connections may take: the rest is the server's own (the
# model's files, uploads, logs, the worker's threads).
CONNECTION_SHARE_OF_FILES = 0.5
# Of the machine's memory, the share connections may take, at two bodies' worth each (the bytes read, and
# the fields parsed from them).
CONNECTION_SHARE_OF_MEMORY = 0.25


@dataclass(frozen=True)
class Timeouts:
    """How long a client has, in seconds: `header_s` for a request's line and headers (from its first byte,
    or from the connection for its first request), then `body_s` for its body; `keep_alive_s` an idle
    connection is kept for its next request; `shutdown_s` the requests in flight have to finish once a stop
    is asked for (those still running then are answered 503)."""

    header_s: float = 10.0
    body_s: float = 30.0
    keep_alive_s: float = 5.0
    shutdown_s: float = 30.0

    def __post_init__(self) -> None:
        if min(self.header_s, self.body_s, self.keep_alive_s, self.shutdown_s) <= 0:
            raise ValueError("every timeout must be above 0 seconds.")


def json_error_response(status: int, message: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 response of `status` with the body {"error": message} (and Retry-After where
    given), closing the connection: what the protocol sends where no request reached the app."""
    body = json.dumps({"error": message}).encode()
    retry = f"retry-after: {retry_after}\r\n" if retry_after is not None else ""
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{retry}connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def default_max_connections(bytes_per_request: int) -> int:
    """The open connections a server takes at most unless told: half the process's open-file limit (the
    soft limit, `ulimit -n`), and no more than a quarter of the machine's memory holds at two requests'
    worth each (`bytes_per_request`: the largest request read), whichever is fewer; at least 1."""
    files, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    by_files = files * CONNECTION_SHARE_OF_FILES if files != resource.RLIM_INFINITY else float("inf")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    by_memory = memory * CONNECTION_SHARE_OF_MEMORY / (2 * bytes_per_request)
    return max(1, int(min(by_files, by_memory)))


def parse_forwarded_allow_ips(text: str) -> str:
    """`--forwarded-allow-ips`: the comma-separated addresses and networks (such as 10.0.0.1 or
    192.168.0.0/16, IPv4 or IPv6) of the proxies whose X-Forwarded-For is trusted, or "*" for any, as
    uvicorn takes them; a ValueError names one that is neither."""
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    if not entries:
        raise ValueError("--forwarded-allow-ips: give the proxies' addresses, e.g. 127.0.0.1 or 10.0.0.0/8.")
    for entry in entries:
        if entry == "*":
            continue
        try:
            ipaddress.ip_network(entry) if "/" in entry else ipaddress.ip_address(entry)
        except ValueError:
            raise ValueError(
                f"--forwarded-allow-ips: {entry!r} is not an IP address or network; write e.g. 127.0.0.1, "
                "::1 or 10.0.0.0/8, comma-separated, or * for any."
            ) from None
    return ",".join(entries)


AMBIGUOUS_FRAMING = (
    "the request gives both Content-Length and Transfer-Encoding, which frame its body differently; send "
    "one of them."
)


class SingleFramingConnection(h11.Connection):
    """h11's server side, refusing a request whose head gives both Content-Length and Transfer-Encoding: h11
    would frame its body by Transfer-Encoding and keep the connection for the next request, while a proxy
    that framed it by Content-Length would see a different next request. `refused` holds why it was
    refused (None: nothing was)."""

    refused: str | None = None

    def next_event(self) -> object:
        event = super().next_event()
        if isinstance(event, h11.Request):
            names = {name for name, _ in event.headers}
            if b"content-length" in names and b"transfer-encoding" in names:
                self.refused = AMBIGUOUS_FRAMING
                raise h11.RemoteProtocolError(AMBIGUOUS_FRAMING, error_status_hint=400)
        return event


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a clock on each request: its headers must arrive within
    `timeouts.header_s` and its body within `timeouts.body_s` after them, or it is answered 408 (JSON) and
    the connection closed; a connection that sends nothing is closed. A request that cannot be parsed is
    answered 400 (JSON). A connection that would make more than `max_connections` open is answered 503
    (JSON, with Retry-After) as it opens, and closed. A request with both Content-Length and
    Transfer-Encoding is answered 400 (JSON) before the app sees it, and the connection closed
    (`SingleFramingConnection`). Subclassed per server by `guarded_protocol`, which sets `timeouts` and
    `max_connections`."""

    timeouts = Timeouts()
    max_connections: int | None = None

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        # As uvicorn makes its own, with the head's size limit `server_for` sets.
        self.conn = SingleFramingConnection(h11.SERVER, config.h11_max_incomplete_event_size or 64 * 1024)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._clock: asyncio.TimerHandle | None = None
        self._phase: str | None = None
        self._closing_after_answer = False
        super().connection_made(transport)
        # uvicorn counts this connection among the server's open ones already.
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            self._answer_and_close(
                503,
                f"the server holds as many connections as it takes ({self.max_connections}); retry in a "
                "moment, or reuse an open connection.",
                CONNECTIONS_RETRY_AFTER_S,
            )
            return
        self._watch()

    def data_received(self, data: bytes) -> None:
        if self._closing_after_answer:
            return  # the rest of a refused request
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_clock()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        refused = getattr(self.conn, "refused", None)
        self._answer_and_close(
            400,
            refused
            or "the server cannot parse this HTTP request (its request line, a header or Content-Length is "
            "malformed, or its head is too long); send a well-formed HTTP/1.1 request.",
        )

    def _answer_and_close(self, status: int, message: str, retry_after: int | None = None) -> None:
        """Send the JSON error and close the connection once the client has had time to read it: closed at
        once, with the client still sending, the connection would be reset and the answer lost."""
        self._stop_clock()
        self._closing_after_answer = True
        self.transport.write(json_error_response(status, message, retry_after))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    def _stop_clock(self) -> None:
        if self._clock is not None:
            self._clock.cancel()
        self._clock, self._phase = None, None

    def _watch(self) -> None:
        """Start the clock of the phase the connection is in, where it changed: "head" while a request's
        headers are awaited, "body" while its body is; none between requests of a kept-alive connection
        (uvicorn's keep-alive timeout closes it) or once the request has arrived."""
        state = self.conn.their_state
        phase = None
        if self.transport.is_closing():
            phase = None
        elif state is h11.IDLE and (self.conn.trailing_data[0] or self.timeout_keep_alive_task is None):
            phase = "head"
        elif state is h11.SEND_BODY:
            phase = "body"
        if phase == self._phase:
            return
        self._stop_clock()
        if phase is not None:
            seconds = self.timeouts.header_s if phase == "head" else self.timeouts.body_s
            self._phase = phase
            self._clock = self.loop.call_later(seconds, self._time_is_up, phase)

    def _time_is_up(self, phase: str) -> None:
        self._clock, self._phase = None, None
        if self.transport.is_closing() or self._closing_after_answer:
            return
        cycle = self.cycle if phase == "body" else None
        if cycle is not None:
            # The app, waiting for the rest of the body, is told the client has gone.
            cycle.disconnected = True
            cycle.message_event.set()
        if phase == "head" and not self.conn.trailing_data[0]:
            self.transport.close()  # nothing of a request came: nobody to answer
        elif cycle is not None and cycle.response_started:
            self.transport.close()  # answered already; the rest of the body is not waited for
        else:
            limit = self.timeouts.header_s if phase == "head" else self.timeouts.body_s
            what = "headers" if phase == "head" else "body"
            self._answer_and_close(
                408,
                f"the request's {what} did not arrive within {limit:g} s; send the whole request at once.",
            )


def guarded_protocol(timeouts: Timeouts, max_connections: int | None = None) -> type[GuardedH11Protocol]:
    """`GuardedH11Protocol` with `timeouts`, taking at most `max_connections` (None: no limit)."""
    attributes = {"timeouts": timeouts, "max_connections": max_connections}
    return type("GuardedH11Protocol", (GuardedH11Protocol,), attributes)


def exit_status(sig: int) -> int:
    """The status the process ends with when a signal stops it: 0 for SIGTERM (a stop asked for), 130 (128 +
    2, as a shell reports an interrupted command) for SIGINT."""
    return 128 + signal.SIGINT if sig == signal.SIGINT else 0


class GracefulServer(uvicorn.Server):
    """uvicorn's server whose stop on SIGTERM or Ctrl-C ends the process with status 0: uvicorn raises the
    signal again once it has stopped, which ends the process by the signal.

    A second signal ends the process at once, with `exit_status` and one line on stderr, and without
    Python's shutdown: that would cancel the requests' tasks mid-answer and tear down the interpreter under
    the worker thread still decoding in torch, which aborts the process (SIGABRT). Once a signal has stopped
    the server, the process is on its way out with status 0, and a further SIGTERM or SIGINT is ignored:
    uvicorn would put back the default handlers (SIGTERM's kills the process by the signal, SIGINT's raises
    KeyboardInterrupt wherever the interpreter is), and Python puts them back itself for a handler of its
    own while the interpreter shuts down, but leaves an ignored signal ignored."""

    stopped_by_signal = False

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, signal.SIG_IGN if self.stopped_by_signal else handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.stopped_by_signal = True
        if self.should_exit:
            name = signal.Signals(sig).name
            # Python's buffered streams hold what was logged; nothing else is written past this point.
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os.write(2, f"{name} again: stopping now, without answering the requests in flight.\n".encode())
            os._exit(exit_status(sig))
        self.should_exit = True


def server_for(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 8000,
    timeouts: Timeouts | None = None,
    max_head_bytes: int = 64 * 1024,
    log_level: str = "info",
    max_connections: int | None = None,
    forwarded_allow_ips: str | None = None,
) -> GracefulServer:
    """The uvicorn server of `app` on `host`:`port`, with `timeouts`, accepting a request line and headers
    of up to `max_head_bytes` (a query string carries a whole text for the clients that send it so) and
    at most `max_connections` open connections (None: no limit). X-Forwarded-For and X-Forwarded-Proto
    are read only from the proxies `forwarded_allow_ips` names (`parse_forwarded_allow_ips`; None: from
    none). `.run()` serves until SIGINT or SIGTERM. Each request is logged at log level "debug" only: under
    load a line a request would drown the rest."""
    timeouts = timeouts or Timeouts()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(timeouts, max_connections),
        proxy_headers=forwarded_allow_ips is not None,
        # Named even where no headers are read: uvicorn would take $FORWARDED_ALLOW_IPS or 127.0.0.1.
        forwarded_allow_ips=forwarded_allow_ips or "",
        h11_max_incomplete_event_size=max_head_bytes,
        timeout_keep_alive=timeouts.keep_alive_s,
        timeout_graceful_shutdown=timeouts.shutdown_s,
        log_level=log_level,
        access_log=log_level == "debug",
    )
    return GracefulServer(config)


def recorded_languages(model: str | Path) -> tuple[str, str] | None:
    """The (source, target) language codes that a model trained by `vanilla-transformer train` records in
    its results.json; None for a model without one (a Hub id, a converted or exported model)."""
    path = Path(model) / RESULTS_FILE
    if not path.is_file():
        return None
    results = read_json_object(path, "train the model again, or give --source-lang and --target-lang")
    source, target = results.get("src_lang"), results.get("tgt_lang")
    return (source, target) if isinstance(source, str) and isinstance(target, str) else None


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_port(host: str, port: int) -> None:
    """A one-line ValueError if `port` cannot be bound on `host` now (in use, or not this machine's
    address), checked before the model loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except socket.gaierror:
            raise ValueError(f"--host {host}: not a host name or address of this machine.") from None
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise ValueError(f"--port {port}: in use on {host}; give another port.") from None
            if error.errno == errno.EACCES:
                raise ValueError(
                    f"--port {port}: this user may not listen on it; give a port above 1023."
                ) from None
            raise ValueError(
                f"--host {host} --port {port}: cannot listen there ({error.strerror})."
            ) from None


__all__ = [
    "GracefulServer",
    "GuardedH11Protocol",
    "SingleFramingConnection",
    "Timeouts",
    "check_port",
    "default_max_connections",
    "exit_status",
    "guarded_protocol",
    "is_loopback",
    "json_error_response",
    "parse_forwarded_allow_ips",
    "recorded_languages",
    "server_for",
]
