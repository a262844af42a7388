"""Serving translations over HTTP: LibreTranslate's API and a native one with scores and alignments,
batching across requests (`batcher`), per-request limits and API keys (`limits`), a web page that shows the
attention (`static/`), and the uvicorn server (`server`). Needs the `serve` extra: pip install -e '.[serve]'.
"""

from .app import ServerSettings, create_app, translator_decode
from .batcher import Batcher, QueueFull
from .limits import ApiKeys, Limits, Refusal, read_api_keys
from .server import check_port, is_loopback, recorded_languages, run_server

__all__ = [
    "ApiKeys",
    "Batcher",
    "Limits",
    "QueueFull",
    "Refusal",
    "ServerSettings",
    "check_port",
    "create_app",
    "is_loopback",
    "read_api_keys",
    "recorded_languages",
    "run_server",
    "translator_decode",
]
