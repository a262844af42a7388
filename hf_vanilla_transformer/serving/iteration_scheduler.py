"""Iteration-level scheduling: every segment the server is translating (a text, or a paragraph's sentence)
decodes in one running batch (`inference.iteration_batching.RunningBeamSearch`) that segments join and
leave between two decoding steps, on the PyTorch engine.

A segment that arrives is encoded and takes its first step at once, then decodes with the others, one step
each at a time; a finished one is answered and leaves. So a short request's latency is its own number of
decoding steps, each the cost of one step of the running batch, however long the texts decoding beside it:
a 1,000-token text without a sentence break no longer holds a one-sentence request behind it. Each
segment's translation is what `translate` gives for it alone: the same search, step for step.

The running batch holds at most `max_running` segments. Waiting requests fill its free places in rounds,
one segment each a round, the request admitted least recently first (a new one before all others), so a
paragraph of many sentences takes its share of the places, not all of them, and a request that arrives
takes the next free place. A request whose client goes away has its segments taken out of the running
batch at the next step, and its waiting ones dropped.
"""

import logging
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

from ..inference.blank import is_blank
from ..inference.hypotheses import Hypothesis, Translation
from ..inference.iteration_batching import Finished, RunningBeamSearch
from ..inference.translation import encode_sources, hypotheses_of
from ..inference.translator import Translator
from .batcher import Item, Job, Scheduler

logger = logging.getLogger(__name__)


@dataclass
class StepStats:
    """What the decoding steps so far did: steps taken, segments started and finished, the most segments
    and requests one step held, requests dropped (client gone), and the last steps' sizes (segments,
    seconds) and finished segments for the recent throughput."""

    steps: int = 0
    started: int = 0
    segments: int = 0
    dropped: int = 0
    failed: int = 0
    max_running: int = 0
    max_requests_in_step: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=256))

    def add(self, running: int, requests: int, finished: int, seconds: float) -> None:
        self.steps += 1
        self.segments += finished
        self.max_running = max(self.max_running, running)
        self.max_requests_in_step = max(self.max_requests_in_step, requests)
        self.recent.append((running, finished, seconds))

    def segments_per_second(self) -> float | None:
        """Segments finished per second of decoding over the recent steps (None before the first)."""
        seconds = sum(step[2] for step in self.recent)
        finished = sum(step[1] for step in self.recent)
        return finished / seconds if seconds > 0 and finished else None

    def as_dict(self) -> dict:
        return {
            "scheduler": "iteration",
            "steps": self.steps,
            "segments_started": self.started,
            "segments": self.segments,
            "dropped_requests": self.dropped,
            "failed_steps": self.failed,
            "max_running_segments": self.max_running,
            "max_requests_in_step": self.max_requests_in_step,
        }


class IterationScheduler(Scheduler):
    """The server's scheduler on the PyTorch engine: the requests' segments decode in one running batch of
    at most `max_running` segments, joining and leaving it between steps (see the module docstring).
    Raises ValueError where the model's generation settings are not the paper's beam search or greedy
    search (`iteration_batching.unsupported`): `Batcher` serves those; and where `max_running` segments of
    the model's longest could not fit in memory (`RunningBeamSearch.check_fits`)."""

    def __init__(self, translator: Translator, *, max_running: int = 32, max_queue: int = 256):
        if max_running < 1:
            raise ValueError("max_running must be at least 1.")
        super().__init__(max_queue=max_queue)
        self.stats = StepStats()
        self.translator = translator
        self.max_running = max_running
        self._search = RunningBeamSearch(translator.model)
        self._search.check_fits(max_running, "--max-running")
        self._sources: dict[Item, tuple[list[int], bool]] = {}
        self._admissions = 0

    def _admit(self) -> list[Item] | None:
        """The waiting segments to start now, in rounds over the waiting requests, one segment each a round,
        the least recently admitted first (`Job.served`; the oldest among equals), while the running batch
        has room. Waits while nothing decodes and nothing waits; None: closing, and nothing is left."""
        with self._condition:
            while True:
                self._drop_cancelled()
                if self._queue or len(self._search):
                    break
                if self._closing:
                    return None
                self._condition.wait()
            room = self.max_running - len(self._search)
            items: list[Item] = []
            requests = self._least_recently_served()
            while room > 0 and requests:
                for job in requests:
                    if room == 0:
                        break
                    items.append((job, job.dispatched))
                    job.dispatched, job.served = job.dispatched + 1, self._admissions
                    room -= 1
                requests = [job for job in requests if job.waiting]
            self._admissions += bool(items)
            self._queue = deque(job for job in self._queue if job.waiting)
            return items

    def _work(self) -> None:
        with self._search.decoding():
            while (items := self._admit()) is not None:
                self._drop_departed()
                started = time.monotonic()
                self._finish(self._start(items))
                running = self._search.keys()
                try:
                    finished = self._search.step()
                except Exception as error:  # the running batch cannot go on: its requests get the error
                    logger.exception("a decoding step failed")
                    self.stats.failed += 1
                    self._fail({job for job, _ in running}, error)
                    self.running = 0  # `_fail` took every running segment out
                    self._send_answers()
                    continue
                self._finish(finished)
                jobs = {job for job, _ in self._search.keys()}
                self.running = len(jobs)
                with self._condition:  # read from the event loop's thread (retry_after, stats_dict)
                    self.stats.add(len(running), len(jobs), len(finished), time.monotonic() - started)
                self._send_answers()

    def _drop_departed(self) -> None:
        """Take the segments of requests whose clients have gone out of the running batch."""
        departed = {(job, index) for job, index in self._search.keys() if job.cancelled}
        if departed:
            self._search.remove(departed)
            for item in departed:
                self._sources.pop(item, None)
            self.stats.dropped += len({job for job, _ in departed})

    def _start(self, items: list[Item]) -> list[Finished]:
        """Encode `items` and put them in the running batch; a segment with nothing to translate
        (`blank.is_blank`) is translated at once, to nothing, as `translate` does. Returns the segments
        that finished at their first step. A segment the model cannot take fails its request alone."""
        texts = [job.segments[index] for job, index in items]
        blank = [(item, text) for item, text in zip(items, texts) if is_blank(text)]
        for (job, index), text in blank:
            self._record(job, index, Translation(text, [Hypothesis("")]))
        items = [item for item, text in zip(items, texts) if not is_blank(text)]
        if not items:
            return []
        self.stats.started += len(items)
        translator = self.translator
        encoded, truncated = encode_sources(
            translator.model,
            translator.tokenizer,
            [job.segments[index] for job, index in items],
            [index + 1 for _, index in items],
        )
        for position, item in enumerate(items):
            self._sources[item] = (encoded[position], position in truncated)
        try:
            return self._search.add(encoded, items)
        except Exception:
            logger.debug("encoding %d arrivals together failed: each alone", len(items), exc_info=True)
        finished = []  # only the segment that the model cannot take fails its request
        for item, ids in zip(items, encoded):
            try:
                finished += self._search.add([ids], [item])
            except Exception as error:
                self._fail({item[0]}, error)
        return finished

    def _finish(self, finished: list[Finished]) -> None:
        """Turn finished segments into translations (texts, and the scores and alignments their requests ask
        for), and answer each request whose segments are all translated."""
        groups: dict[tuple[bool, bool], list[Finished]] = defaultdict(list)
        for done in finished:
            job, _ = done.key
            if job.cancelled:
                self._sources.pop(done.key, None)
            else:
                groups[(job.options.scores, job.options.alignments)].append(done)
        translator = self.translator
        for (scores, alignments), group in groups.items():
            sources = [self._sources.pop(done.key) for done in group]
            try:
                found = hypotheses_of(
                    translator.model,
                    translator.tokenizer,
                    [ids for ids, _ in sources],
                    [done.outputs[: done.key[0].options.n_best] for done in group],
                    scores=scores,
                    alignments=alignments,
                    target_tokenizer=translator.target_tokenizer,
                )
            except Exception as error:
                self._fail({done.key[0] for done in group}, error)
                continue
            for done, (_, truncated), hypotheses in zip(group, sources, found):
                job, index = done.key
                self._record(job, index, Translation(job.segments[index], hypotheses, truncated=truncated))

    def _record(self, job: Job, index: int, translation: Translation) -> None:
        job.results[index] = translation
        if len(job.results) == len(job.segments) and not job.cancelled:
            self._answer(job, result=[job.results[i] for i in range(len(job.segments))])

    def _fail(self, jobs: set[Job], error: Exception) -> None:
        """Answer `jobs` with `error`, and take their other segments out of the running batch and the
        queue."""
        with self._condition:
            for job in jobs:
                job.cancelled = True
        self._search.remove({key for key in self._search.keys() if key[0] in jobs})
        for item in [item for item in self._sources if item[0] in jobs]:
            del self._sources[item]
        for job in jobs:
            self._answer(job, error=error)


__all__ = ["IterationScheduler", "StepStats"]
