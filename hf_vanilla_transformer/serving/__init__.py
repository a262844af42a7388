"""Serving translations over HTTP: LibreTranslate's API and a native one with scores and alignments,
parameters read wherever a client puts them (`fields`), one running batch that requests join and leave
between decoding steps (`iteration_scheduler`) or fair batches across requests (`batcher`),
per-request limits, API keys and request rates (`limits`), language detection (`detection`), translated
files kept for download (`files`), cross-origin access (`middleware`), a web page that shows the attention
(`static/`), and the uvicorn server with its timeouts (`server`). Needs the `serve` extra: pip install -e
'.[serve]'.
"""

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .app import SCHEDULERS, ServerSettings, create_app, translator_decode
    from .batcher import Batcher, QueueFull, Scheduler
    from .iteration_scheduler import IterationScheduler
    from .limits import ApiKeys, Limits, Refusal, RequestRate, read_api_keys
    from .middleware import parse_origins
    from .server import (
        Timeouts,
        check_port,
        default_max_connections,
        is_loopback,
        parse_forwarded_allow_ips,
        recorded_languages,
        server_for,
    )

__all__ = [
    "SCHEDULERS",
    "ApiKeys",
    "Batcher",
    "IterationScheduler",
    "Limits",
    "QueueFull",
    "Refusal",
    "RequestRate",
    "Scheduler",
    "ServerSettings",
    "Timeouts",
    "check_port",
    "create_app",
    "default_max_connections",
    "is_loopback",
    "parse_forwarded_allow_ips",
    "parse_origins",
    "read_api_keys",
    "recorded_languages",
    "server_for",
    "translator_decode",
]

__getattr__, __dir__ = lazy_exports(__name__, __file__)
