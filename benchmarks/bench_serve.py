"""The translation server under a bounded local load: throughput, latency, errors and memory of
`vanilla-transformer serve`, every answer checked, batching across requests against one request a batch,
and faults mixed into the load.

    python benchmarks/bench_serve.py --model runs/demo/model
    python benchmarks/bench_serve.py --model runs/demo/model --threads 1 --budgets 128 256 512 1024 2048
    python benchmarks/bench_serve.py --model MODEL --data FILE --quick     # seconds: what the tests run

Each sentence of `--data` (default: Multi30k's test_2016_flickr.en) is first translated alone by the
library (`Translator.translate_n_best` one line at a time, split into sentences as the server's
`/translate` splits it): every answer the server gives under load must be exactly that. An answer that is
another sentence's translation is counted as mixed up, any other difference as garbled, a request without
an answer as lost. The same sentences translated as a file (batches of 64 sorted by length: what
`vanilla-transformer translate --split-sentences` does once the model is loaded) are the ceiling.

The load: asyncio clients on the loopback interface, each sending one sentence (LibreTranslate's
`POST /translate`) and the next once it is answered, for a bounded time. Runs:
- `--compare-clients` (32) clients against the server batching across requests and against the same server
  with `--no-batching` (one request a batch): `--rounds` paired rounds of `--compare-seconds` each, the two
  servers in alternating order (on a machine shared with other jobs, throughput drifts between minutes; the
  ratio of two runs seconds apart drifts less); with `--budgets`, a run against a server with each of those
  `--max-batch-tokens`;
- `--clients` (64) clients for `--seconds` against the batching server: sentences/s, source and target
  tokens/s, p50/p95/p99 latency, errors, the batches' sizes, the server's peak resident memory;
- faults, for `--fault-seconds`, against the batching server while 16 clients keep sending well-formed
  requests: clients that hang up mid-request, requests over the character limit (413) and malformed
  (422), and bursts of requests that fill the queue (503 with Retry-After). The well-formed answers must
  stay correct, and the server's resident memory must return to its level after the load (its baseline).

- fairness, `--fair-rounds` times: one client sends a paragraph of about `--paragraph-chars` (5000)
  characters, sentences of `--data` joined, to `POST /v1/translate` with `split_sentences`, while
  `--fair-clients` (4) clients send single sentences one after another to `POST /translate` until it is
  answered: the short requests' p50/p95/max latency beside the same requests' with no paragraph in the
  way, and the paragraph's own time, every answer checked (the paragraph against the library translating
  it sentence by sentence). `--fairness-only` runs this alone; `--server-code DIR` serves from the package
  in DIR instead (a checkout of another commit, to compare with):

    git worktree add /tmp/serve-before COMMIT
    python benchmarks/bench_serve.py --model MODEL --threads 1 --fairness-only --server-code /tmp/serve-before

Runs on this machine only: the server listens on a free port of 127.0.0.1.
"""

import argparse
import asyncio
import gc
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPOSITORY, machine_line, write_result  # noqa: E402

from hf_vanilla_transformer.inference.sentence_splitting import SPLITTER_LANGUAGES
from hf_vanilla_transformer.inference.translator import load_translator

MULTI30K_TEST = REPOSITORY.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.en"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """`vanilla-transformer serve` in a subprocess on a free port of 127.0.0.1, with its memory sampled."""

    def __init__(self, model: str, *args: str, code: str | None = None, wait: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "hf_vanilla_transformer", "serve", "--model", model]
        command += ["--port", str(self.port), "--log-level", "warning", *args]
        # `code`: a folder whose hf_vanilla_transformer package the server imports instead of this one
        # (python -m looks in its working folder first).
        environment = {**os.environ, "PYTHONPATH": code} if code else None
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=environment, cwd=code)
        self.peak_rss = 0
        self._stop = threading.Event()
        if wait:
            self.wait_until_up()

    def wait_until_up(self) -> "Server":
        """Wait for the server to answer /health, then sample its memory. Servers created with `wait`
        False start side by side: each then waits here."""
        deadline = time.monotonic() + 300
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"the server exited: {self.process.stderr.read()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not come up in 300 s") from None
                time.sleep(0.2)
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def rss(self) -> int:
        return psutil.Process(self.process.pid).memory_info().rss

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_rss = max(self.peak_rss, self.rss())
            time.sleep(0.05)

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/v1/stats", timeout=10).json()

    def stop(self) -> int:
        self._stop.set()
        self.process.terminate()
        self.process.communicate(timeout=120)
        return self.process.returncode


class Checker:
    """Checks answers against the sentences translated alone, and counts what is wrong."""

    def __init__(self, references: dict[str, str]):
        self.references = references
        self.by_translation = {}
        for source, translation in references.items():
            self.by_translation.setdefault(translation, set()).add(source)
        self.mixed_up = self.garbled = 0
        self.examples: list[dict] = []

    def check(self, source: str, answer: str) -> bool:
        if answer == self.references[source]:
            return True
        if answer in self.by_translation:
            self.mixed_up += 1
        else:
            self.garbled += 1
        if len(self.examples) < 5:
            self.examples.append({"source": source, "answer": answer, "alone": self.references[source]})
        return False


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def translate_body(source: str, target: str, text: str) -> dict:
    return {"q": text, "source": source, "target": target}


async def load(
    url: str,
    sentences: list[str],
    checker: Checker,
    languages: tuple[str, str],
    clients: int,
    seconds: float,
    lengths: dict[str, tuple[int, int]],
) -> dict:
    """`clients` clients, each sending the next sentence once its last is answered, for `seconds`."""
    latencies: list[float] = []
    counts = {"sent": 0, "answered": 0, "correct": 0, "errors": 0, "lost": 0}
    tokens = [0, 0]
    statuses: dict[str, int] = {}
    order = iter(range(10**9))
    stop_at = time.monotonic() + seconds

    async def client(http: httpx.AsyncClient) -> None:
        while time.monotonic() < stop_at:
            text = sentences[next(order) % len(sentences)]
            counts["sent"] += 1
            started = time.monotonic()
            try:
                response = await http.post(f"{url}/translate", json=translate_body(*languages, text))
            except httpx.HTTPError:
                counts["lost"] += 1
                continue
            latencies.append(time.monotonic() - started)
            statuses[str(response.status_code)] = statuses.get(str(response.status_code), 0) + 1
            if response.status_code != 200:
                counts["errors"] += 1
                continue
            counts["answered"] += 1
            if checker.check(text, response.json()["translatedText"]):
                counts["correct"] += 1
                tokens[0] += lengths[text][0]
                tokens[1] += lengths[text][1]

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120)) as http:
        started = time.monotonic()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        elapsed = time.monotonic() - started
    return {
        "clients": clients,
        "seconds": round(elapsed, 2),
        **counts,
        "statuses": statuses,
        "sentences_per_s": round(counts["correct"] / elapsed, 2),
        "source_tokens_per_s": round(tokens[0] / elapsed, 1),
        "target_tokens_per_s": round(tokens[1] / elapsed, 1),
        "latency_ms": {
            name: round(1000 * value, 1) if value is not None else None
            for name, value in (
                ("p50", percentile(latencies, 0.50)),
                ("p95", percentile(latencies, 0.95)),
                ("p99", percentile(latencies, 0.99)),
                ("max", max(latencies, default=None)),
            )
        },
    }


def overall(runs: list[dict]) -> dict:
    """Sentences and tokens a second over several runs together, and their requests per batch (batch
    scheduling)."""
    seconds = sum(run["seconds"] for run in runs)
    figures = {
        key: round(sum(run[key] * run["seconds"] for run in runs) / seconds, 2)
        for key in ("sentences_per_s", "source_tokens_per_s", "target_tokens_per_s")
    }
    figures["seconds"] = round(seconds, 2)
    batches = sum(run.get("batches", 0) for run in runs)
    if batches:
        requests = sum(run["answered"] + run["errors"] for run in runs)
        figures["mean_requests_per_batch"] = round(requests / batches, 2)
    return figures


def batch_sizes(before: dict, after: dict) -> dict:
    """What the server decoded between two /v1/stats readings: the batches and requests per batch (batch
    scheduling), or the decoding steps and the most requests one step held (iteration scheduling)."""
    if after.get("scheduler") == "iteration":
        return {
            "steps": after["steps"] - before["steps"],
            "max_requests_in_step": after["max_requests_in_step"],
            "max_running_segments": after["max_running_segments"],
        }
    batches = after["batches"] - before["batches"]
    requests = after["requests"] - before["requests"]
    return {
        "batches": batches,
        "mean_requests_per_batch": round(requests / batches, 2) if batches else None,
        "max_requests_in_batch": after["max_requests_in_batch"],
    }


async def faults(
    server: Server,
    sentences: list[str],
    checker: Checker,
    languages: tuple[str, str],
    seconds: float,
    max_characters: int,
    lengths: dict[str, tuple[int, int]],
    burst: int,
) -> dict:
    """Well-formed load from 16 clients while clients hang up, send oversize and malformed requests, and
    bursts fill the queue."""
    url = server.url
    seen: dict[str, dict[str, int]] = {}
    stop_at = time.monotonic() + seconds
    rng = random.Random(0)

    def count(kind: str, outcome: str) -> None:
        seen.setdefault(kind, {})
        seen[kind][outcome] = seen[kind].get(outcome, 0) + 1

    async def hang_up(http: httpx.AsyncClient) -> None:
        while time.monotonic() < stop_at:
            text = rng.choice(sentences)
            try:  # gives up after 5-50 ms: the server sees the connection close mid-request
                response = await http.post(
                    f"{url}/translate",
                    json=translate_body(*languages, text),
                    timeout=httpx.Timeout(rng.uniform(0.005, 0.05)),
                )
                count("hang_up", f"{response.status_code} before hanging up")
            except httpx.TimeoutException:
                count("hang_up", "hung up")
            await asyncio.sleep(0.01)

    async def oversize(http: httpx.AsyncClient) -> None:
        while time.monotonic() < stop_at:
            text = "a " * (max_characters // 2 + 10)
            response = await http.post(f"{url}/translate", json=translate_body(*languages, text))
            count("oversize", str(response.status_code))
            await asyncio.sleep(0.05)

    async def malformed(http: httpx.AsyncClient) -> None:
        bodies = [b"{not json", b'{"q": 5, "source": "en", "target": "de"}', b"[" * 3000, b"\xff\xfe"]
        while time.monotonic() < stop_at:
            response = await http.post(f"{url}/translate", content=rng.choice(bodies))
            count("malformed", str(response.status_code))
            await asyncio.sleep(0.05)

    async def bursts(http: httpx.AsyncClient) -> None:
        retry_after: list[int] = []
        while time.monotonic() < stop_at:
            texts = [rng.choice(sentences) for _ in range(burst)]
            responses = await asyncio.gather(
                *(http.post(f"{url}/translate", json=translate_body(*languages, t)) for t in texts),
                return_exceptions=True,
            )
            for text, response in zip(texts, responses):
                if isinstance(response, Exception):
                    count("burst", "lost")
                elif response.status_code == 200:
                    ok = checker.check(text, response.json()["translatedText"])
                    count("burst", "200 correct" if ok else "200 wrong")
                else:
                    count("burst", str(response.status_code))
                    if response.status_code == 503:
                        retry_after.append(int(response.headers["Retry-After"]))
            await asyncio.sleep(1)
        seen["burst_retry_after_s"] = {"min": min(retry_after, default=0), "max": max(retry_after, default=0)}

    limits = httpx.Limits(max_connections=burst + 64)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300)) as http:
        wellformed, *_ = await asyncio.gather(
            load(url, sentences, checker, languages, 16, seconds, lengths),
            *(hang_up(http) for _ in range(4)),
            oversize(http),
            malformed(http),
            bursts(http),
        )
    return {"wellformed": wellformed, "faults": seen}


def latency_figures(latencies: list[float]) -> dict:
    """p50, p95 and the longest of `latencies` (seconds), in milliseconds."""
    return {
        name: round(1000 * value, 1) if value is not None else None
        for name, value in (
            ("p50", percentile(latencies, 0.50)),
            ("p95", percentile(latencies, 0.95)),
            ("max", max(latencies, default=None)),
        )
    }


async def fairness(
    url: str,
    paragraph: str,
    expected: str,
    sentences: list[str],
    checker: Checker,
    languages: tuple[str, str],
    clients: int,
    rounds: int,
) -> dict:
    """Short requests' latency with nobody else (as long as one paragraph takes) and while a paragraph is
    translated sentence by sentence, `rounds` times; every answer checked."""
    counts = {"short_answered": 0, "short_correct": 0, "short_errors": 0, "paragraph_correct": 0}
    latencies: dict[str, list[float]] = {"quiet": [], "beside_paragraph": []}
    paragraph_seconds: list[float] = []
    order = iter(range(10**9))

    async def shorts(http: httpx.AsyncClient, until: asyncio.Future | float, kind: str) -> None:
        """Single sentences one after another until `until` (a deadline, or a request) is done."""
        while not (until.done() if isinstance(until, asyncio.Future) else time.monotonic() > until):
            text = sentences[next(order) % len(sentences)]
            started = time.monotonic()
            response = await http.post(f"{url}/translate", json=translate_body(*languages, text))
            latencies[kind].append(time.monotonic() - started)
            if response.status_code != 200:
                counts["short_errors"] += 1
                continue
            counts["short_answered"] += 1
            counts["short_correct"] += checker.check(text, response.json()["translatedText"])

    async with httpx.AsyncClient(timeout=httpx.Timeout(600)) as http:
        for _ in range(rounds):
            started = time.monotonic()
            body = {"q": paragraph, "split_sentences": True}
            long = asyncio.ensure_future(http.post(f"{url}/v1/translate", json=body))
            await asyncio.sleep(0.2)  # the paragraph is in the worker before the short requests come
            await asyncio.gather(*(shorts(http, long, "beside_paragraph") for _ in range(clients)))
            response = await long
            paragraph_seconds.append(time.monotonic() - started)
            text = (
                response.json()["results"][0]["translations"][0]["text"]
                if response.status_code == 200
                else None
            )
            counts["paragraph_correct"] += text == expected
            quiet_until = time.monotonic() + min(paragraph_seconds[-1], 30)
            await asyncio.gather(*(shorts(http, quiet_until, "quiet") for _ in range(clients)))
    return {
        "rounds": rounds,
        "clients": clients,
        "paragraph_characters": len(paragraph),
        "paragraph_seconds": [round(seconds, 2) for seconds in paragraph_seconds],
        **counts,
        "short_latency_ms": {kind: latency_figures(values) for kind, values in latencies.items()},
        "short_requests": {kind: len(values) for kind, values in latencies.items()},
    }


async def beside_long_texts(
    url: str,
    long_text: str,
    long_expected: str,
    sentences: list[str],
    checker: Checker,
    languages: tuple[str, str],
    long_texts: int,
    seconds: float,
) -> dict:
    """One client sending single sentences one after another for `seconds` while `long_texts` clients
    each keep one `long_text` (a text without a sentence break: one segment) in the server; the short
    requests' latency, and every answer checked (the long text against `long_expected`)."""
    counts = {"short_correct": 0, "short_wrong": 0, "long_correct": 0, "long_wrong": 0}
    latencies: list[float] = []
    order = iter(range(10**9))
    stop_at = time.monotonic() + seconds

    async def long_client(http: httpx.AsyncClient) -> None:
        while time.monotonic() < stop_at:
            response = await http.post(f"{url}/translate", json=translate_body(*languages, long_text))
            right = response.status_code == 200 and response.json()["translatedText"] == long_expected
            counts["long_correct" if right else "long_wrong"] += 1

    async def short_client(http: httpx.AsyncClient) -> None:
        await asyncio.sleep(0.5)  # the long texts are decoding before the first short request comes
        while time.monotonic() < stop_at:
            text = sentences[next(order) % len(sentences)]
            started = time.monotonic()
            response = await http.post(f"{url}/translate", json=translate_body(*languages, text))
            latencies.append(time.monotonic() - started)
            right = response.status_code == 200 and checker.check(text, response.json()["translatedText"])
            counts["short_correct" if right else "short_wrong"] += 1

    async with httpx.AsyncClient(timeout=httpx.Timeout(600)) as http:
        await asyncio.gather(short_client(http), *(long_client(http) for _ in range(long_texts)))
    return {
        "long_texts": long_texts,
        "short_requests": len(latencies),
        **counts,
        "short_latency_ms": latency_figures(latencies),
    }


def unsplittable_text(characters: int) -> str:
    """A text of `characters` emoji with no sentence break: one segment however long, the longest a
    request may hold under the server's default character limit."""
    return "\N{GRINNING FACE}" * characters


def paragraph_of(sentences: list[str], characters: int) -> str:
    """Sentences joined into one paragraph of at most `characters` (each ending in a full stop, so that
    the splitter finds them again)."""
    parts: list[str] = []
    for sentence in sentences:
        sentence = sentence.strip()
        if sentence[-1] not in ".!?":
            sentence += "."
        if len(" ".join([*parts, sentence])) > characters:
            break
        parts.append(sentence)
    return " ".join(parts)


def reference_translations(model: str, sentences: list[str], language: str) -> tuple[dict[str, str], dict]:
    """Each distinct sentence translated alone, and the same sentences translated as a file (the ceiling),
    each split into sentences of `language` as the server's `/translate` splits it (where pysbd knows the
    language)."""
    translator = load_translator(model)
    split = {"split_sentences": language in SPLITTER_LANGUAGES, "language": language, "scores": False}
    distinct = list(dict.fromkeys(sentences))
    started = time.monotonic()
    alone = {text: translator.translate_n_best([text], batch_size=1, **split)[0].text for text in distinct}
    alone_seconds = time.monotonic() - started
    started = time.monotonic()
    as_file = [
        translation.text for translation in translator.translate_n_best(sentences, batch_size=64, **split)
    ]
    file_seconds = time.monotonic() - started
    tokenizer = translator.target_tokenizer or translator.tokenizer
    source_tokens = sum(
        len(translator.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in sentences
    )
    target_tokens = sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in as_file)
    ceiling = {
        "one_at_a_time_sentences_per_s": round(len(distinct) / alone_seconds, 2),
        "file_sentences_per_s": round(len(sentences) / file_seconds, 2),
        "file_source_tokens_per_s": round(source_tokens / file_seconds, 1),
        "file_target_tokens_per_s": round(target_tokens / file_seconds, 1),
        "file_answers_differing_from_alone": sum(a != alone[t] for t, a in zip(sentences, as_file)),
    }
    return alone, ceiling


def token_lengths(model: str, references: dict[str, str]) -> dict[str, tuple[int, int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return {
        text: (
            len(tokenizer(text, add_special_tokens=False)["input_ids"]),
            len(tokenizer(translation, add_special_tokens=False)["input_ids"]),
        )
        for text, translation in references.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(REPOSITORY / "runs" / "demo" / "model"), help="model folder")
    parser.add_argument("--data", default=str(MULTI30K_TEST), help="sentences to send, one a line")
    parser.add_argument("--source-lang", default="en", help="the model's source language")
    parser.add_argument("--target-lang", default="de", help="the model's target language")
    parser.add_argument("--clients", type=int, default=64, help="clients of the main run")
    parser.add_argument("--seconds", type=float, default=60, help="length of the main run")
    parser.add_argument("--compare-clients", type=int, default=32, help="clients of the batching comparison")
    parser.add_argument(
        "--compare-seconds", type=float, default=10, help="length of each comparison run (each round has two)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds of the batching comparison")
    parser.add_argument("--fault-seconds", type=float, default=30, help="length of the run with faults")
    parser.add_argument("--burst", type=int, default=300, help="requests sent at once to fill the queue")
    parser.add_argument("--max-queue", type=int, default=128, help="the server's --max-queue")
    parser.add_argument(
        "--max-batch-tokens", type=int, help="the server's --max-batch-tokens (default: its own)"
    )
    parser.add_argument("--max-wait-ms", type=float, help="the server's --max-wait-ms (default: its own)")
    parser.add_argument("--threads", type=int, help="the server's --threads")
    parser.add_argument(
        "--budgets",
        type=int,
        nargs="*",
        default=[],
        help="also run the comparison's load against a server with each of these --max-batch-tokens",
    )
    parser.add_argument("--fair-rounds", type=int, default=3, help="paragraphs sent in the fairness run")
    parser.add_argument("--fair-clients", type=int, default=4, help="short-request clients beside each one")
    parser.add_argument("--paragraph-chars", type=int, default=5000, help="the paragraph's length at most")
    parser.add_argument("--fairness-only", action="store_true", help="run the fairness measurement alone")
    parser.add_argument(
        "--schedulers",
        nargs="+",
        default=["iteration", "batch"],
        help="the server's --scheduler values compared under the same load, the first also in the main run",
    )
    parser.add_argument(
        "--long-texts",
        type=int,
        nargs="+",
        default=[0, 1, 3],
        help="maximal unsplittable texts kept in the server beside one client of single sentences",
    )
    parser.add_argument("--long-chars", type=int, default=5000, help="characters of each unsplittable text")
    parser.add_argument("--long-seconds", type=float, default=40, help="length of each run beside long texts")
    parser.add_argument(
        "--long-only", action="store_true", help="run the unsplittable-text measurement alone"
    )
    parser.add_argument(
        "--server-code",
        help="serve from the hf_vanilla_transformer package in this folder (another checkout)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1-2 s runs, few clients, the comparison's servers reused by the later runs: a smoke test",
    )
    parser.add_argument("--output", default=str(REPOSITORY / "benchmarks" / "results" / "results_serve.json"))
    args = parser.parse_args(argv)
    if Path(args.model).exists():  # the server may run in another folder (--server-code)
        args.model = str(Path(args.model).resolve())
    # Seconds for the server's memory to settle after a load, before it is read.
    settle = 2.0
    if args.quick:
        # Each run still sends tens to hundreds of requests: every client's first request is answered
        # whatever the run's length, the faults' two bursts (one a second) overflow the queue, and the
        # long-text runs leave their one client of short requests a second after its half-second head start.
        args.clients, args.seconds, args.compare_clients, args.compare_seconds, args.rounds = 8, 1.5, 8, 1, 1
        args.fault_seconds, args.burst, args.max_queue = 2, 40, 8
        args.fair_rounds, args.fair_clients, args.paragraph_chars = 1, 2, 300
        args.long_texts, args.long_chars, args.long_seconds = [0, 1], 200, 1.5
        settle = 0.5

    sentences = [line for line in Path(args.data).read_text(encoding="utf-8").splitlines() if line.strip()]
    languages = (args.source_lang, args.target_lang)
    if args.threads:  # the references decode with the server's threads: the same products, the same sums
        torch.set_num_threads(args.threads)
    print(f"translating {len(sentences)} sentences alone and as a file ...", flush=True)
    references, ceiling = reference_translations(args.model, sentences, args.source_lang)
    lengths = token_lengths(args.model, references)
    gc.collect()
    server_args = ["--source-lang", args.source_lang, "--target-lang", args.target_lang]
    server_args += ["--max-queue", str(args.max_queue)]
    chosen = {"--max-batch-tokens": args.max_batch_tokens, "--max-wait-ms": args.max_wait_ms}
    chosen["--threads"] = args.threads
    server_args += [
        word for flag, value in chosen.items() if value is not None for word in (flag, str(value))
    ]
    result: dict = {
        "machine": machine_line(),
        "command": "python benchmarks/bench_serve.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": args.model,
        "data": args.data,
        "sentences": len(sentences),
        "server_options": server_args,
        "ceiling": ceiling,
    }
    checker = Checker(references)

    def measure_fairness(server: Server | None = None) -> None:
        """Against `server`, else against a server of its own, started and stopped here."""
        print(f"fairness: {args.fair_rounds} paragraphs of {len(paragraph)} characters ...", flush=True)
        expected = load_translator(args.model).translate_n_best([paragraph], split_sentences=True)[0].text
        own = server is None
        if own:
            server = Server(args.model, *server_args, code=args.server_code)
        result["fairness"] = asyncio.run(
            fairness(
                server.url,
                paragraph,
                expected,
                sentences,
                checker,
                languages,
                args.fair_clients,
                args.fair_rounds,
            )
        )
        if own:
            server.stop()
        print(json.dumps(result["fairness"], indent=1))

    def measure_long_texts(servers: dict[str, Server] | None = None) -> None:
        """Against `servers` (by scheduler), else against a server of its own for each scheduler."""
        long_text = unsplittable_text(args.long_chars)
        print(
            f"beside {args.long_texts} texts of {args.long_chars} characters without a break ...", flush=True
        )
        started = time.monotonic()
        long_expected = load_translator(args.model).translate([long_text], progress=False)[0]
        result["long_text_alone_seconds"] = round(time.monotonic() - started, 2)
        result["beside_long_texts"] = {}
        for scheduler in args.schedulers:
            own = servers is None
            server = (
                Server(args.model, *server_args, "--scheduler", scheduler, code=args.server_code)
                if own
                else servers[scheduler]
            )
            result["beside_long_texts"][scheduler] = [
                asyncio.run(
                    beside_long_texts(
                        server.url,
                        long_text,
                        long_expected,
                        sentences,
                        checker,
                        languages,
                        count,
                        args.long_seconds,
                    )
                )
                for count in args.long_texts
            ]
            if own:
                server.stop()
        print(json.dumps(result["beside_long_texts"], indent=1))

    paragraph = paragraph_of(sentences, args.paragraph_chars)
    result["server_code"] = args.server_code or str(REPOSITORY)
    if args.fairness_only or args.long_only:
        (measure_fairness if args.fairness_only else measure_long_texts)()
        write_result(result, args.output)
        return

    runs: list[dict] = []

    def measured(server: Server, clients: int, seconds: float) -> dict:
        """One load run against `server`, with the batches it ran meanwhile."""
        before = server.stats()
        run = asyncio.run(load(server.url, sentences, checker, languages, clients, seconds, lengths))
        runs.append(run)
        return {**run, **batch_sizes(before, server.stats())}

    result["budgets"] = {}
    for budget in args.budgets:
        print(f"batching across requests, --max-batch-tokens {budget} ...", flush=True)
        server = Server(args.model, *server_args, "--max-batch-tokens", str(budget), code=args.server_code)
        result["budgets"][str(budget)] = measured(server, args.compare_clients, args.compare_seconds)
        server.stop()

    print(
        f"the schedulers {args.schedulers} against one request a batch (--no-batching), {args.rounds} "
        "rounds in turn ...",
        flush=True,
    )
    # Started side by side, then waited for.
    servers = {
        scheduler: Server(
            args.model, *server_args, "--scheduler", scheduler, code=args.server_code, wait=False
        )
        for scheduler in args.schedulers
    }
    servers["unbatched"] = Server(
        args.model, *server_args, "--scheduler", "batch", "--no-batching", code=args.server_code, wait=False
    )
    for target in servers.values():
        target.wait_until_up()
    server = servers[args.schedulers[0]]
    rss_idle = server.rss()
    rounds: dict[str, list[dict]] = {name: [] for name in servers}
    for index in range(args.rounds):
        names = list(servers)
        for name in names[index % len(names) :] + names[: index % len(names)]:
            rounds[name].append(measured(servers[name], args.compare_clients, args.compare_seconds))
    # A quick run keeps the schedulers' servers for the fairness and long-text runs (the same options as
    # the servers those runs start for themselves, --scheduler auto being iteration here): a smoke test
    # pays for every server's start, a measurement wants servers that have carried no load before.
    reused = {name: servers[name] for name in args.schedulers} if args.quick else {}
    for target in servers.values():
        if target is not server and target not in reused.values():
            target.stop()
    result["schedulers"] = {name: {"rounds": runs_of, **overall(runs_of)} for name, runs_of in rounds.items()}
    result["speedups_against_unbatched"] = {
        name: round(
            statistics.median(
                run["sentences_per_s"] / base["sentences_per_s"]
                for run, base in zip(rounds[name], rounds["unbatched"])
            ),
            2,
        )
        for name in args.schedulers
    }

    print(f"{args.clients} clients for {args.seconds:g} s ...", flush=True)
    result["main"] = {
        **measured(server, args.clients, args.seconds),
        "server_peak_rss_mb": server.peak_rss >> 20,
    }
    time.sleep(settle)
    rss_baseline = server.rss()

    print(f"faults for {args.fault_seconds:g} s ...", flush=True)
    info = httpx.get(f"{server.url}/v1/info", timeout=10).json()
    result["faults"] = asyncio.run(
        faults(
            server,
            sentences,
            checker,
            languages,
            args.fault_seconds,
            info["limits"]["max_characters"],
            lengths,
            args.burst,
        )
    )
    time.sleep(settle)
    rss_after = server.rss()
    result["memory_mb"] = {
        "idle_after_start": rss_idle >> 20,
        "baseline_after_load": rss_baseline >> 20,
        "after_faults": rss_after >> 20,
        "peak": server.peak_rss >> 20,
    }
    result["server_stats"] = {key: value for key, value in server.stats().items() if key != "recent_batches"}
    health = httpx.get(f"{server.url}/health", timeout=10)
    result["healthy_after_faults"] = health.status_code == 200
    if not reused:
        result["server_exit_status"] = server.stop()
    result["answers"] = {
        "mixed_up": checker.mixed_up,
        "garbled": checker.garbled,
        "lost": sum(run["lost"] for run in runs) + result["faults"]["wellformed"]["lost"],
        "examples": checker.examples,
    }
    print(
        json.dumps(
            {key: result[key] for key in ("ceiling", "speedups_against_unbatched", "answers", "memory_mb")},
            indent=1,
        )
    )
    measure_fairness(server if reused else None)
    measure_long_texts(reused or None)
    for target in reused.values():
        status = target.stop()
        if target is server:
            result["server_exit_status"] = status
    write_result(result, args.output)


if __name__ == "__main__":
    main()
