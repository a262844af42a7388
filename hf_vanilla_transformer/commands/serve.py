"""Serve translations over HTTP: LibreTranslate's API, a native one with scores and alignments, and a web
page that shows the attention, with requests batched together as they arrive.

    vanilla-transformer serve --model runs/demo/model
    vanilla-transformer serve --model runs/demo/ct2 --engine ctranslate2 --port 8080 --api-keys keys.txt

The server listens on 127.0.0.1 (this machine only) unless --host says otherwise; open http://127.0.0.1:8000/
for the page and /docs for the API. A client has --header-timeout seconds for a request's headers and
--body-timeout for its body, then is answered 408; an idle connection is closed after --keep-alive-timeout,
and one beyond --max-connections is answered 503. SIGTERM or Ctrl-C stops it once the requests in flight
are answered (--shutdown-timeout at most), with exit status 0; a second one stops it at once (0, or 130
for Ctrl-C). X-Forwarded-For is read only with --proxy-headers, from the --forwarded-allow-ips proxies.
docs/serve.md shows the API with curl.
"""

import argparse
import importlib.util

from ..common.cli import (
    ArgumentParser,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    refusals_in_one_line,
    run_command,
)
from ..inference.long_segments import check_max_tokens
from .engine_options import add_engine_arguments, command_device, command_engine, load_command_translator

LOG_LEVELS = ("debug", "info", "warning", "error")


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--model", required=True, help="model folder, exported folder or Hub id")
    add_engine_arguments(parser, "decodes", runtime=True)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 opens the server to other machines"
    )
    parser.add_argument("--port", type=positive_int, default=8000, help="TCP port to listen on")
    parser.add_argument(
        "--source-lang", help="the model's source language code (default: what its results.json records)"
    )
    parser.add_argument(
        "--target-lang", help="the model's target language code (default: what its results.json records)"
    )
    parser.add_argument(
        "--scheduler",
        default="auto",
        help="iteration: every request's texts decode in one running batch that each text joins and leaves "
        "between decoding steps, so a long text never holds a short one behind it (PyTorch engine, the "
        "paper's beam search or greedy search); batch: whole batches of a token budget (--max-batch-tokens), "
        "as the exported engines decode; auto (default): iteration where it applies, else batch",
    )
    parser.add_argument(
        "--max-running",
        type=positive_int,
        default=32,
        help="texts (segments) the running batch of iteration scheduling decodes together at most; more "
        "wait for a place, each request taking its turn",
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=positive_int,
        default=256,
        help="batch scheduling: source tokens a batch holds at most, padding included (its segments times "
        "its longest); on CPUs small batches decode fastest, a GPU takes larger ones",
    )
    parser.add_argument(
        "--max-segment-tokens",
        type=non_negative_int,
        default=128,
        help="batch scheduling: a text (or sentence) of more tokens, which no sentence splitter could split, "
        "is cut into pieces of at most this many, each a work item of its own, their translations joined, "
        "so that it cannot hold the worker for long; 0: never cut",
    )
    parser.add_argument(
        "--max-wait-ms",
        type=non_negative_float,
        default=10.0,
        help="batch scheduling: how long a batch waits after its first request for others to join it",
    )
    parser.add_argument(
        "--max-queue", type=positive_int, default=256, help="requests waiting at most; more are answered 503"
    )
    parser.add_argument(
        "--no-batching",
        action="store_true",
        help="batch scheduling, one request a batch (to measure what batching across requests gains)",
    )
    parser.add_argument(
        "--char-limit",
        dest="max_characters",
        type=positive_int,
        default=5000,
        help="characters a request holds at most, over all its texts, counted as LibreTranslate counts them "
        "(an emoji or a Chinese character is one)",
    )
    parser.add_argument(
        "--batch-limit",
        dest="max_segments",
        type=positive_int,
        default=64,
        help="texts (segments) a request holds at most",
    )
    parser.add_argument(
        "--req-limit",
        dest="requests_per_minute",
        type=positive_int,
        help="requests a minute each client may send to translate or detect, as LibreTranslate's "
        "--req-limit: that many at once, then one every 60/N seconds; more are answered 429 with "
        "Retry-After. A client is its API key where --api-keys is given, else its address (default: no "
        "limit)",
    )
    parser.add_argument(
        "--header-timeout",
        type=positive_float,
        default=10.0,
        help="seconds a client has to send a request's line and headers; then 408",
    )
    parser.add_argument(
        "--body-timeout",
        type=positive_float,
        default=30.0,
        help="seconds a client has to send a request's body once its headers are in; then 408",
    )
    parser.add_argument(
        "--keep-alive-timeout",
        type=positive_float,
        default=5.0,
        help="seconds an idle connection is kept open for its client's next request",
    )
    parser.add_argument(
        "--max-connections",
        type=positive_int,
        help="connections open at once at most; more are answered 503 (default: half the open-file limit, "
        "ulimit -n, and no more than a quarter of the memory holds at twice the largest request each)",
    )
    parser.add_argument(
        "--proxy-headers",
        action="store_true",
        help="behind a reverse proxy: take a request's address (for --req-limit) and scheme from the "
        "X-Forwarded-For and X-Forwarded-Proto headers of the proxies --forwarded-allow-ips names "
        "(default: the peer's address; the headers are ignored)",
    )
    parser.add_argument(
        "--forwarded-allow-ips",
        metavar="ADDRESSES",
        help="with --proxy-headers: the comma-separated addresses or networks of the proxies to trust, "
        "such as 127.0.0.1 or 10.0.0.0/8, or * for any (default: none)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=positive_float,
        default=30.0,
        help="seconds the requests in flight have to finish after SIGTERM or Ctrl-C; those still running "
        "then are answered 503",
    )
    parser.add_argument(
        "--cors",
        metavar="ORIGINS",
        help="let web pages on these origins call the server from a browser: '*' for any, or a "
        "comma-separated list such as https://example.org,http://localhost:3000 (default: none)",
    )
    parser.add_argument(
        "--api-keys",
        metavar="FILE",
        help="a file of API keys, one a line: requests without one are answered 401, with another 403",
    )
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, default="info", help="debug logs every request and every batch"
    )
    return parser


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Load the model, then serve it until SIGTERM or Ctrl-C."""
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        parser.error("serving needs FastAPI and uvicorn: pip install 'hf-vanilla-transformer[serve]'.")
    import logging

    from ..serving import (
        ApiKeys,
        Limits,
        ServerSettings,
        Timeouts,
        check_port,
        create_app,
        default_max_connections,
        is_loopback,
        parse_forwarded_allow_ips,
        parse_origins,
        read_api_keys,
        recorded_languages,
        server_for,
    )

    engine = command_engine(args, parser)
    with refusals_in_one_line(parser):
        check_port(args.host, args.port)
        keys = ApiKeys(read_api_keys(args.api_keys)) if args.api_keys else ApiKeys()
        recorded = recorded_languages(args.model)
        cors = parse_origins(args.cors) if args.cors is not None else frozenset()
        proxies = parse_forwarded_allow_ips(args.forwarded_allow_ips) if args.forwarded_allow_ips else None
        if args.max_segment_tokens:
            check_max_tokens(args.max_segment_tokens)
    if args.proxy_headers != (proxies is not None):
        parser.error(
            "--proxy-headers and --forwarded-allow-ips go together: the first reads X-Forwarded-For, the "
            "second names the proxies it is read from (e.g. --forwarded-allow-ips 127.0.0.1)."
        )
    languages = (args.source_lang, args.target_lang)
    if None in languages:
        if recorded is None:
            parser.error(
                f"{args.model} records no language pair (results.json): give --source-lang and --target-lang."
            )
        languages = tuple(given or found for given, found in zip(languages, recorded))
    translator = load_command_translator(args, parser, engine)
    device = command_device(args, engine, parser)
    beams = translator.model.generation_config.num_beams or 1
    settings = ServerSettings(
        source_lang=languages[0],
        target_lang=languages[1],
        limits=Limits(args.max_characters, args.max_segments, max_alternatives=beams - 1),
        api_keys=keys,
        max_batch_tokens=args.max_batch_tokens,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        batching=not args.no_batching,
        cors=cors,
        requests_per_minute=args.requests_per_minute,
        scheduler=args.scheduler,
        max_running=args.max_running,
        max_segment_tokens=args.max_segment_tokens or None,
    )
    with refusals_in_one_line(parser):
        app = create_app(translator, settings)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:     %(message)s")
    log = logging.getLogger(__name__)
    if not is_loopback(args.host) and not keys.keys:
        log.warning("listening on %s without --api-keys: anyone who reaches it may translate.", args.host)
    log.info(
        "serving %s (%s on %s, %s to %s) at http://%s:%d/ (API docs at /docs)",
        args.model,
        engine.name,
        device,
        *languages,
        args.host,
        args.port,
    )
    timeouts = Timeouts(
        header_s=args.header_timeout,
        body_s=args.body_timeout,
        keep_alive_s=args.keep_alive_timeout,
        shutdown_s=args.shutdown_timeout,
    )
    max_bytes = settings.limits.max_body_bytes
    max_connections = args.max_connections or default_max_connections(max_bytes)
    log.info("taking %d connections at most", max_connections)
    server_for(
        app,
        host=args.host,
        port=args.port,
        timeouts=timeouts,
        max_head_bytes=max_bytes,
        log_level=args.log_level,
        max_connections=max_connections,
        forwarded_allow_ips=proxies,
    ).run()


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer serve ARGV`."""
    return run_command(run, build_parser(), argv)
