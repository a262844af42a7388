"""The figures: positional encodings, the learning-rate schedule and attention heatmaps."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config
from matplotlib import font_manager

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.commands import command_module
from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
from hf_vanilla_transformer.figures import plotting
from hf_vanilla_transformer.training.chatbot import (
    ChatbotSettings,
    chatbot_generation_config,
    load_chatbot_pairs,
    train_chatbot,
)

MIN_PNG_BYTES = 10_000  # a blank or failed figure is a few kB


@pytest.fixture(scope="module")
def tokenizer():
    questions, answers = load_chatbot_pairs(limit=50)
    return train_shared_bpe_tokenizer(questions + answers, vocab_size=500, show_progress=False)


@pytest.fixture(scope="module")
def maps(tokenizer):
    torch.manual_seed(0)
    config = tiny_config(vocab_size=len(tokenizer), decoder_layers=3, attn_implementation="eager")
    model = VanillaTransformerForConditionalGeneration(config).eval()
    model.generation_config = chatbot_generation_config(config, max_length=6)
    return plotting.attention_maps(model, tokenizer, "영화 볼래 ?")


def test_positional_encoding_figure_plots_the_formula(tmp_path):
    path = tmp_path / "pe.png"
    _, matrix = plotting.plot_positional_encoding(50, 128, path=path)
    position = np.arange(50)[:, None]
    angle = position / 10000 ** (2 * (np.arange(128)[None, :] // 2) / 128)
    expected = np.where(np.arange(128) % 2 == 0, np.sin(angle), np.cos(angle))
    assert matrix.shape == (50, 128)
    np.testing.assert_allclose(matrix, expected, atol=1e-6)
    assert path.stat().st_size > MIN_PNG_BYTES


def test_learning_rate_figure_peaks_at_the_warmup_step(tmp_path):
    path = tmp_path / "lr.png"
    _, rates = plotting.plot_learning_rate(d_model=256, warmup_steps=4000, total_steps=200_000, path=path)
    assert rates.shape == (200_000,)
    assert int(np.argmax(rates)) + 1 == 4000
    assert rates.max() == pytest.approx(256**-0.5 * 4000**-0.5)
    assert path.stat().st_size > MIN_PNG_BYTES


def test_attention_maps_have_one_matrix_per_layer_and_head(maps):
    source, target = len(maps.source_ids), len(maps.target_ids)
    assert maps.target_ids[0] == 0  # the decoder starts at <s>
    assert maps.encoder.shape == (2, 4, source, source)
    assert maps.decoder.shape == (3, 4, target, target)
    assert maps.cross.shape == (3, 4, target, source)
    np.testing.assert_allclose(maps.cross.sum(-1), 1.0, atol=1e-5)
    assert np.allclose(np.triu(maps.decoder, k=1), 0.0)  # masked self-attention never looks ahead


@pytest.mark.parametrize("kind, layers", [("encoder", 2), ("decoder", 3), ("cross", 3)])
def test_attention_figure_has_a_panel_per_layer_and_head(maps, kind, layers, tmp_path):
    path = tmp_path / f"{kind}.png"
    figure = plotting.plot_attention(maps, kind, path=path)
    panels = [axes for axes in figure.axes if axes.images]
    assert len(panels) == layers * 4
    assert path.stat().st_size > MIN_PNG_BYTES
    keys = maps.source_tokens if kind != "decoder" else maps.target_tokens
    if plotting.find_hangul_font():
        assert [label.get_text() for label in panels[0].get_xticklabels()] == keys


def test_without_a_hangul_font_tokens_become_ids_with_a_warning(maps, monkeypatch):
    monkeypatch.setattr(plotting, "find_hangul_font", lambda: None)
    with pytest.warns(UserWarning, match="fonts-nanum"):
        figure = plotting.plot_attention(maps, "encoder")
    labels = [label.get_text() for label in figure.axes[0].get_xticklabels()]
    assert labels == [str(token_id) for token_id in maps.source_ids]


def test_a_last_resort_font_is_not_taken_for_a_hangul_font(monkeypatch):
    last_resort = [
        entry for entry in font_manager.fontManager.ttflist if entry.name.startswith("Last Resort")
    ]
    if not last_resort:
        pytest.skip("this matplotlib bundles no Last Resort font")
    # Its charmap holds every Hangul syllable, each drawn as a box.
    assert plotting._has_glyphs(last_resort[0].fname, "한가힣")
    monkeypatch.setattr(font_manager.fontManager, "ttflist", last_resort)
    monkeypatch.setattr(font_manager, "findSystemFonts", lambda: [entry.fname for entry in last_resort])
    plotting.find_hangul_font.cache_clear()
    try:
        assert plotting.find_hangul_font() is None
    finally:
        plotting.find_hangul_font.cache_clear()


def test_attention_maps_need_eager_attention(tokenizer):
    config = tiny_config(vocab_size=len(tokenizer), attn_implementation="sdpa")
    with pytest.raises(ValueError, match="eager"):
        plotting.attention_maps(VanillaTransformerForConditionalGeneration(config), tokenizer, "안녕")


def figures_command():
    return command_module("figures")


def test_figures_command_writes_the_static_figures(tmp_path):
    figures_command().main(["--out", str(tmp_path), "--total-steps", "20000"])
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "learning_rate.png",
        "positional_encoding.png",
    ]


def test_figures_command_draws_a_trained_chatbots_attention_and_curves(tmp_path):
    settings = ChatbotSettings(
        vocab_size=300, num_layers=1, d_model=16, num_heads=2, dff=32, batch_size=8, max_steps=4, eval_size=4,
        limit=20, logging_steps=1,
    )  # fmt: skip
    run = train_chatbot(tmp_path / "chatbot", settings=settings, show_progress=False).output_dir
    out = tmp_path / "figures"
    figures_command().main(["--model", str(run), "--out", str(out)])
    assert sorted(path.name for path in out.iterdir()) == [
        "attention_cross.png",
        "attention_decoder_self.png",
        "attention_encoder_self.png",
        "chatbot_training.png",
        "learning_rate.png",
        "positional_encoding.png",
    ]


def test_figures_command_draws_a_translation_models_alignment(tokenizer, tmp_path):
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(tiny_config(vocab_size=len(tokenizer)))
    model.generation_config = chatbot_generation_config(model.config, max_length=6)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    out = tmp_path / "figures"
    figures_command().main(["--out", str(out), "--translation-model", str(tmp_path / "model")])
    assert (out / "translation_alignment.png").stat().st_size > MIN_PNG_BYTES


def write_trainer_state(run: Path, step: int, history: list[dict]) -> None:
    """A checkpoint of `run` at `step` whose trainer state logged `history`, as the Trainer writes it."""
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": history}))


def test_training_curves_plot_the_newest_checkpoints_log(tmp_path):
    run = tmp_path / "run"
    older = [{"step": 5, "loss": 9.0}, {"step": 10, "eval_loss": 8.5}]
    newest = [*older, {"step": 15, "loss": 7.0}, {"step": 20, "loss": 6.5}, {"step": 20, "eval_loss": 6.9}]
    write_trainer_state(run, 10, older)
    # "checkpoint-20" sorts before "checkpoint-5" as text: order must be numeric
    write_trainer_state(run, 20, newest)
    write_trainer_state(run, 5, older[:1])
    (run / "model").mkdir()
    (run / "model" / "results.json").write_text(json.dumps({"steps": 20, "dev_loss": 6.7}))

    path = tmp_path / "curves.png"
    figure, series = plotting.plot_training_curves(run, path=path)
    assert series == {
        "train": [(5, 9.0), (15, 7.0), (20, 6.5)],
        "dev": [(10, 8.5), (20, 6.9)],
        "averaged_dev": [(20, 6.7)],
    }
    drawn = {line.get_label(): list(zip(line.get_xdata(), line.get_ydata())) for line in figure.axes[0].lines}
    assert drawn["train loss"] == series["train"] and drawn["dev loss"] == series["dev"]
    assert path.stat().st_size > MIN_PNG_BYTES
    with pytest.raises(FileNotFoundError, match="is it a vanilla-transformer train run"):
        plotting.plot_training_curves(tmp_path / "empty")


def test_compared_runs_share_one_axes_and_their_differences_from_the_first_are_drawn(tmp_path):
    eager = [{"step": 10, "loss": 9.0}, {"step": 20, "loss": 8.0}, {"step": 20, "eval_loss": 8.4}]
    compiled = [{"step": 10, "loss": 9.25}, {"step": 20, "loss": 7.5}, {"step": 30, "loss": 7.0}]
    write_trainer_state(tmp_path / "eager", 20, eager)
    write_trainer_state(tmp_path / "compiled", 30, compiled)

    path = tmp_path / "compared.png"
    figure, series = plotting.plot_training_losses_compared(
        [tmp_path / "eager", tmp_path / "compiled"], path=path
    )
    assert series == {"eager": [(10, 9.0), (20, 8.0)], "compiled": [(10, 9.25), (20, 7.5), (30, 7.0)]}
    losses, differences = figure.axes
    drawn = {line.get_label(): list(zip(line.get_xdata(), line.get_ydata())) for line in losses.lines}
    assert drawn == series
    difference = next(line for line in differences.lines if line.get_label() == "compiled - eager")
    assert list(zip(difference.get_xdata(), difference.get_ydata())) == [(10, 0.25), (20, -0.5)]
    assert path.stat().st_size > MIN_PNG_BYTES

    # Runs in folders of the same name are told apart by their whole paths.
    write_trainer_state(tmp_path / "a" / "run", 20, eager)
    write_trainer_state(tmp_path / "b" / "run", 20, eager)
    _, series = plotting.plot_training_losses_compared([tmp_path / "a" / "run", tmp_path / "b" / "run"])
    assert list(series) == [str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run")]


def test_figures_command_compares_runs_and_refuses_one_run_or_an_untrained_folder(tmp_path, capsys):
    for name in ("eager", "compiled"):
        write_trainer_state(tmp_path / name, 10, [{"step": 10, "loss": 9.0}])
    out = tmp_path / "figures"
    runs = [str(tmp_path / "eager"), str(tmp_path / "compiled")]
    figures_command().main(["--out", str(out), "--run", *runs, "--compare", "compiled_against_eager"])
    assert (out / "compiled_against_eager.png").stat().st_size > MIN_PNG_BYTES
    assert (out / "eager_training.png").is_file() and (out / "compiled_training.png").is_file()

    with pytest.raises(SystemExit) as refused:
        figures_command().main(["--out", str(out), "--run", runs[0], "--compare", "alone"])
    assert refused.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--compare draws two or more runs on one figure; --run gave 1" in error

    (tmp_path / "untrained").mkdir()
    with pytest.raises(SystemExit) as refused:
        figures_command().main(["--out", str(out), "--run", runs[0], str(tmp_path / "untrained")])
    assert refused.value.code == 2
    error = capsys.readouterr().err.strip()
    assert "Traceback" not in error and "No checkpoint-*/trainer_state.json in" in error.splitlines()[-1]


def test_chatbot_curves_plot_the_logged_loss_and_every_epochs_evaluation(tmp_path):
    run = tmp_path / "chatbot"
    (run / "checkpoint-4").mkdir(parents=True)
    history = [
        {"epoch": 0.5, "step": 1, "loss": 9.0},
        {"epoch": 1.0, "step": 2, "eval_held_out_loss": 8.0, "eval_held_out_accuracy": 0.1},
        {"epoch": 1.0, "step": 2, "eval_train_sample_loss": 7.9, "eval_train_sample_accuracy": 0.12},
        {"epoch": 1.5, "step": 3, "loss": 7.5},
        {"epoch": 2.0, "step": 4, "eval_held_out_loss": 7.0, "eval_held_out_accuracy": 0.2},
        {"epoch": 2.0, "step": 4, "eval_train_sample_loss": 6.5, "eval_train_sample_accuracy": 0.25},
    ]
    (run / "checkpoint-4" / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    path = tmp_path / "chatbot.png"
    figure, series = plotting.plot_chatbot_curves(run, path=path)
    assert series == {
        "train loss": [(0.5, 9.0), (1.5, 7.5)],
        "held-out loss": [(1.0, 8.0), (2.0, 7.0)],
        "held-out accuracy": [(1.0, 0.1), (2.0, 0.2)],
        "training sample loss": [(1.0, 7.9), (2.0, 6.5)],
        "training sample accuracy": [(1.0, 0.12), (2.0, 0.25)],
    }
    loss_axes, accuracy_axes = figure.axes
    assert {line.get_label() for line in accuracy_axes.lines} == {
        "held-out accuracy",
        "training sample accuracy",
    }
    assert len(loss_axes.lines) == 3 and path.stat().st_size > MIN_PNG_BYTES
    with pytest.raises(FileNotFoundError, match="is it a chatbot train run"):
        plotting.plot_chatbot_curves(tmp_path / "empty")


def test_alignment_figure_averages_each_layers_heads_of_the_cross_attention(maps, tmp_path):
    path = tmp_path / "alignment.png"
    figure, alignment = plotting.plot_alignment(maps, path=path)
    # Recomputed from the attention probabilities: each output token's weights over the source sum to 1.
    layers, heads, targets, sources = maps.cross.shape
    np.testing.assert_allclose(alignment, maps.cross.sum(axis=1) / heads, rtol=1e-6)
    np.testing.assert_allclose(alignment.sum(axis=-1), np.ones((layers, targets)), atol=1e-5)
    drawn = [axes.images[0].get_array() for axes in figure.axes if axes.images]
    assert len(drawn) == layers
    for layer, image in enumerate(drawn):
        np.testing.assert_array_equal(np.asarray(image), alignment[layer])
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == maps.source_tokens
    assert path.stat().st_size > MIN_PNG_BYTES
