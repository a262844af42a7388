"""Running the translation server: uvicorn on one host and port, the language pair a trained model records,
and the checks made before a model loads (the port is free, the host is this machine's)."""

import errno
import ipaddress
import socket
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from ..model_location import RESULTS_FILE, read_json_object

LOOPBACK_HOSTS = ("localhost",)


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


def run_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve `app` with uvicorn until SIGINT or SIGTERM, which stop it once the requests in flight are
    answered (uvicorn's graceful shutdown: no new connections, then the app's shutdown). Each request is
    logged at `log_level` "debug" only: under load a line a request would drown the rest."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=log_level == "debug")
    uvicorn.Server(config).run()


__all__ = ["check_port", "is_loopback", "recorded_languages", "run_server"]
