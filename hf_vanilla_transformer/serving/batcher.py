"""Batching across requests: the segments of concurrent requests are translated together, in batches of at
most `max_batch_tokens` source tokens (padding included: the batch's segments times its longest), each
batch waiting at most `max_wait_s` after its first request arrived for others to join it.

One worker thread owns the model and runs one batch at a time, off the event loop, so the server answers
other requests (`/health`) while a batch decodes. Each request gets back its own segments' translations, in
its order. The queue of waiting requests is bounded: a full queue refuses a request at once (`QueueFull`),
which the server answers 503. A request whose client went away before its batch started is dropped
unseen; one that goes away during its batch costs the others nothing (its result is dropped).
"""

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ..hypotheses import Translation

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    """What a request asks of the decoder: its `n_best` hypotheses, with their `scores`, with word
    `alignments`, each text translated sentence by sentence (`split_sentences`)."""

    n_best: int = 1
    scores: bool = False
    alignments: bool = False
    split_sentences: bool = False


# decode(segments, options, batch_size) -> one Translation per segment, in `batch_size` segments a generate()
Decode = Callable[[list[str], Options, int], list[Translation]]


class QueueFull(Exception):
    """The queue holds as many requests as it may; `retry_after` is how long it should take to drain, in
    whole seconds."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server's queue is full; retry in {retry_after} s.")
        self.retry_after = retry_after


@dataclass(eq=False)
class Job:
    """One request: its segments with their lengths in source tokens, what it asks of the decoder, and
    the future its translations are delivered to on the event loop."""

    segments: list[str]
    lengths: list[int]
    options: Options
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.monotonic)
    cancelled: bool = False


def padded_tokens(jobs: Sequence[Job]) -> int:
    """The source tokens of one batch of `jobs`, padding included: its segments times its longest."""
    segments = sum(len(job.lengths) for job in jobs)
    return segments * max((max(job.lengths, default=0) for job in jobs), default=0)


@dataclass
class BatchStats:
    """What the batches so far held: counts, the most requests one batch held, and the last batches' sizes
    (requests, segments, padded tokens, seconds) for the recent throughput."""

    batches: int = 0
    requests: int = 0
    segments: int = 0
    dropped: int = 0
    failed: int = 0
    max_requests_in_batch: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=32))

    def add(self, jobs: Sequence[Job], seconds: float) -> None:
        segments = sum(len(job.segments) for job in jobs)
        self.batches += 1
        self.requests += len(jobs)
        self.segments += segments
        self.max_requests_in_batch = max(self.max_requests_in_batch, len(jobs))
        self.recent.append((len(jobs), segments, padded_tokens(jobs), seconds))

    def segments_per_second(self) -> float | None:
        """Segments translated per second of decoding over the recent batches (None before the first)."""
        seconds = sum(batch[3] for batch in self.recent)
        return sum(batch[1] for batch in self.recent) / seconds if seconds > 0 else None

    def as_dict(self) -> dict:
        return {
            "batches": self.batches,
            "requests": self.requests,
            "segments": self.segments,
            "dropped_requests": self.dropped,
            "failed_batches": self.failed,
            "max_requests_in_batch": self.max_requests_in_batch,
            "recent_batches": [
                {"requests": r, "segments": s, "padded_tokens": t, "seconds": round(sec, 4)}
                for r, s, t, sec in self.recent
            ],
        }


class Batcher:
    """Gathers the requests submitted from the event loop into token-budget batches that one worker thread
    decodes with `decode`; `batching=False` runs one request a batch (what batching gains is measured
    against it). `start` before the first `submit`, `close` to finish the queue and stop."""

    def __init__(
        self,
        decode: Decode,
        *,
        max_batch_tokens: int = 256,
        max_wait_s: float = 0.01,
        max_queue: int = 256,
        batching: bool = True,
    ):
        if max_batch_tokens < 1 or max_queue < 1 or max_wait_s < 0:
            raise ValueError("max_batch_tokens and max_queue must be at least 1, max_wait_s at least 0.")
        self.decode = decode
        self.max_batch_tokens, self.max_wait_s, self.max_queue = max_batch_tokens, max_wait_s, max_queue
        self.batching = batching
        self.stats = BatchStats()
        self.running = 0  # requests in the batch now decoding
        self._queue: deque[Job] = deque()
        self._gathering: list[Job] = []  # the next batch, while it waits for more requests
        self._condition = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._work, name="translation-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Translate what is queued, then stop the worker."""
        with self._condition:
            self._closing = True
            self._condition.notify()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def queued(self) -> int:
        """Requests waiting for their batch to start (in the queue, or in the batch being gathered) whose
        clients are still there."""
        with self._condition:
            return sum(not job.cancelled for job in [*self._queue, *self._gathering])

    def stats_dict(self) -> dict:
        """`BatchStats.as_dict`, with the requests waiting (`queued`) and decoding now."""
        with self._condition:
            return {**self.stats.as_dict(), "queued": self.queued, "decoding": self.running}

    def retry_after(self) -> int:
        """Whole seconds the queue should take to drain at the recent throughput (at least 1)."""
        rate = self.stats.segments_per_second()
        waiting = sum(len(job.segments) for job in list(self._queue))
        return max(1, math.ceil(waiting / rate)) if rate else 1

    def submit(self, segments: list[str], lengths: list[int], options: Options) -> Job:
        """Queue one request of `segments`, `lengths` source tokens each (call from the event loop); await
        `job.future` for its translations, one per segment. Raises `QueueFull` when `max_queue` requests
        wait already."""
        loop = asyncio.get_running_loop()
        job = Job(segments, lengths, options, loop.create_future(), loop)
        with self._condition:
            if self._closing:
                raise QueueFull(1)
            if len(self._queue) >= self.max_queue:
                raise QueueFull(self.retry_after())
            self._queue.append(job)
            self._condition.notify()
        return job

    @staticmethod
    def cancel(job: Job) -> None:
        """The client of `job` went away: drop it if its batch has not started."""
        job.cancelled = True

    def _next_batch(self) -> list[Job] | None:
        """The next batch: the oldest waiting request, then the waiting requests nearest to it in length
        while the batch stays within the token budget, waiting for more until `max_wait_s` after the first
        arrived. None: closing and nothing is left."""
        with self._condition:
            batch: list[Job] = []
            while not batch:
                while not self._queue and not self._closing:
                    self._condition.wait()
                if not self._queue:
                    return None
                job = self._queue.popleft()
                if job.cancelled:
                    self.stats.dropped += 1
                else:
                    batch.append(job)
            deadline = batch[0].enqueued + self.max_wait_s
            self._gathering = batch
            while self.batching:
                while not self._queue and not self._closing and (left := deadline - time.monotonic()) > 0:
                    self._condition.wait(left)
                if not self._queue or not self._add_nearest(batch):
                    break
            self._gathering = []
            return batch

    def _add_nearest(self, batch: list[Job]) -> bool:
        """Move into `batch` the waiting requests nearest in length to its first, nearest first, each that
        keeps it within the token budget (and drop those whose clients went away); whether any moved.

        Requests of like length pad little, as sorting a file by length does: under load a batch of the
        oldest request and its nearest in length decodes faster than one of the next in line. The oldest
        request always starts the next batch, so none waits behind more than the requests older than it."""
        for job in [job for job in self._queue if job.cancelled]:
            self._queue.remove(job)
            self.stats.dropped += 1
        anchor = max(batch[0].lengths, default=0)
        added = False
        for job in sorted(self._queue, key=lambda job: abs(max(job.lengths, default=0) - anchor)):
            if padded_tokens([*batch, job]) <= self.max_batch_tokens:
                self._queue.remove(job)
                batch.append(job)
                added = True
        return added

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            self.running = len(batch)
            started = time.monotonic()
            try:
                self._run(batch)
            except Exception:
                # A batch that fails is tried again a request at a time, so that only the request that
                # cannot be translated gets the error.
                self.stats.failed += 1
                for job in batch:
                    try:
                        self._run([job])
                    except Exception as error:
                        _deliver(job, error=error)
            seconds = time.monotonic() - started
            with self._condition:  # read from the event loop's thread (retry_after, stats_dict)
                self.stats.add(batch, seconds)
            self.running = 0
            logger.debug(
                "batch of %d requests, %d segments, %d padded tokens: %.3f s",
                len(batch),
                sum(len(job.segments) for job in batch),
                padded_tokens(batch),
                seconds,
            )

    def _run(self, batch: list[Job]) -> None:
        """Decode `batch` and deliver each request its translations: one decode per sentence-splitting
        choice, with the most hypotheses any of its requests asks for, and scores and alignments where one
        asks for them (neither changes the best translation, for a fixed beam), each request's sliced to
        what it asked for."""
        for split in (False, True):
            jobs = [job for job in batch if job.options.split_sentences == split]
            if not jobs:
                continue
            options = Options(
                n_best=max(job.options.n_best for job in jobs),
                scores=any(job.options.scores for job in jobs),
                alignments=any(job.options.alignments for job in jobs),
                split_sentences=split,
            )
            segments = [segment for job in jobs for segment in job.segments]
            longest = max(max(job.lengths, default=1) for job in jobs)
            translations = self.decode(segments, options, max(1, self.max_batch_tokens // max(longest, 1)))
            start = 0
            for job in jobs:
                own = translations[start : start + len(job.segments)]
                start += len(job.segments)
                _deliver(job, result=[_sliced(translation, job.options) for translation in own])


def _sliced(translation: Translation, options: Options) -> Translation:
    """`translation` with the `options.n_best` best hypotheses, and without the scores and alignments that
    `options` did not ask for."""
    hypotheses = translation.hypotheses[: options.n_best]
    if not options.scores:
        hypotheses = [replace(h, log_prob=None, score=None) for h in hypotheses]
    if not options.alignments:
        hypotheses = [
            replace(h, alignment=None, source_words=None, target_words=None, attention=None)
            for h in hypotheses
        ]
    return replace(translation, hypotheses=hypotheses)


def _deliver(job: Job, result: list[Translation] | None = None, error: BaseException | None = None) -> None:
    """Hand `job` its result or error on its event loop, unless its client has gone (future cancelled)
    or the loop has closed."""

    def settle() -> None:
        if job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    try:
        job.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the event loop is closed: nobody waits for the answer
        pass


__all__ = ["BatchStats", "Batcher", "Decode", "Job", "Options", "QueueFull", "padded_tokens"]
