"""Iteration-level batching: sentences that join and leave one running batch between decoding steps
(`inference.iteration_batching.RunningBeamSearch`) get what `generate()` gives each of them alone, token for
token, whatever joins or leaves beside them; and the server's scheduler on it (`IterationScheduler`) answers
a short request while a long text still decodes, and drops a departed client's text at the next step."""

import asyncio
import random
import re

import pytest
import torch
from conftest import tiny_model
from test_export import SOURCE_WORDS, SPECIALS
from transformers import GenerationConfig

from hf_vanilla_transformer import paper_generation_config
from hf_vanilla_transformer.common.cpu_speedups import prepare_for_cpu_decoding
from hf_vanilla_transformer.conversion import tokenizer_from_fairseq_dictionary
from hf_vanilla_transformer.inference import decoding_memory
from hf_vanilla_transformer.inference.iteration_batching import RunningBeamSearch, unsupported
from hf_vanilla_transformer.inference.translation import decoding_cache, decoding_context
from hf_vanilla_transformer.inference.translator import Translator

EOS, PAD = 2, 1


def generate_alone(model, source: list[int], **kwargs):
    """`generate()` on `source` by itself, as `translate` runs it on a CPU with the model the PyTorch engine
    loads: prepared for CPU decoding (`prepare_for_cpu_decoding`, as the running batch prepares it too),
    within `decoding_context` and with `decoding_cache`."""
    beams = model.generation_config.num_beams
    prepare_for_cpu_decoding(model)
    with torch.inference_mode(), decoding_context(model):
        return model.generate(
            input_ids=torch.tensor([source]),
            attention_mask=torch.ones(1, len(source), dtype=torch.long),
            num_return_sequences=beams,
            **decoding_cache(model, beams, kwargs),
            **kwargs,
        )


def generated_alone(model, source: list[int]) -> list[list[int]]:
    """`generate()` on `source` by itself: every hypothesis the beam keeps, best first, as token ids after
    the decoder start token (the end token kept, the padding dropped)."""
    out = generate_alone(model, source)
    outputs = []
    for row in out[:, 1:].tolist():
        if EOS in row:
            row = row[: row.index(EOS) + 1]
        while row and row[-1] == PAD:
            row.pop()
        outputs.append(row)
    return outputs


def random_sources(count: int, seed: int, longest: int = 12) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, 64) for _ in range(rng.randrange(1, longest))] + [EOS] for _ in range(count)]


def scored_alone(model, source: list[int]) -> list[float]:
    """The scores `generate()` ranks the beam's hypotheses of `source` by, decoded by itself."""
    out = generate_alone(model, source, output_scores=True, return_dict_in_generate=True)
    return out.sequences_scores.tolist()


def run_staggered(
    search: RunningBeamSearch, sources: list[list[int]], every: int, together: int, scores: bool = False
) -> dict:
    """Decode `sources` with `together` of them joining the running batch every `every` steps; each one's
    outputs (or, with `scores`, the scores it ranked them by) by its index."""
    results, waiting, steps = {}, list(enumerate(sources)), 0
    with search.decoding():
        while waiting or len(search):
            finished = []
            if waiting and steps % every == 0:
                arriving, waiting = waiting[:together], waiting[together:]
                finished += search.add([s for _, s in arriving], [key for key, _ in arriving])
            finished += search.step()
            for done in finished:
                results[done.key] = done.scores if scores else done.outputs
            steps += 1
    return results


DECODINGS = {
    "paper": {},
    "greedy": {"num_beams": 1},
    "no early stopping": {"early_stopping": False},
    "never stop early": {"early_stopping": "never"},
    "transformers' length penalty": {"length_penalty_type": "transformers", "length_penalty": 1.2},
    "beam 2, limit +5": {"num_beams": 2, "max_length_offset": 5},
    "max_new_tokens": {"max_length_offset": None, "max_new_tokens": 9},
}


@pytest.mark.parametrize("decoding", DECODINGS)
def test_each_sentence_decodes_as_generate_decodes_it_alone(decoding: str) -> None:
    model = tiny_model(seed=3)
    model.generation_config = paper_generation_config(model.config, **DECODINGS[decoding])
    sources = random_sources(10, seed=0)
    expected = {index: generated_alone(model, source) for index, source in enumerate(sources)}
    assert run_staggered(RunningBeamSearch(model), sources, every=3, together=2) == expected


@pytest.mark.parametrize("decoding", ["paper", "beam 2, limit +5"])
def test_each_sentence_scores_as_generate_scores_it_alone_bit_for_bit(decoding: str) -> None:
    """Not only the same tokens: the very same numbers, whatever the sentences beside it, their lengths and
    when they joined (one packed weight layout for every row count, the attention over each sentence's own
    keys, each source encoded by itself)."""
    model = tiny_model(seed=3)
    model.generation_config = paper_generation_config(model.config, **DECODINGS[decoding])
    sources = random_sources(10, seed=0)
    expected = {index: scored_alone(model, source) for index, source in enumerate(sources)}
    assert run_staggered(RunningBeamSearch(model), sources, every=3, together=2, scores=True) == expected


def test_learned_positions_stop_at_the_table_as_generate_does() -> None:
    model = tiny_model(seed=5, position_embedding_type="learned", max_position_embeddings=20)
    model.generation_config = paper_generation_config(model.config)
    sources = random_sources(6, seed=1)
    expected = {index: generated_alone(model, source) for index, source in enumerate(sources)}
    assert run_staggered(RunningBeamSearch(model), sources, every=2, together=3) == expected


def test_a_model_trained_to_stop_early_decodes_as_alone_too() -> None:
    """Outputs that end at an end token of their own (not the length limit), in a batch where sentences
    join after others have left: the cache's masked columns are trimmed and positions stay right."""
    model = tiny_model(seed=7, output_bias=True)
    with torch.no_grad():  # some outputs end at once, others run to their limit
        model.final_logits_bias[0, EOS] = 0.5
    model.generation_config = paper_generation_config(model.config)
    sources = random_sources(12, seed=2, longest=30)
    expected = {index: generated_alone(model, source) for index, source in enumerate(sources)}
    assert run_staggered(RunningBeamSearch(model), sources, every=5, together=1) == expected
    assert min(len(outputs[0]) for outputs in expected.values()) < 20  # some stop before their limit


def test_removed_sentences_leave_the_others_unchanged() -> None:
    model = tiny_model(seed=3)
    model.generation_config = paper_generation_config(model.config)
    sources = random_sources(6, seed=4)
    search = RunningBeamSearch(model)
    results = {}
    with search.decoding():
        search.add(sources, list(range(len(sources))))
        for _ in range(3):
            search.step()
        search.remove({1, 4})
        assert sorted(search.keys()) == [0, 2, 3, 5]
        while len(search):
            results.update({done.key: done.outputs for done in search.step()})
    assert results == {i: generated_alone(model, sources[i]) for i in (0, 2, 3, 5)}


def test_the_running_batch_keeps_no_column_that_every_row_masks() -> None:
    model = tiny_model(seed=3)
    model.generation_config = paper_generation_config(model.config, max_length_offset=2)
    search = RunningBeamSearch(model)
    with search.decoding():
        search.add([[5] * 30 + [EOS]], ["long"])
        for _ in range(10):
            search.step()
        search.add([[6, EOS]], ["short"])
        search.remove({"long"})
        # The short sentence has decoded one token: its self-attention holds that one column only.
        assert search._batch.self_mask.shape[1] == 1
        assert search._batch.cross_mask.shape[1] == 2


@pytest.mark.parametrize(
    "setting", [{"do_sample": True}, {"repetition_penalty": 1.3}, {"no_repeat_ngram_size": 2}]
)
def test_settings_it_does_not_implement_are_named_and_refused(setting: dict) -> None:
    model = tiny_model()
    model.generation_config = paper_generation_config(model.config, **setting)
    (name,) = setting
    assert [problem.split("=")[0] for problem in unsupported(model.generation_config)] == [name]
    with pytest.raises(ValueError, match=name):
        RunningBeamSearch(model)
    assert unsupported(paper_generation_config(model.config)) == []
    assert unsupported(GenerationConfig(num_beams=1)) == []


# The server's scheduler


@pytest.fixture(scope="module")
def random_translator() -> Translator:
    """A random tiny model over the words w0-w15, whose outputs run to the paper's length limit (input +
    50): a text of many words decodes for hundreds of steps."""
    tokenizer = tokenizer_from_fairseq_dictionary(SPECIALS + SOURCE_WORDS)
    model = tiny_model(seed=11, vocab_size=len(tokenizer), max_position_embeddings=512, output_bias=True)
    with torch.no_grad():  # never the end token before the limit
        model.final_logits_bias[0, EOS] = -100.0
    model.generation_config = paper_generation_config(model.config)
    return Translator(model, tokenizer, None, "torch")


def serve(translator: Translator, requests: list[tuple[int, str]], **settings) -> tuple[list, dict]:
    """Submit each (steps, text) request to an `IterationScheduler` on `translator` once it has taken that
    many decoding steps; their translations in the order they were answered (index, text), and the
    scheduler's stats."""
    pytest.importorskip("fastapi", reason="not installed (pip install -e '.[serve]')")
    from hf_vanilla_transformer.serving.batcher import Options
    from hf_vanilla_transformer.serving.iteration_scheduler import IterationScheduler

    scheduler = IterationScheduler(translator, **settings)
    scheduler.start()
    answered = []

    async def one(index: int, steps: int, text: str) -> None:
        while scheduler.stats.steps < steps:
            await asyncio.sleep(0.001)
        job = scheduler.submit([text], [len(text.split()) + 1], Options())
        translations = await job.future
        answered.append((index, translations[0].text))

    async def every() -> None:
        await asyncio.gather(*(one(i, steps, text) for i, (steps, text) in enumerate(requests)))

    try:
        asyncio.run(every())
    finally:
        scheduler.close()
    return answered, scheduler.stats_dict()


def test_a_short_request_is_answered_while_a_long_text_decodes(random_translator: Translator) -> None:
    long_text = " ".join(SOURCE_WORDS * 18)  # 288 words: about 340 decoding steps
    expected = random_translator.translate_n_best([long_text, "w1 w2"], progress=False)
    assert [len(translation.hypotheses[0].tokens) for translation in expected] == [289 + 50, 3 + 50]
    answered, stats = serve(random_translator, [(0, long_text), (5, "w1 w2")])
    assert [index for index, _ in answered] == [1, 0]  # the short one first, though it came second
    expected = [translation.text for translation in expected]
    assert dict(answered) == {0: expected[0], 1: expected[1]}
    assert stats["max_requests_in_step"] == 2


def test_the_running_batch_takes_waiting_requests_in_turn(random_translator: Translator) -> None:
    """With room for one text, requests wait in the queue and each is answered as translate gives it."""
    texts = ["w1 w2 w3", "w4", "w5 w6", "w7 w8 w9 w10"]
    answered, stats = serve(random_translator, [(0, text) for text in texts], max_running=1)
    assert dict(answered) == dict(enumerate(random_translator.translate(texts, progress=False)))
    assert stats["max_running_segments"] == 1 and stats["segments"] == len(texts)


def test_a_new_request_takes_the_next_free_place_before_an_older_paragraphs_next_sentence(
    random_translator: Translator,
) -> None:
    """With room for one text: a paragraph of three sentences starts first; a one-sentence request that
    arrives while its first sentence decodes goes next, not after the paragraph's other two."""
    pytest.importorskip("fastapi", reason="not installed (pip install -e '.[serve]')")
    from hf_vanilla_transformer.serving.batcher import Options
    from hf_vanilla_transformer.serving.iteration_scheduler import IterationScheduler

    scheduler = IterationScheduler(random_translator, max_running=1)
    scheduler.start()
    paragraph, short = ["w1 w2 w3", "w4 w5", "w6 w7"], "w8"
    answered = []

    async def both() -> None:
        first = scheduler.submit(paragraph, [4, 3, 3], Options())
        while scheduler.stats.steps < 2:
            await asyncio.sleep(0.001)
        second = scheduler.submit([short], [2], Options())
        for job in asyncio.as_completed([first.future, second.future]):
            answered.append([translation.text for translation in await job])

    try:
        asyncio.run(asyncio.wait_for(both(), 120))
    finally:
        scheduler.close()
    expected = random_translator.translate([*paragraph, short], progress=False)
    assert answered == [expected[3:], expected[:3]]  # the short request first, though it came second
    assert scheduler.stats.segments == 4


def test_a_departed_clients_text_leaves_the_running_batch(random_translator: Translator) -> None:
    pytest.importorskip("fastapi", reason="not installed (pip install -e '.[serve]')")
    from hf_vanilla_transformer.serving.batcher import Options
    from hf_vanilla_transformer.serving.iteration_scheduler import IterationScheduler

    scheduler = IterationScheduler(random_translator)
    scheduler.start()
    long_text = " ".join(SOURCE_WORDS * 18)

    async def leave() -> None:
        job = scheduler.submit([long_text], [289], Options())
        while scheduler.stats.steps < 3:
            await asyncio.sleep(0.01)
        scheduler.cancel(job)
        while scheduler.running:
            await asyncio.sleep(0.01)

    try:
        asyncio.run(asyncio.wait_for(leave(), 60))
        stats = scheduler.stats_dict()
    finally:
        scheduler.close()
    assert stats["dropped_requests"] == 1 and stats["segments"] == 0
    assert stats["steps"] < 300  # left long before its 340 steps


def test_a_failed_step_answers_its_requests_with_the_error_and_leaves_nothing_decoding(
    random_translator: Translator,
) -> None:
    """A decoding step that raises (the second, after one that worked) answers every request of the running
    batch with its error; once they are answered, the statistics count the failed step and show nothing
    decoding."""
    pytest.importorskip("fastapi", reason="not installed (pip install -e '.[serve]')")
    from hf_vanilla_transformer.serving.batcher import Options
    from hf_vanilla_transformer.serving.iteration_scheduler import IterationScheduler

    scheduler = IterationScheduler(random_translator)
    step, steps = scheduler._search.step, []

    def breaking_step() -> list:
        steps.append(len(steps))
        if len(steps) > 1:
            raise RuntimeError("out of memory, say")
        return step()

    scheduler._search.step = breaking_step
    scheduler.start()

    async def ask() -> list:
        jobs = [scheduler.submit([text], [3], Options()) for text in ("w1 w2", "w3 w4")]
        return await asyncio.gather(*(job.future for job in jobs), return_exceptions=True)

    try:
        answers = asyncio.run(asyncio.wait_for(ask(), 60))
        stats = scheduler.stats_dict()
    finally:
        scheduler.close()
    assert [str(answer) for answer in answers] == ["out of memory, say"] * 2
    assert stats["failed_steps"] == 1 and stats["decoding"] == 0


def test_a_full_queue_refuses_at_once(random_translator: Translator) -> None:
    pytest.importorskip("fastapi", reason="not installed (pip install -e '.[serve]')")
    from hf_vanilla_transformer.serving.batcher import Options, QueueFull
    from hf_vanilla_transformer.serving.iteration_scheduler import IterationScheduler

    scheduler = IterationScheduler(random_translator, max_running=1, max_queue=1)
    scheduler.start()
    long_text = " ".join(SOURCE_WORDS * 4)

    async def fill() -> None:
        running = scheduler.submit([long_text], [65], Options())
        while not scheduler.running:
            await asyncio.sleep(0.01)
        waiting = scheduler.submit(["w1"], [2], Options())
        with pytest.raises(QueueFull):
            scheduler.submit(["w2"], [2], Options())
        await asyncio.gather(running.future, waiting.future)

    try:
        asyncio.run(asyncio.wait_for(fill(), 60))
    finally:
        scheduler.close()


def test_a_running_batch_the_machine_cannot_hold_is_refused_at_start(
    random_translator: Translator, monkeypatch
) -> None:
    """On a machine with 8 MiB free, `--max-running` 4096 texts as long as the model's positions could not
    decode together: the server refuses to start, naming the largest running batch that fits, which starts."""
    pytest.importorskip("fastapi", reason="not installed (pip install -e '.[serve]')")
    from hf_vanilla_transformer.serving.iteration_scheduler import IterationScheduler

    monkeypatch.setattr(decoding_memory, "free_memory_bytes", lambda device: 8 * 2**20)
    with pytest.raises(ValueError, match=r"\(--max-running\)") as refusal:
        IterationScheduler(random_translator, max_running=4096)
    fitting = int(re.search(r"lower the batch size to (\d+) sentences", str(refusal.value))[1])
    assert 1 <= fitting < 4096
    IterationScheduler(random_translator, max_running=fitting)
    with pytest.raises(ValueError, match=r"\(--max-running\)"):
        IterationScheduler(random_translator, max_running=fitting + 1)
