"""n-best lists with scores, sentence splitting, sampling and over-long inputs, in the library and through
`vanilla-transformer translate`: each checked against generate()'s own sequences and beam scores, the
paper's length penalty, pysbd's sentence count, or the same model decoding one input at a time."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import forked_processes
import pysbd
import pytest
import torch
from conftest import run_in_process, tiny_model

from hf_vanilla_transformer.commands import translate as translate_command
from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
from hf_vanilla_transformer.inference.alignment import align
from hf_vanilla_transformer.inference.scoring import token_log_probs
from hf_vanilla_transformer.inference.translation import translate, translate_n_best
from hf_vanilla_transformer.inference.translator import load_translator
from hf_vanilla_transformer.vanilla_transformer.generation_vanilla_transformer import (
    gnmt_length_penalty,
    paper_generation_config,
)

WORDS = "a dog runs in the park two men talk girl reads book sleeps cat sits on mat".split()
SENTENCES = ["a dog runs in the park", "two men talk", "", "a girl reads a book", "the cat sits on the mat"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def tokenizer():
    return train_shared_bpe_tokenizer(
        [" ".join(WORDS[i:] + WORDS[:i]) + ". !" for i in range(len(WORDS))] * 5,
        vocab_size=60,
        min_frequency=1,
        show_progress=False,
    )


@pytest.fixture(scope="module")
def model(tokenizer):
    """A tiny model whose end token is likely enough that most beams finish before the length limit."""
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    ids |= {"bos_token_id": tokenizer.bos_token_id, "decoder_start_token_id": tokenizer.bos_token_id}
    model = tiny_model(seed=3, vocab_size=len(tokenizer), output_bias=True, **ids).eval()
    with torch.no_grad():
        model.final_logits_bias[0, tokenizer.eos_token_id] = 2.0
    model.generation_config = paper_generation_config(model.config, max_length_offset=8)
    return model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, model, tokenizer) -> Path:
    folder = tmp_path_factory.mktemp("n-best-model")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _generate_one(model, tokenizer, sentence: str, **kwargs):
    batch = tokenizer([sentence], return_tensors="pt")
    return model.generate(**batch, return_dict_in_generate=True, output_scores=True, **kwargs)


def test_n_best_are_generates_sequences_with_the_beams_own_scores(model, tokenizer):
    """Each input's n best are what generate() returns for that input alone, in its order; each score is
    the beam's own (sequences_scores), and the log-probability divided by the GNMT penalty of its length,
    except where the end token was forced at the length limit, which the beam counts as certain."""
    translations = translate_n_best(model, tokenizer, SENTENCES, n_best=3, batch_size=2, progress=False)
    assert [t.source for t in translations] == SENTENCES
    for sentence, translation in zip(SENTENCES, translations):
        if not sentence:
            assert [h.text for h in translation.hypotheses] == [""]
            continue
        alone = _generate_one(model, tokenizer, sentence, num_return_sequences=3)
        texts = tokenizer.batch_decode(alone.sequences, skip_special_tokens=True)
        assert [h.text for h in translation.hypotheses] == [text.strip() for text in texts]
        limit = len(tokenizer(sentence)["input_ids"]) + 8
        beams = zip(translation.hypotheses, alone.sequences_scores, alone.sequences)
        for hypothesis, beam_score, row in beams:
            length = int((row[1:] != tokenizer.pad_token_id).sum())
            assert hypothesis.score == pytest.approx(float(beam_score), abs=1e-4)
            if length <= limit:  # else the beam counted the end token forced at the limit as certain
                assert hypothesis.log_prob / gnmt_length_penalty(length, 0.6) == pytest.approx(
                    hypothesis.score
                )
            assert hypothesis.tokens == tokenizer.convert_ids_to_tokens(
                [i for i in row[1:].tolist() if i not in (tokenizer.pad_token_id, tokenizer.eos_token_id)]
            )


def test_log_probs_are_the_models_next_token_log_softmax(model, tokenizer):
    batch = tokenizer(["two men talk"], return_tensors="pt")
    output = [tokenizer.convert_tokens_to_ids("▁dog"), tokenizer.convert_tokens_to_ids("▁runs"), 2]
    [scores] = token_log_probs(model, batch["input_ids"], batch["attention_mask"], [output])
    decoder_input = torch.tensor([[model.config.decoder_start_token_id, *output[:-1]]])
    with torch.no_grad():
        logits = model(**batch, decoder_input_ids=decoder_input).logits[0]
    expected = [torch.log_softmax(logits[t], -1)[token].item() for t, token in enumerate(output)]
    assert scores == pytest.approx(expected, abs=1e-5)


def test_several_return_sequences_stay_with_their_own_sentence(model, tokenizer):
    """generate() returns each sentence's rows consecutively: every sentence gets its own hypotheses,
    whether num_return_sequences comes with the call or from the generation config."""
    outputs = translate(model, tokenizer, SENTENCES, progress=False, num_return_sequences=2)
    for sentence, hypotheses in zip(SENTENCES, outputs):
        if sentence:
            alone = _generate_one(model, tokenizer, sentence, num_return_sequences=2).sequences
            assert hypotheses == [t.strip() for t in tokenizer.batch_decode(alone, skip_special_tokens=True)]


def test_more_hypotheses_than_the_beam_are_refused(model, tokenizer):
    with pytest.raises(ValueError, match="n_best 5 is more than the 4 hypotheses the beam keeps"):
        translate_n_best(model, tokenizer, SENTENCES, n_best=5, progress=False)


def test_sampling_with_top_k_1_is_greedy_search(model, tokenizer):
    greedy = translate(model, tokenizer, SENTENCES, progress=False, num_beams=1)
    torch.manual_seed(0)
    sampled = translate(model, tokenizer, SENTENCES, progress=False, num_beams=1, do_sample=True, top_k=1)
    assert sampled == greedy


def test_an_input_longer_than_the_positions_is_cut_with_a_warning_naming_its_line(model, tokenizer, caplog):
    long_line = " ".join(WORDS * 10)
    positions = len(tokenizer(long_line)["input_ids"]) // 2
    original, model.config.max_position_embeddings = model.config.max_position_embeddings, positions
    try:
        translations = translate_n_best(
            model, tokenizer, ["two men talk", long_line], progress=False, line_numbers=[7, 8]
        )
    finally:
        model.config.max_position_embeddings = original
    assert [t.truncated for t in translations] == [False, True]
    assert f"line 8: {len(tokenizer(long_line)['input_ids'])} tokens" in caplog.text
    assert f"first {positions - 1} tokens" in caplog.text
    # The cut input is the line's first positions - 1 tokens and its end token.
    ids = tokenizer(long_line)["input_ids"]
    cut = tokenizer.decode(ids[: positions - 1], skip_special_tokens=True)
    assert translations[1].text == translate(model, tokenizer, [cut], progress=False)[0]


def test_split_sentences_translates_each_sentence_and_joins_them(model_dir):
    translator = load_translator(model_dir)
    paragraphs = ["a dog runs. two men talk! the cat sits on the mat.", "", "a girl reads a book."]
    joined = translator.translate_n_best(paragraphs, split_sentences=True)
    segmenter = pysbd.Segmenter(language="en", clean=False)
    for paragraph, translation in zip(paragraphs, joined):
        sentences = [s.strip() for s in segmenter.segment(paragraph) if s.strip()]
        alone = translator.translate(sentences) if sentences else []
        assert translation.text == " ".join(t for t in alone if t)
        assert len(translation.hypotheses) == 1
    assert len(joined) == len(paragraphs) and joined[1].text == ""
    with pytest.raises(ValueError, match="n_best 2 with sentence splitting"):
        translator.translate_n_best(paragraphs, split_sentences=True, n_best=2)


def test_split_sentences_renumbers_the_alignments(model_dir):
    translator = load_translator(model_dir)
    paragraph = "a dog runs. two men talk!"
    [joined] = translator.translate_n_best([paragraph], split_sentences=True, alignments=True)
    first, second = translator.translate_n_best(["a dog runs.", "two men talk!"], alignments=True)
    best = joined.hypotheses[0]
    assert best.source_words == paragraph.split()
    offset_source = len(first.hypotheses[0].source_words)
    offset_target = len(first.hypotheses[0].target_words)
    shifted = [
        f"{int(i) + offset_source}-{int(j) + offset_target}"
        for i, j in (pair.split("-") for pair in second.hypotheses[0].alignment.split())
    ]
    assert best.alignment.split() == first.hypotheses[0].alignment.split() + shifted
    assert all(abs(sum(row) - 1) < 1e-5 for row in best.attention)


def test_cli_writes_n_best_as_moses_tsv_and_as_jsonl(model_dir, model, tokenizer, capsys, monkeypatch):
    text = "\n".join(SENTENCES) + "\n"
    status, tsv, error = run_in_process(
        capsys, monkeypatch, "translate", "--model", str(model_dir), "--n-best", "2", stdin=text
    )
    assert status is None, error
    rows = [line.split(" ||| ") for line in tsv.splitlines()]
    expected = translate_n_best(model, tokenizer, SENTENCES, n_best=2, progress=False)
    written = [(int(r[0]), r[1], float(r[2] or "nan"), float(r[3] or "nan")) for r in rows]
    wanted = [
        (i, h.text, h.score if t.source else None, h.log_prob if t.source else None)
        for i, t in enumerate(expected)
        for h in t.hypotheses
    ]
    assert [(i, text) for i, text, _, _ in written] == [(i, text) for i, text, _, _ in wanted]
    for (_, _, score, log_prob), (_, _, wanted_score, wanted_log_prob) in zip(written, wanted):
        if wanted_score is None:  # a blank line: an empty hypothesis, with no score
            assert score != score and log_prob != log_prob
        else:
            assert (score, log_prob) == (
                pytest.approx(wanted_score, abs=1e-5),
                pytest.approx(wanted_log_prob),
            )
    status, jsonl, error = run_in_process(
        capsys,
        monkeypatch,
        "translate",
        "--model",
        str(model_dir),
        "--n-best",
        "2",
        "--output-format",
        "jsonl",
        stdin=text,
    )
    assert status is None, error
    objects = [json.loads(line) for line in jsonl.splitlines()]
    assert len(objects) == len(SENTENCES)
    for obj, translation in zip(objects, expected):
        assert [h["text"] for h in obj["translations"]] == [h.text for h in translation.hypotheses]
        assert set(obj["translations"][0]) >= {"text", "score", "log_prob", "tokens"}


def test_cli_refuses_contradictions_in_one_line(model_dir, capsys, monkeypatch):
    cases = {
        ("--n-best", "5"): "n_best 5 is more than the 4 hypotheses",
        ("--n-best", "2", "--output-format", "text"): "text has one translation a line",
        ("--sampling-topk", "5", "--num-beams", "4"): "sampling draws one output token at a time",
        ("--output", "/proc/version"): "--output /proc/version: cannot write there",
    }
    for flags, message in cases.items():
        status, _, error = run_in_process(
            capsys, monkeypatch, "translate", "--model", str(model_dir), *flags, stdin="a dog runs\n"
        )
        assert status == 2, (flags, error)
        assert message in error.strip().splitlines()[-1] and "Traceback" not in error, (flags, error)


def test_cli_names_the_line_that_is_not_utf8(model_dir, tmp_path, capsys, monkeypatch):
    source = tmp_path / "bad.en"
    source.write_bytes(b"a dog runs\ntwo men talk\na caf\xe9\n")
    translate = ["translate", "--model", str(model_dir)]
    status, _, error = run_in_process(capsys, monkeypatch, *translate, "--input", str(source))
    assert status == 2 and "line 3: not valid UTF-8" in error
    status, piped, error = run_in_process(capsys, monkeypatch, *translate, stdin=source.read_bytes())
    assert status == 2 and "standard input, line 3: not valid UTF-8" in error
    assert len(piped.splitlines()) == 2  # the lines before it were translated and written


def test_cli_sampling_is_seeded(model_dir, capsys, monkeypatch):
    text = "\n".join(SENTENCES * 3) + "\n"
    runs = [
        run_in_process(
            capsys,
            monkeypatch,
            "translate",
            "--model",
            str(model_dir),
            "--sampling-topk",
            "0",
            "--seed",
            seed,
            stdin=text,
        )
        for seed in "112"
    ]
    assert runs[0][0] is None, runs[0][2]
    assert runs[0][1] == runs[1][1] != runs[2][1]


def test_cli_translates_a_file_chunk_by_chunk_as_it_does_whole(model_dir, tmp_path, monkeypatch, capsys):
    source = tmp_path / "many.en"
    source.write_text("\n".join(SENTENCES * 5) + "\n", encoding="utf-8")
    outputs = []
    for chunk in (3, 10_000):
        monkeypatch.setattr(translate_command, "CHUNK_LINES", chunk)
        target = tmp_path / f"out-{chunk}.de"
        translate_command.main(["--model", str(model_dir), "--input", str(source), "--output", str(target)])
        outputs.append(target.read_text(encoding="utf-8"))
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == len(SENTENCES) * 5


def test_cli_answers_each_line_of_a_pipe_as_it_arrives(model_dir, model, tokenizer):
    """With its input still open, translate writes a line's translation once no more input comes."""
    process = forked_processes.popen(
        [sys.executable, "-m", "hf_vanilla_transformer", "translate", "--model", str(model_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    try:
        answers = []
        for sentence in ("two men talk", "a dog runs in the park"):
            process.stdin.write(f"{sentence}\n".encode())
            process.stdin.flush()
            started = time.monotonic()
            answers.append(process.stdout.readline().decode().rstrip("\n"))
            assert time.monotonic() - started < 60
        assert answers == translate(
            model, tokenizer, ["two men talk", "a dog runs in the park"], progress=False
        )
    finally:
        process.stdin.close()
        assert process.wait(timeout=60) == 0


def test_ctranslate2_n_best_scores_are_the_models_log_probabilities(model_dir, model, tokenizer, tmp_path):
    """The CTranslate2 export's n best come with CTranslate2's own forced-decoding log-probabilities,
    which equal the PyTorch model's for the same outputs; they are ranked by the beam's score."""
    pytest.importorskip("ctranslate2")
    from hf_vanilla_transformer.inference.engines.exporting import export

    folder = export(model_dir, "ctranslate2", tmp_path / "ct2")
    translations = load_translator(folder).translate_n_best(SENTENCES, n_best=3)
    for translation in translations:
        if not translation.source:
            continue
        assert len(translation.hypotheses) == 3
        scores = [h.score for h in translation.hypotheses]
        assert scores == sorted(scores, reverse=True)
        batch = tokenizer([translation.source] * 3, return_tensors="pt")
        outputs = [
            tokenizer.convert_tokens_to_ids(h.tokens) + [tokenizer.eos_token_id]
            for h in translation.hypotheses
        ]
        expected = token_log_probs(model, batch["input_ids"], batch["attention_mask"], outputs)
        for hypothesis, log_probs in zip(translation.hypotheses, expected):
            if len(hypothesis.tokens) < len(batch["input_ids"][0]) + 8:  # ended by the model, not the limit
                assert hypothesis.log_prob == pytest.approx(sum(log_probs), abs=1e-4)


def test_ctranslate2_aligns_with_the_same_attention_as_torch(model_dir, tmp_path):
    """CTranslate2's attention for alignments (the export's layer, heads averaged, of forced prefixes)
    equals the PyTorch model's, word by word."""
    pytest.importorskip("ctranslate2")
    from hf_vanilla_transformer.inference.engines.exporting import export

    folder = export(model_dir, "ctranslate2", tmp_path / "ct2")
    torch_side = load_translator(model_dir).translate_n_best(SENTENCES, n_best=2, alignments=True)
    ct2_side = load_translator(folder)
    for expected in torch_side:
        if not expected.source:
            continue
        for hypothesis in expected.hypotheses:
            ids = ct2_side.tokenizer.convert_tokens_to_ids(hypothesis.tokens)
            batch = ct2_side.tokenizer([expected.source], return_tensors="pt")
            start = ct2_side.model.generation_config.decoder_start_token_id
            sequences = torch.tensor([[start, *ids, ct2_side.tokenizer.eos_token_id]])
            [aligned] = align(
                ct2_side.model, ct2_side.tokenizer, [batch["input_ids"][0].tolist()], sequences.tolist()
            )
            assert aligned.target_words == hypothesis.target_words
            assert torch.tensor(aligned.attention) == pytest.approx(
                torch.tensor(hypothesis.attention), abs=1e-4
            )


def test_a_split_sentence_longer_than_the_positions_is_named_by_its_input_line(model_dir, caplog):
    translator = load_translator(model_dir)
    long_sentence = " ".join(WORDS * 10) + "."
    positions = translator.model.config.max_position_embeddings
    assert len(translator.tokenizer(long_sentence)["input_ids"]) > positions
    [short, joined] = translator.translate_n_best(
        ["two men talk.", f"a dog runs. {long_sentence}"], split_sentences=True, first_line=4
    )
    assert joined.truncated and not short.truncated
    assert "line 5: " in caplog.text and "line 6: " not in caplog.text
