"""The figures readers of the paper and of the Keras chatbot tutorial look at, drawn from this package.

- `plot_positional_encoding`: the sinusoid matrix of Section 3.5 (50 positions x 128 dimensions, as the
  tutorial draws it).
- `plot_learning_rate`: the schedule of Section 5.3, Eq. 3, over 200,000 steps.
- `plot_training_curves`: training and dev loss of a `vanilla-transformer train` run, from its trainer state.
- `plot_training_losses_compared`: the training losses of several such runs on one axes (eager against
  `--compile`, say), with each one's difference from the first.
- `attention_maps` / `plot_attention`: the weights of Eq. 1 for one input, per layer and head, for the three
  uses of attention of Section 3.2.3 (encoder self-attention, masked decoder self-attention and
  encoder-decoder attention), with the tokens on the axes.
- `plot_alignment`: a translation model's encoder-decoder attention averaged over heads, one panel per
  layer: which source tokens each output token drew on, the alignment picture of attention-based NMT.

matplotlib is the optional extra `plots` (`pip install hf-vanilla-transformer[plots]`). Figures are built
with `matplotlib.figure.Figure`, not pyplot, so nothing here touches a GUI backend or global state.
Korean tokens need a font with Hangul glyphs: `find_hangul_font` looks for one, and without one the
attention axes show token ids, with a warning, instead of empty boxes.
"""

import functools
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from ..common.model_location import RESULTS_FILE, TRAINER_STATE_FILE
from ..training.averaging import last_checkpoints
from ..training.schedule import noam_lr
from ..vanilla_transformer.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    sinusoidal_position_encoding,
)

try:
    from matplotlib import font_manager, ft2font
    from matplotlib.figure import Figure
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError(
        "hf_vanilla_transformer.figures.plotting needs matplotlib: "
        "pip install 'hf-vanilla-transformer[plots]'."
    ) from error

# Fonts with Hangul that common systems ship, tried before scanning every font: Debian/Ubuntu fonts-nanum,
# Noto CJK (fonts-noto-cjk), Windows, macOS, and the older Un/Baekmuk fonts.
PREFERRED_HANGUL_FONTS = (
    "NanumGothic",
    "NanumBarunGothic",
    "Noto Sans CJK KR",
    "Noto Sans KR",
    "Malgun Gothic",
    "Apple SD Gothic Neo",
    "AppleGothic",
    "UnDotum",
    "Baekmuk Gulim",
)
# Characters a font must have to count as a Hangul font: a common syllable, the first and the last one.
_HANGUL_PROBE = "한가힣"
# Fonts that map every code point to a placeholder box (matplotlib bundles "Last Resort High-Efficiency"
# as its final fallback): they pass the glyph probe but draw no Hangul.
_PLACEHOLDER_FONT_PREFIX = "Last Resort"
# matplotlib's bundled font, which has the "▁" word-start mark of the tokenizer that Hangul fonts lack.
_FALLBACK_FAMILY = "DejaVu Sans"

ATTENTION_KINDS = {
    "encoder": "Encoder self-attention",
    "decoder": "Decoder (masked) self-attention",
    "cross": "Encoder-decoder attention",
}


def _has_glyphs(font_path: str, text: str) -> bool:
    try:
        charmap = ft2font.FT2Font(font_path).get_charmap()
    except (OSError, RuntimeError):  # unreadable or unsupported font file
        return False
    return all(ord(character) in charmap for character in text)


@functools.cache
def find_hangul_font() -> str | None:
    """The family name of an installed font that has Hangul glyphs, or None.

    Looks at the fonts matplotlib knows (the preferred families first), then at every font file on the
    system, since matplotlib's font cache misses fonts installed after it was built; such a font is added
    to matplotlib's font manager before its name is returned. Placeholder fonts (Last Resort) are passed
    over: they have every code point, as a box.
    """
    preference = {name: rank for rank, name in enumerate(PREFERRED_HANGUL_FONTS)}
    known = sorted(
        font_manager.fontManager.ttflist, key=lambda entry: preference.get(entry.name, len(preference))
    )
    for entry in known:
        if not entry.name.startswith(_PLACEHOLDER_FONT_PREFIX) and _has_glyphs(entry.fname, _HANGUL_PROBE):
            return entry.name
    known_paths = {entry.fname for entry in known}
    for path in sorted(font_manager.findSystemFonts()):
        if path in known_paths or not _has_glyphs(path, _HANGUL_PROBE):
            continue
        name = font_manager.FontProperties(fname=path).get_name()
        if not name.startswith(_PLACEHOLDER_FONT_PREFIX):
            font_manager.fontManager.addfont(path)
            return name
    return None


def _is_hangul(character: str) -> bool:
    # Hangul syllables, Jamo and compatibility Jamo.
    return (
        "\uac00" <= character <= "\ud7a3"
        or "\u1100" <= character <= "\u11ff"
        or "\u3130" <= character <= "\u318f"
    )


def save_figure(figure: Figure, path: str | Path) -> Path:
    """Write `figure` as a PNG (creating the folder) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot_positional_encoding(
    num_positions: int = 50, dim: int = 128, path: str | Path | None = None
) -> tuple[Figure, np.ndarray]:
    """Section 3.5's encodings as the tutorial plots them: one row per position, one column per dimension,
    sin on even and cos on odd dimensions. Returns the figure and the (num_positions, dim) matrix drawn."""
    matrix = sinusoidal_position_encoding(num_positions, dim).numpy()
    figure = Figure(figsize=(8, 5))
    axes = figure.add_subplot()
    mesh = axes.pcolormesh(matrix, cmap="RdBu", vmin=-1, vmax=1)
    axes.set_xlabel("Depth (dimension)")
    axes.set_xlim(0, dim)
    axes.set_ylabel("Position")
    axes.set_title(
        f"Sinusoidal positional encoding, {num_positions} positions x {dim} dimensions (Section 3.5)"
    )
    figure.colorbar(mesh, ax=axes)
    if path is not None:
        save_figure(figure, path)
    return figure, matrix


def plot_learning_rate(
    d_model: int = 256, warmup_steps: int = 4000, total_steps: int = 200_000, path: str | Path | None = None
) -> tuple[Figure, np.ndarray]:
    """Eq. 3 (Section 5.3) for steps 1..total_steps, with the peak at step `warmup_steps` marked.
    Returns the figure and the rates drawn (`rates[k - 1]` is the rate of update k)."""
    steps = np.arange(1, total_steps + 1)
    rates = np.array([noam_lr(int(step), d_model, warmup_steps) for step in steps])
    peak = int(np.argmax(rates))
    figure = Figure(figsize=(8, 4.5))
    axes = figure.add_subplot()
    axes.plot(steps, rates)
    axes.plot(steps[peak], rates[peak], "o", color="tab:red")
    axes.annotate(
        f"peak at step {steps[peak]:,}: {rates[peak]:.2e}",
        (steps[peak], rates[peak]),
        xytext=(12, -4),
        textcoords="offset points",
    )
    axes.set_xlabel("Train step")
    axes.set_ylabel("Learning rate")
    axes.set_title(
        f"lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), d_model={d_model}, warmup={warmup_steps}"
    )
    if path is not None:
        save_figure(figure, path)
    return figure, rates


def _newest_log_history(run_dir: str | Path, made_by: str) -> list[dict]:
    """The Trainer's `log_history` from the newest checkpoint of `run_dir`, a run that `made_by` wrote."""
    checkpoints = last_checkpoints(run_dir, k=None) if Path(run_dir).is_dir() else []
    states = [state for c in checkpoints if (state := c / TRAINER_STATE_FILE).is_file()]
    if not states:
        raise FileNotFoundError(f"No checkpoint-*/trainer_state.json in {run_dir}: is it a {made_by} run?")
    return json.loads(states[-1].read_text())["log_history"]


def plot_training_curves(run_dir: str | Path, path: str | Path | None = None) -> tuple[Figure, dict]:
    """Training loss (every logging step) and dev loss (every evaluation) of a `vanilla-transformer train`
    run, read from its newest checkpoint's `trainer_state.json`; the averaged model's dev loss
    (`results.json` in `run_dir/model`, when the run finished) is marked. Returns the figure and the series
    drawn."""
    history = _newest_log_history(run_dir, "vanilla-transformer train")
    series = {
        "train": [(entry["step"], entry["loss"]) for entry in history if "loss" in entry],
        "dev": [(entry["step"], entry["eval_loss"]) for entry in history if "eval_loss" in entry],
    }
    figure = Figure(figsize=(8, 4.5))
    axes = figure.add_subplot()
    for name, points in series.items():
        if points:
            axes.plot(*zip(*points), marker="o" if name == "dev" else None, label=f"{name} loss")
    results_file = Path(run_dir) / "model" / RESULTS_FILE
    if results_file.is_file():
        results = json.loads(results_file.read_text())
        if "dev_loss" in results:
            series["averaged_dev"] = [(results["steps"], results["dev_loss"])]
            axes.plot(
                results["steps"], results["dev_loss"], "*", markersize=12, label="dev loss, averaged model"
            )
    axes.set_xlabel("Train step")
    axes.set_ylabel("Label-smoothed cross-entropy")
    axes.set_title(f"Training curves of {Path(run_dir).name}")
    axes.legend()
    if path is not None:
        save_figure(figure, path)
    return figure, series


def plot_training_losses_compared(
    run_dirs: Sequence[str | Path], path: str | Path | None = None
) -> tuple[Figure, dict[str, list[tuple[int, float]]]]:
    """The training losses of several `vanilla-transformer train` runs (each from its newest checkpoint's
    `trainer_state.json`), one line a run named by its folder, on one axes; below, each later run's loss
    minus the first run's at the steps both logged, where runs meant to train alike (eager and compiled,
    say) show how far apart they are. Returns the figure and each run's (step, loss) points."""
    names = [Path(run).name for run in run_dirs]
    if len(set(names)) < len(names):  # runs/a/model and runs/b/model: tell them apart by their whole paths
        names = [str(run) for run in run_dirs]
    series = {
        name: [
            (entry["step"], entry["loss"])
            for entry in _newest_log_history(run, "vanilla-transformer train")
            if "loss" in entry
        ]
        for name, run in zip(names, run_dirs)
    }
    figure = Figure(figsize=(8, 6))
    losses, differences = figure.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    for name, points in series.items():
        losses.plot(*zip(*points), label=name)
    first = dict(series[names[0]])
    for name in names[1:]:
        common = [(step, loss - first[step]) for step, loss in series[name] if step in first]
        differences.plot(*zip(*common), label=f"{name} - {names[0]}")
    differences.axhline(0.0, color="grey", linewidth=0.8)
    losses.set_ylabel("Label-smoothed cross-entropy")
    losses.set_title("Training loss of " + ", ".join(names))
    losses.legend()
    differences.set_xlabel("Train step")
    differences.set_ylabel("Difference")
    differences.legend()
    if path is not None:
        save_figure(figure, path)
    return figure, series


def plot_chatbot_curves(run_dir: str | Path, path: str | Path | None = None) -> tuple[Figure, dict]:
    """A `chatbot train` run by epoch, from its newest checkpoint's `trainer_state.json`: the training loss
    (every logging step), and the loss and token accuracy on the held-out pairs and on the sample of
    training pairs (every epoch's evaluation). Returns the figure and the series drawn."""
    history = _newest_log_history(run_dir, "chatbot train")
    series = {"train loss": [(entry["epoch"], entry["loss"]) for entry in history if "loss" in entry]}
    for split, name in (("held_out", "held-out"), ("train_sample", "training sample")):
        for metric in ("loss", "accuracy"):
            key = f"eval_{split}_{metric}"
            series[f"{name} {metric}"] = [(entry["epoch"], entry[key]) for entry in history if key in entry]
    figure = Figure(figsize=(11, 4.5))
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    # One colour per set of pairs, the same in both panels.
    colours = {"train": "C0", "held-out": "C1", "training": "C2"}
    for name, points in series.items():
        if points:
            axes = accuracy_axes if name.endswith("accuracy") else loss_axes
            marker = None if name == "train loss" else "."
            axes.plot(*zip(*points), marker=marker, color=colours[name.split()[0]], label=name)
    loss_axes.set_ylabel("Cross-entropy")
    accuracy_axes.set_ylabel("Token accuracy (teacher-forced)")
    for axes in (loss_axes, accuracy_axes):
        axes.set_xlabel("Epoch")
        axes.legend()
    figure.suptitle(f"Training curves of {Path(run_dir).name}")
    if path is not None:
        save_figure(figure, path)
    return figure, series


@dataclass
class AttentionMaps:
    """Attention weights for one input, each shaped (layers, heads, queries, keys).

    `target_ids` are the decoder's inputs: the start token and the model's own greedy output, so the maps
    show what the model looked at while it produced its answer.
    """

    source_ids: list[int]
    target_ids: list[int]
    source_tokens: list[str]
    target_tokens: list[str]
    encoder: np.ndarray
    decoder: np.ndarray
    cross: np.ndarray


@torch.no_grad()
def attention_maps(
    model: VanillaTransformerForConditionalGeneration, tokenizer: PreTrainedTokenizerBase, text: str
) -> AttentionMaps:
    """Encode `text`, decode it with the model's generation config, and return every attention weight of
    the forward pass over that output (teacher-forced on the model's own tokens).

    The model must use eager attention (`from_pretrained(..., attn_implementation="eager")`): SDPA and
    flash attention never materialise the weights.
    """
    if model.config._attn_implementation != "eager":
        raise ValueError(
            f"attention_maps needs attn_implementation='eager' (got {model.config._attn_implementation!r}): "
            "load the model with from_pretrained(path, attn_implementation='eager')."
        )
    model.eval()
    inputs = tokenizer(text, return_tensors="pt").to(model.device)
    generated = model.generate(**inputs)
    # generate's output starts with the decoder start token; a trailing </s> is an output, not an input.
    decoder_input_ids = generated[:, :-1] if generated[0, -1] == model.config.eos_token_id else generated
    outputs = model(**inputs, decoder_input_ids=decoder_input_ids, output_attentions=True)

    def stack(attentions: tuple[torch.Tensor, ...]) -> np.ndarray:
        return torch.stack([layer[0] for layer in attentions]).float().cpu().numpy()

    source_ids = inputs["input_ids"][0].tolist()
    target_ids = decoder_input_ids[0].tolist()
    return AttentionMaps(
        source_ids=source_ids,
        target_ids=target_ids,
        source_tokens=tokenizer.convert_ids_to_tokens(source_ids),
        target_tokens=tokenizer.convert_ids_to_tokens(target_ids),
        encoder=stack(outputs.encoder_attentions),
        decoder=stack(outputs.decoder_attentions),
        cross=stack(outputs.cross_attentions),
    )


def _tick_labels(tokens: list[str], ids: list[int], hangul_font: str | None) -> list[str]:
    if hangul_font is None and any(_is_hangul(character) for token in tokens for character in token):
        return [str(token_id) for token_id in ids]
    return tokens


def plot_attention(maps: AttentionMaps, kind: str, path: str | Path | None = None) -> Figure:
    """One heatmap per layer (rows) and head (columns) for `kind` "encoder", "decoder" or "cross";
    queries on the vertical axis, keys on the horizontal one, weights from 0 to 1."""
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"Unknown attention kind {kind!r}: choose one of {list(ATTENTION_KINDS)}.")
    weights = getattr(maps, kind)
    source = (maps.source_tokens, maps.source_ids)
    target = (maps.target_tokens, maps.target_ids)
    queries, keys = {"encoder": (source, source), "decoder": (target, target), "cross": (target, source)}[
        kind
    ]

    hangul_font = find_hangul_font()
    if hangul_font is None:
        warnings.warn(
            "No installed font has Hangul glyphs, so Korean tokens would be drawn as empty boxes; the "
            "attention axes show token ids instead. Install one (Debian/Ubuntu: apt-get install fonts-nanum) "
            "to see the tokens.",
            stacklevel=2,
        )
    # matplotlib falls back glyph by glyph along this list: Hangul from the first, "▁" from DejaVu Sans.
    families = [hangul_font, _FALLBACK_FAMILY] if hangul_font else [_FALLBACK_FAMILY]
    query_labels = _tick_labels(*queries, hangul_font)
    key_labels = _tick_labels(*keys, hangul_font)

    layers, heads = weights.shape[:2]
    cell = 0.32  # inches per token, so that labels stay readable for long inputs
    width = max(2.4, cell * len(key_labels) + 1.0)
    height = max(2.4, cell * len(query_labels) + 1.2)
    figure = Figure(figsize=(width * heads, height * layers), layout="constrained")
    panels = figure.subplots(layers, heads, squeeze=False)
    for layer in range(layers):
        for head in range(heads):
            axes = panels[layer, head]
            image = axes.imshow(weights[layer, head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            axes.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            axes.set_xticks(range(len(key_labels)), key_labels, rotation=90, fontsize=8, fontfamily=families)
            axes.set_yticks(range(len(query_labels)), query_labels, fontsize=8, fontfamily=families)
            if head:
                axes.tick_params(labelleft=False)
    figure.colorbar(image, ax=panels, shrink=0.6, label="attention weight")
    figure.suptitle(f"{ATTENTION_KINDS[kind]} (rows: queries, columns: keys)")
    if path is not None:
        save_figure(figure, path)
    return figure


def plot_alignment(maps: AttentionMaps, path: str | Path | None = None) -> tuple[Figure, np.ndarray]:
    """Encoder-decoder attention (Section 3.2.3) averaged over the heads of each layer: one panel per layer,
    the decoder's input tokens (the start token and the output so far) on the vertical axis, so that each
    row is the attention that produced the next output token, and source tokens on the horizontal one.
    Returns the figure and the averaged weights, shaped (layers, target tokens, source tokens)."""
    alignment = maps.cross.mean(axis=1)
    layers = alignment.shape[0]
    width = max(3.0, 0.36 * len(maps.source_tokens) + 1.4)
    height = max(3.0, 0.36 * len(maps.target_tokens) + 1.4)
    figure = Figure(figsize=(width * layers, height), layout="constrained")
    panels = figure.subplots(1, layers, squeeze=False)[0]
    for layer, axes in enumerate(panels):
        image = axes.imshow(alignment[layer], cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
        axes.set_title(f"layer {layer + 1}, mean of {maps.cross.shape[1]} heads", fontsize=9)
        axes.set_xticks(range(len(maps.source_tokens)), maps.source_tokens, rotation=90, fontsize=8)
        axes.set_yticks(range(len(maps.target_tokens)), maps.target_tokens, fontsize=8)
        if layer:
            axes.tick_params(labelleft=False)
    figure.colorbar(image, ax=panels, shrink=0.6, label="attention weight")
    figure.suptitle(
        "Encoder-decoder attention (rows: the decoder's input tokens, each row producing the next one; "
        "columns: source tokens)"
    )
    if path is not None:
        save_figure(figure, path)
    return figure, alignment


__all__ = [
    "ATTENTION_KINDS",
    "AttentionMaps",
    "attention_maps",
    "find_hangul_font",
    "plot_alignment",
    "plot_attention",
    "plot_chatbot_curves",
    "plot_learning_rate",
    "plot_positional_encoding",
    "plot_training_curves",
    "save_figure",
]
