"""Scoring given translations by forced decoding (`scoring.score_pairs`, `vanilla-transformer score`): the
log-probabilities are the model's own, by hand from its logits and as beam search accumulates them, in any
batch order and on every engine; bad input is refused in one line."""

import importlib.util
import json
import math
import random
from pathlib import Path

import pytest
import torch
from conftest import tiny_model

from hf_vanilla_transformer import paper_generation_config
from hf_vanilla_transformer.commands import main as command_main
from hf_vanilla_transformer.conversion import tokenizer_from_fairseq_dictionary
from hf_vanilla_transformer.inference.engines.exporting import export
from hf_vanilla_transformer.inference.scoring import PairScore, score_pairs
from hf_vanilla_transformer.inference.translator import load_translator
from hf_vanilla_transformer.translation_pipeline import TARGET_TOKENIZER_DIR
from hf_vanilla_transformer.vanilla_transformer.generation_vanilla_transformer import gnmt_length_penalty

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
WORDS = [f"w{i}" for i in range(12)]
# A model with separate vocabularies writes the reversal in upper case, and its decoder starts from </s>,
# as fairseq's does.
VARIANTS = {
    "shared": {},
    "separate": {
        "decoder_start_token_id": 2,
        "share_encoder_decoder_embeddings": False,
        "decoder_vocab_size": len(SPECIALS) + len(WORDS),
    },
}
# Enough training to write outputs of varied lengths that end with </s> by themselves, far from perfect.
TRAINING_STEPS = 40


def _installed(*packages: str) -> bool:
    return all(importlib.util.find_spec(package) is not None for package in packages)


def _sentences(count: int, seed: int, longest: int = 6) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (count,), generator=generator).tolist()
    return [
        " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (n,), generator=generator)) for n in lengths
    ]


def _reversal(sentence: str, variant: str) -> str:
    reversed_words = " ".join(reversed(sentence.split()))
    return reversed_words.upper() if variant == "separate" else reversed_words


def train_reversal(folder: Path, variant: str) -> Path:
    """A 2+2-layer model trained for TRAINING_STEPS steps to reverse word sequences, saved with its
    tokenizer(s) and the paper's generation config in `folder`."""
    tokenizer = tokenizer_from_fairseq_dictionary(SPECIALS + WORDS)
    target_words = [word.upper() for word in WORDS] if variant == "separate" else WORDS
    target_tokenizer = tokenizer_from_fairseq_dictionary(SPECIALS + target_words)
    model = tiny_model(vocab_size=len(tokenizer), P_drop=0.0, **VARIANTS[variant]).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3, betas=(0.9, 0.98))
    for step in range(TRAINING_STEPS):
        sources = _sentences(32, seed=step)
        batch = tokenizer(sources, return_tensors="pt", padding=True)
        labels = target_tokenizer(
            [_reversal(s, variant) for s in sources], return_tensors="pt", padding=True
        )["input_ids"]
        labels[labels == target_tokenizer.pad_token_id] = -100
        loss = model(**batch, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().generation_config = paper_generation_config(model.config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if variant == "separate":
        target_tokenizer.save_pretrained(folder / TARGET_TOKENIZER_DIR)
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """`trained(variant)`: the trained model's folder; `trained(variant, "ctranslate2" | "onnx")`: its
    export. Each is made once per module."""
    folders: dict[tuple[str, str], Path] = {}

    def get(variant: str, engine: str = "torch") -> Path:
        if (variant, engine) not in folders:
            folder = tmp_path_factory.mktemp(f"{variant}-{engine}")
            if engine == "torch":
                folders[variant, engine] = train_reversal(folder, variant)
            else:
                folders[variant, engine] = export(get(variant), engine, folder, force=True)
        return folders[variant, engine]

    return get


SOURCES = _sentences(10, seed=1000)


def _score(folder: Path, sources: list[str], targets: list[str], **options) -> list[PairScore]:
    translator = load_translator(folder)
    return score_pairs(
        translator.model,
        translator.tokenizer,
        sources,
        targets,
        target_tokenizer=translator.target_tokenizer,
        **options,
    )


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_per_token_log_probs_are_the_log_softmax_of_the_models_logits(trained, variant):
    folder = trained(variant)
    translator = load_translator(folder)
    model, decoder = translator.model, translator.target_tokenizer or translator.tokenizer
    source, target = "w3 w1 w4 w1 w5", _reversal("w9 w2 w6", variant)
    (scored,) = score_pairs(model, translator.tokenizer, [source], [target], target_tokenizer=decoder)

    # By hand: the decoder reads its start token and the target, and each next token's log-softmax counts.
    target_ids = decoder(target)["input_ids"]
    assert target_ids[-1] == model.config.eos_token_id
    start = torch.tensor([[model.config.decoder_start_token_id]])
    decoder_input_ids = torch.cat([start, torch.tensor([target_ids[:-1]])], dim=1)
    with torch.no_grad():
        logits = model(
            **translator.tokenizer(source, return_tensors="pt"), decoder_input_ids=decoder_input_ids
        )
    log_probs = torch.log_softmax(logits.logits[0], dim=-1)
    expected = [log_probs[t, token].item() for t, token in enumerate(target_ids)]

    assert scored.tokens == decoder.convert_ids_to_tokens(target_ids) and scored.tokens[-1] == "</s>"
    assert scored.per_token == pytest.approx(expected, abs=1e-6)
    assert scored.log_prob == pytest.approx(math.fsum(expected), abs=1e-5)
    assert scored.mean == pytest.approx(scored.log_prob / len(target_ids))
    assert all(value < 0 for value in scored.per_token)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_score_of_the_beam_search_output_is_the_beam_searchs_own_log_probability(trained, variant):
    """generate() ranks by sum log p / lp(|Y|), the GNMT penalty ((5 + |Y|) / 6)^0.6 with |Y| the output's
    tokens, </s> counted (transformers' cur_len + 1 - decoder_prompt_len): times lp(|Y|), its sum."""
    folder = trained(variant)
    translator = load_translator(folder)
    model, decoder = translator.model, translator.target_tokenizer or translator.tokenizer
    assert model.generation_config.length_penalty_type == "gnmt"
    alpha = model.generation_config.length_penalty
    batch = translator.tokenizer(SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        output = model.generate(**batch, num_beams=4, return_dict_in_generate=True, output_scores=True)
    end = model.config.eos_token_id
    sources, natural, beam_log_probs = [], [], []
    rows = zip(
        SOURCES, output.sequences[:, 1:].tolist(), output.sequences_scores.tolist(), batch.attention_mask
    )
    for source, row, score, mask in rows:
        length = row.index(end) + 1 if end in row else len(row)
        limit = int(mask.sum()) + model.generation_config.max_length_offset
        if end in row and length <= limit:  # ended by itself, not forced at the length limit
            sources.append(source)
            natural.append(row[:length])
            beam_log_probs.append(score * gnmt_length_penalty(length, alpha))
    # Outputs of several lengths, so that a wrong |Y| could not go unnoticed.
    assert len(natural) >= 6 and len({len(ids) for ids in natural}) >= 3

    texts = [decoder.decode(ids, skip_special_tokens=True) for ids in natural]
    assert [decoder(text)["input_ids"] for text in texts] == natural, "the texts encode back to the outputs"
    scores = score_pairs(model, translator.tokenizer, sources, texts, target_tokenizer=decoder)
    assert [s.log_prob for s in scores] == pytest.approx(beam_log_probs, abs=1e-4)


def test_a_shuffled_batch_scores_as_one_pair_at_a_time(trained):
    folder = trained("shared")
    targets = [_reversal(source, "shared") if i % 2 else source for i, source in enumerate(SOURCES)]
    alone = [_score(folder, [s], [t])[0] for s, t in zip(SOURCES, targets)]
    order = list(range(len(SOURCES)))
    random.Random(0).shuffle(order)
    batched = _score(folder, [SOURCES[i] for i in order], [targets[i] for i in order], batch_size=4)
    for position, i in enumerate(order):
        assert batched[position].tokens == alone[i].tokens
        assert batched[position].per_token == pytest.approx(alone[i].per_token, abs=1e-5)
    # The reversals, which the model learned, score higher than the copies, which it did not.
    assert sum(alone[i].mean for i in range(1, 10, 2)) > sum(alone[i].mean for i in range(0, 10, 2))


@pytest.mark.skipif(
    not _installed("ctranslate2", "onnx", "onnxscript", "onnxruntime"),
    reason="ctranslate2 or ONNX is not installed (pip install -e '.[export]')",
)
@pytest.mark.parametrize("engine", ["ctranslate2", "onnx"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_exported_engines_score_as_the_pytorch_model(trained, variant, engine):
    targets = [_reversal(source, variant) for source in SOURCES]
    expected = _score(trained(variant), SOURCES, targets, batch_size=3)
    scored = _score(trained(variant, engine), SOURCES, targets, batch_size=3)
    for got, want in zip(scored, expected, strict=True):
        assert got.tokens == want.tokens
        assert got.per_token == pytest.approx(want.per_token, abs=1e-4)


def test_refusals_of_the_library(trained):
    folder = trained("shared")
    with pytest.raises(ValueError, match=r"^2 sources but 1 targets: give one target per source"):
        _score(folder, ["w1", "w2"], ["w1"])
    with pytest.raises(ValueError, match=r"^line 2: the target is blank: scoring needs a sentence"):
        _score(folder, ["w1", "w2"], ["w1", " "])
    too_long = " ".join(["w1"] * 70)
    with pytest.raises(
        ValueError, match=r"^line 3: a source of 71 and a target of 2 tokens, more than the model's 64"
    ):
        _score(folder, ["w1", "w2", too_long], ["w1", "w2", "w3"])


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert command_main(["score", *argv]) is None
    return capsys.readouterr().out


def test_the_command_writes_what_the_library_computes(trained, tmp_path, capsys):
    folder = trained("separate")
    targets = [_reversal(source, "separate") for source in SOURCES]
    (tmp_path / "src.txt").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    (tmp_path / "tgt.txt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    files = [
        "--model",
        str(folder),
        "--source",
        str(tmp_path / "src.txt"),
        "--target",
        str(tmp_path / "tgt.txt"),
    ]
    expected = _score(folder, SOURCES, targets)

    text = _run(capsys, *files, "--batch-size", "3").splitlines()
    assert len(text) == len(SOURCES)
    for line, want in zip(text, expected):
        total, mean = map(float, line.split("\t"))
        assert total == pytest.approx(want.log_prob, abs=1e-5) and mean == pytest.approx(want.mean, abs=1e-5)

    assert _run(capsys, *files, "--output-format", "jsonl", "--output", str(tmp_path / "scores.jsonl")) == ""
    objects = [
        json.loads(line) for line in (tmp_path / "scores.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert [set(o) for o in objects] == [{"log_prob", "tokens", "per_token"}] * len(SOURCES)
    for got, want in zip(objects, expected):
        assert got["tokens"] == want.tokens and got["tokens"][-1] == "</s>"
        assert got["per_token"] == pytest.approx(want.per_token, abs=1e-6)
        assert got["log_prob"] == pytest.approx(math.fsum(got["per_token"]), abs=1e-6)


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line `vanilla-transformer score ARGV` refuses with (exit status 2), after the progress bar
    of the model's loading where the refusal comes from the model's positions."""
    with pytest.raises(SystemExit) as exit_info:
        command_main(["score", *argv])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error, error
    last_line = error.strip().splitlines()[-1].split("\r")[-1]
    assert last_line.startswith("vanilla-transformer score: error: "), error
    return last_line


def test_the_command_refuses_bad_files_in_one_line(trained, tmp_path, capsys):
    model = ["--model", str(trained("shared"))]

    def files(source: bytes, target: bytes) -> list[str]:
        (tmp_path / "s.txt").write_bytes(source)
        (tmp_path / "t.txt").write_bytes(target)
        return [*model, "--source", str(tmp_path / "s.txt"), "--target", str(tmp_path / "t.txt")]

    error = _error(capsys, *files(b"w1\nw2\nw3\n", b"w1\nw2\n"))
    assert "s.txt has 3 lines but --target" in error and "t.txt has 2: give line-aligned files" in error
    error = _error(capsys, *files(b"w1\nw2\n", b"w1\nw2 \xe9\n"))
    assert "--target" in error and "t.txt, line 2: not valid UTF-8" in error
    error = _error(capsys, *files(b"w1\n\nw3\n", b"w1\nw2\nw3\n"))
    assert error.endswith(
        "error: line 2: the source is blank: scoring needs a sentence on both sides; "
        "remove the line from both files."
    )
    error = _error(capsys, *files(b"w1\n" + b"w2 " * 70 + b"\n", b"w1\nw2\n"))
    assert "line 2: a source of 71 and a target of 2 tokens, more than the model's 64 positions" in error
    error = _error(capsys, *files(b"w1\n", b"w1\n"), "--output", str(tmp_path / "s.txt"))
    assert "is also --source" in error
    error = _error(
        capsys, *model, "--source", str(tmp_path / "none.txt"), "--target", str(tmp_path / "t.txt")
    )
    assert "none.txt: no such file" in error
    error = _error(capsys, *files(b"w1\n", b"w1\n"), "--engine", "onnx")
    assert "export it first" in error
