"""Batching across requests, fairly: the segments of concurrent requests (a paragraph's sentences each a
segment of their own) are translated together, in batches of at most `max_batch_tokens` source tokens
(padding included: the batch's segments times its longest), each batch waiting at most `max_wait_s` after
the oldest waiting request arrived for others to join it.

A batch is filled in rounds: each waiting request gives its next segment, the one whose last segment went
into a batch longest ago first (a new request before all others, then the oldest), and the rounds go on
while the batch stays within its token budget. A request of many segments therefore gets a share of the
batches, not the whole worker: a one-sentence request that arrives while long ones are decoding is the
first of the next batch, and requests whose segments fill a batch each take their turn. A request's
translations are delivered together once its last segment is translated.

One worker thread owns the model and runs one batch at a time, off the event loop, so the server answers
other requests (`/health`) while a batch decodes. The queue of waiting requests is bounded: a full queue
refuses a request at once (`QueueFull`), which the server answers 503. A request whose client goes away
(`Batcher.cancel`) has its segments not yet in a batch dropped from the next one; what it had in the batch
decoding costs the others nothing (its result is dropped).
"""

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ..inference.hypotheses import Translation

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    """What a request asks of the decoder: its `n_best` hypotheses, with their `scores`, with word
    `alignments`."""

    n_best: int = 1
    scores: bool = False
    alignments: bool = False


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
    """One request: its segments with their lengths in source tokens, what it asks of the decoder, the
    future its translations are delivered to on the event loop, and how far it has got: `dispatched`
    segments handed to a batch, `results` of those translated."""

    segments: list[str]
    lengths: list[int]
    options: Options
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    dispatched: int = 0
    results: dict[int, Translation] = field(default_factory=dict)
    served: int = -1  # when the scheduler last took one of its segments: its batch or admission number

    @property
    def waiting(self) -> int:
        """Segments not yet handed to a batch."""
        return len(self.segments) - self.dispatched


# One segment of a batch: its request and its place in the request.
Item = tuple[Job, int]


def padded_tokens(items: Sequence[Item]) -> int:
    """The source tokens of one batch of `items`, padding included: its segments times its longest."""
    return len(items) * max((job.lengths[index] for job, index in items), default=0)


def requests_of(items: Sequence[Item]) -> list[Job]:
    """The requests that `items` belong to, each once, in order."""
    return list(dict.fromkeys(job for job, _ in items))


@dataclass
class BatchStats:
    """What the batches so far held: counts (a request is counted in each batch that holds some of its
    segments), the most requests one batch held, and the last batches' sizes (requests, segments, padded
    tokens, seconds) for the recent throughput."""

    batches: int = 0
    requests: int = 0
    segments: int = 0
    dropped: int = 0
    failed: int = 0
    max_requests_in_batch: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=32))

    def add(self, items: Sequence[Item], seconds: float) -> None:
        requests = len(requests_of(items))
        self.batches += 1
        self.requests += requests
        self.segments += len(items)
        self.max_requests_in_batch = max(self.max_requests_in_batch, requests)
        self.recent.append((requests, len(items), padded_tokens(items), seconds))

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


class Scheduler:
    """What every scheduler of the server shares: the bounded queue of waiting requests, submitted from the
    event loop, one worker thread that translates them, cancellation and statistics. `start` before the
    first `submit`, `close` to finish the queue and stop. A subclass gives the worker's loop (`_work`)."""

    def __init__(self, *, max_queue: int = 256):
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1.")
        self.max_queue = max_queue
        self.stats = BatchStats()
        self.running = 0  # requests decoding now
        self._queue: deque[Job] = deque()  # requests with segments not yet decoding, oldest first
        self._condition = threading.Condition()
        self._closing = False
        # Answers made and not yet delivered (`_answer`): the worker thread's alone.
        self._answers: list[tuple[Job, list[Translation] | None, BaseException | None]] = []
        self._thread = threading.Thread(target=self._serve, name="translation-worker", daemon=True)

    def _serve(self) -> None:
        """The worker thread: `_work`, and the answers it made sent even where it stops on an error."""
        try:
            self._work()
        finally:
            self._send_answers()

    def _work(self) -> None:
        raise NotImplementedError

    def _answer(
        self, job: Job, result: list[Translation] | None = None, error: BaseException | None = None
    ) -> None:
        """Keep `job`'s result or error (worker thread) until the work that made it is counted
        (`_send_answers`)."""
        self._answers.append((job, result, error))

    def _send_answers(self) -> None:
        """Deliver the answers kept since the last call. The worker calls it once it has recorded the
        statistics of the batch or decoding step that made them, so that a client that reads /v1/stats
        after its answer finds that batch or step counted."""
        answers, self._answers = self._answers, []
        for job, result, error in answers:
            deliver(job, result=result, error=error)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Translate what is queued for clients still there, then stop the worker."""
        with self._condition:
            self._closing = True
            self._condition.notify()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def queued(self) -> int:
        """Requests with segments waiting to decode whose clients are still there."""
        with self._condition:
            return sum(not job.cancelled for job in self._queue)

    def stats_dict(self) -> dict:
        """`BatchStats.as_dict`, with the requests waiting (`queued`) and decoding now."""
        with self._condition:
            return {**self.stats.as_dict(), "queued": self.queued, "decoding": self.running}

    def retry_after(self) -> int:
        """Whole seconds the queue should take to drain at the recent throughput (at least 1)."""
        rate = self.stats.segments_per_second()
        waiting = sum(job.waiting for job in list(self._queue))
        return max(1, math.ceil(waiting / rate)) if rate else 1

    def submit(self, segments: list[str], lengths: list[int], options: Options) -> Job:
        """Queue one request of `segments` (at least one), `lengths` source tokens each (call from the event
        loop); await `job.future` for its translations, one per segment. Raises `QueueFull` when
        `max_queue` requests wait already."""
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

    def _least_recently_served(self) -> list[Job]:
        """The waiting requests in the order they are served: the one whose last segment a batch or the
        running batch took longest ago first (`Job.served`; a new one before all others), the oldest first
        among equals."""
        return sorted(self._queue, key=lambda job: job.served)

    def cancel(self, job: Job) -> None:
        """The client of `job` went away: its segments not yet decoding are dropped."""
        with self._condition:
            job.cancelled = True
            self._condition.notify()

    def _drop_cancelled(self) -> None:
        for job in [job for job in self._queue if job.cancelled]:
            self._queue.remove(job)
            self.stats.dropped += 1


class Batcher(Scheduler):
    """Gathers the segments of the requests submitted from the event loop into fair token-budget batches
    that one worker thread decodes with `decode`; `batching=False` runs one request a batch, all its
    segments at once (what batching gains is measured against it)."""

    def __init__(
        self,
        decode: Decode,
        *,
        max_batch_tokens: int = 256,
        max_wait_s: float = 0.01,
        max_queue: int = 256,
        batching: bool = True,
    ):
        if max_batch_tokens < 1 or max_wait_s < 0:
            raise ValueError("max_batch_tokens must be at least 1, max_wait_s at least 0.")
        super().__init__(max_queue=max_queue)
        self.decode = decode
        self.max_batch_tokens, self.max_wait_s = max_batch_tokens, max_wait_s
        self.batching = batching
        self._batches_planned = 0

    def _plan(self) -> list[Item]:
        """The segments the next batch would take now, in rounds: each waiting request gives its next
        segment, the least recently served first (`Job.served`; the oldest among equals), while the batch
        keeps within the token budget (its first segment goes in whatever its length). Without batching:
        every waiting segment of the oldest request."""
        if not self.batching:
            job = self._queue[0]
            return [(job, index) for index in range(job.dispatched, len(job.segments))]
        items: list[Item] = []
        longest = 0
        taken = {job: job.dispatched for job in self._queue}
        open_jobs = self._least_recently_served()
        while open_jobs:
            still_open = []
            for job in open_jobs:
                index = taken[job]
                length = max(longest, job.lengths[index])
                if items and (len(items) + 1) * length > self.max_batch_tokens:
                    continue  # this request's next segment waits for a later batch
                items.append((job, index))
                longest, taken[job] = length, index + 1
                if taken[job] < len(job.segments):
                    still_open.append(job)
            open_jobs = still_open
        return items

    def _next_batch(self) -> list[Item] | None:
        """The next batch, once the budget is full or `max_wait_s` has passed since the oldest waiting
        request arrived; None: closing and nothing is left."""
        with self._condition:
            while True:
                self._drop_cancelled()
                if not self._queue:
                    if self._closing:
                        return None
                    self._condition.wait()
                    continue
                deadline = self._queue[0].enqueued + self.max_wait_s
                plan = self._plan()
                full = len(plan) < sum(job.waiting for job in self._queue)
                left = deadline - time.monotonic()
                if not self.batching or full or self._closing or left <= 0:
                    break
                self._condition.wait(left)
            for job, index in plan:
                job.dispatched, job.served = index + 1, self._batches_planned
            self._batches_planned += 1
            self._queue = deque(job for job in self._queue if job.waiting)
            return plan

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            jobs = requests_of(batch)
            self.running = len(jobs)
            started = time.monotonic()
            try:
                self._run(batch)
            except Exception:
                # A batch that fails is tried again a request at a time, so that only the request that
                # cannot be translated gets the error.
                self.stats.failed += 1
                for job in jobs:
                    try:
                        self._run([item for item in batch if item[0] is job])
                    except Exception as error:
                        with self._condition:
                            job.cancelled = True  # its other segments are not translated
                        self._answer(job, error=error)
            seconds = time.monotonic() - started
            with self._condition:  # read from the event loop's thread (retry_after, stats_dict)
                self.stats.add(batch, seconds)
            self.running = 0
            self._send_answers()
            logger.debug(
                "batch of %d requests, %d segments, %d padded tokens: %.3f s",
                len(jobs),
                len(batch),
                padded_tokens(batch),
                seconds,
            )

    def _run(self, items: list[Item]) -> None:
        """Decode `items` once, with the most hypotheses any of their requests asks for, and scores and
        alignments where one asks for them (neither changes the best translation, for a fixed beam); each
        request's translations are sliced to what it asked for, and answered once all are there."""
        jobs = requests_of(items)
        options = Options(
            n_best=max(job.options.n_best for job in jobs),
            scores=any(job.options.scores for job in jobs),
            alignments=any(job.options.alignments for job in jobs),
        )
        longest = max(job.lengths[index] for job, index in items)
        segments = [job.segments[index] for job, index in items]
        translations = self.decode(segments, options, max(1, self.max_batch_tokens // max(longest, 1)))
        for (job, index), translation in zip(items, translations, strict=True):
            job.results[index] = sliced(translation, job.options)
        for job in jobs:
            if len(job.results) == len(job.segments) and not job.cancelled:
                self._answer(job, result=[job.results[index] for index in range(len(job.segments))])


def sliced(translation: Translation, options: Options) -> Translation:
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


def deliver(job: Job, result: list[Translation] | None = None, error: BaseException | None = None) -> None:
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


__all__ = [
    "BatchStats",
    "Batcher",
    "Decode",
    "Item",
    "Job",
    "Options",
    "QueueFull",
    "Scheduler",
    "deliver",
    "padded_tokens",
    "sliced",
]
