"""Choosing the beam size and length penalty on a dev set (Section 6.1): the choice whose translations score
best is the one chosen and saved, and a later load of the model decodes with it."""

from pathlib import Path

import pytest
from conftest import tiny_model
from transformers import GenerationConfig

from hf_vanilla_transformer.commands.tune import main as tune_main
from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
from hf_vanilla_transformer.evaluation.metrics import corpus_bleu
from hf_vanilla_transformer.evaluation.tuning import DecodingChoice, save_decoding, search_decoding
from hf_vanilla_transformer.inference.translator import load_translator

REFERENCES = [
    "Ein Hund rennt durch den grünen Park am Morgen .",
    "Zwei Männer sprechen vor einem alten Haus miteinander .",
    "Ein Mädchen liest ein dickes Buch auf der Bank .",
]


class ShortBelowOneOrNarrow:
    """Translates to the reference itself when alpha is at least 1 and the beam at least 4, and to its first
    half otherwise: a model whose outputs grow with the length penalty and the beam. Records each call's
    beam size and alpha (None where the call gave none), and the other settings it was given."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, float | None]] = []
        self.other_settings: list[dict] = []

    def translate(self, sentences, *, batch_size, progress, num_beams, length_penalty=None, **others):
        self.asked.append((num_beams, length_penalty))
        self.other_settings.append(others)
        halves = [" ".join(r.split()[: len(r.split()) // 2]) for r in REFERENCES]
        return list(REFERENCES) if num_beams >= 4 and (length_penalty or 0) >= 1 else halves


def test_the_best_scoring_choice_is_chosen_first_tried_on_ties():
    translator = ShortBelowOneOrNarrow()
    search = search_decoding(translator, ["a", "b", "c"], REFERENCES, [1, 2, 4], [0.6, 1.5, 1.0, 0.6])
    # Beam by beam, each alpha once in the order given; greedy decoding once, with no alpha.
    assert translator.asked == [(1, None), (2, 0.6), (2, 1.5), (2, 1.0), (4, 0.6), (4, 1.5), (4, 1.0)]
    assert list(search.bleu) == [DecodingChoice(*asked) for asked in translator.asked]
    full = search.bleu[DecodingChoice(4, 1.5)], search.bleu[DecodingChoice(4, 1.0)]
    assert full[0].score == full[1].score == pytest.approx(100)
    halves = [search.bleu[DecodingChoice(*asked)] for asked in translator.asked[:5]]
    assert all(bleu.score < 50 and bleu.brevity_penalty < 1 for bleu in halves)
    assert search.best == DecodingChoice(4, 1.5)
    assert str(search.best) == "beam 4, length penalty 1.5"
    assert str(DecodingChoice(1, None)) == "beam 1 (greedy)"


def test_other_decoding_settings_reach_every_translation():
    translator = ShortBelowOneOrNarrow()
    search_decoding(translator, ["a", "b", "c"], REFERENCES, [1, 4], [0.6, 1.0], max_new_tokens=5)
    assert translator.other_settings == [{"max_new_tokens": 5}] * 3
    for searched in ({"length_penalty": 2.0}, {"num_beams": 5}):
        with pytest.raises(ValueError, match="sets .* itself"):
            search_decoding(translator, ["a", "b", "c"], REFERENCES, [4], [0.6], **searched)


@pytest.mark.parametrize(
    ("beams", "alphas", "sources", "message"),
    [
        ([4], [], ["a", "b", "c"], "at least one"),
        ([], [0.6], ["a", "b", "c"], "at least one"),
        ([4, 0], [0.6], ["a", "b", "c"], "1 or more"),
        ([4], [0.6, -1], ["a", "b", "c"], "0 or more"),
        ([4], [1], ["a"], "line-aligned"),
    ],
)
def test_bad_searches_are_refused(beams, alphas, sources, message):
    with pytest.raises(ValueError, match=message):
        search_decoding(ShortBelowOneOrNarrow(), sources, REFERENCES, beams, alphas)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    tokenizer = train_shared_bpe_tokenizer(
        REFERENCES * 5, vocab_size=90, min_frequency=1, show_progress=False
    )
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    ids |= {"bos_token_id": tokenizer.bos_token_id, "decoder_start_token_id": tokenizer.bos_token_id}
    model = tiny_model(vocab_size=len(tokenizer), **ids)
    model.generation_config.num_beams = 2  # the length penalty ranks beam hypotheses only
    model.generation_config.max_new_tokens = 6
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def test_save_changes_only_the_beam_size_and_length_penalty(model_dir):
    before = GenerationConfig.from_pretrained(model_dir).to_dict()
    save_decoding(model_dir, DecodingChoice(5, 1.3))
    after = GenerationConfig.from_pretrained(model_dir).to_dict()
    assert (after.pop("num_beams"), after.pop("length_penalty")) == (5, 1.3)
    assert (before.pop("num_beams"), before.pop("length_penalty")) != (5, 1.3)
    assert after == before
    save_decoding(model_dir, DecodingChoice(1, None))  # transformers refuses beam-only settings with greedy
    greedy = GenerationConfig.from_pretrained(model_dir).to_dict()
    unset = greedy.pop("num_beams"), greedy.pop("length_penalty"), greedy.pop("early_stopping")
    assert unset == (1, None, None)
    assert greedy == {key: value for key, value in after.items() if key != "early_stopping"}
    with pytest.raises(FileNotFoundError, match="local model folder"):
        save_decoding(model_dir.parent / "missing", DecodingChoice(4, 1.0))


def tune_args(model_dir: Path, folder: Path, sources: list[str], references: list[str]) -> list[str]:
    """The command's arguments for a dev set of these lines, written into `folder`."""
    (folder / "dev.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (folder / "dev.de").write_text("\n".join(references) + "\n", encoding="utf-8")
    return [
        "--model",
        str(model_dir),
        "--source",
        str(folder / "dev.en"),
        "--reference",
        str(folder / "dev.de"),
    ]


@pytest.mark.parametrize("beam_sizes", [None, [1, 3]])
def test_the_command_scores_real_translations_and_saves_the_best(model_dir, tmp_path, capsys, beam_sizes):
    sources = ["A dog runs.", "Two men talk.", "A girl reads."]
    args = tune_args(model_dir, tmp_path, sources, REFERENCES)
    beam_args = ["--beam-sizes", *map(str, beam_sizes)] if beam_sizes else []
    tune_main([*args, *beam_args, "--length-penalties", "2.0", "0.6", "--save"])
    printed = capsys.readouterr().out
    # The same search through the library, and each choice's translations made afresh: every translation
    # names its beam size and alpha, so the saved ones are moot.
    translator = load_translator(model_dir, "torch")
    search = search_decoding(translator, sources, REFERENCES, beam_sizes or [2], [2.0, 0.6])
    expected = [(1, None), (3, 2.0), (3, 0.6)] if beam_sizes else [(2, 2.0), (2, 0.6)]
    assert list(search.bleu) == [DecodingChoice(*choice) for choice in expected]
    for choice, bleu in search.bleu.items():
        alpha = {} if choice.length_penalty is None else {"length_penalty": choice.length_penalty}
        hypotheses = translator.translate(sources, num_beams=choice.num_beams, **alpha)
        assert bleu == corpus_bleu(hypotheses, REFERENCES)
        assert f"{choice}: {bleu}" in printed
    saved = GenerationConfig.from_pretrained(model_dir)
    assert (saved.num_beams, saved.length_penalty) == search.best
    assert f"best on this dev set: {search.best}" in printed


def test_a_greedy_model_is_refused_without_beam_sizes(model_dir, tmp_path, capsys):
    config = GenerationConfig.from_pretrained(model_dir)
    config.num_beams = 1
    config.save_pretrained(model_dir)
    args = tune_args(model_dir, tmp_path, ["A dog runs."], ["Ein Hund rennt."])
    with pytest.raises(SystemExit) as exit_info:
        tune_main(args)
    assert exit_info.value.code == 2 and "give --beam-sizes" in capsys.readouterr().err
    tune_main([*args, "--beam-sizes", "2", "--length-penalties", "1"])
    assert "beam 2, length penalty 1: BLEU" in capsys.readouterr().out
