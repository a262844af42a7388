"""The model card of a published model: its figures, its Hub metadata, and its Jinja template rendered.

The card is the package's Jinja template `model_cards/template.md` (or the caller's), rendered with
`render_model_card` into a `huggingface_hub.ModelCard`: its metadata a `ModelCardData` whose `model-index`
holds the measured test BLEU with its sacreBLEU signature (the Hub shows it as an evaluation result), and
its body the variables of `card_values`.

Model card figures are never typed by hand: architecture and decoding figures come from the model's config
and generation config, measured ones from the run's own records in the model folder (see `RunRecords`).
A figure the records lack is shown as "not measured". A template that cannot be read or rendered is refused
in one line that names its file (`CardTemplateError`).
"""

import dataclasses
import importlib.metadata
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.utils import HFValidationError, validate_repo_id
from packaging.requirements import Requirement
from transformers import GenerationConfig

from ..common.cli import first_line
from ..common.model_location import RESULTS_FILE, TRAINER_STATE_FILE, read_json_object
from ..common.text_lines import read_lines
from ..training.legacy import legacy_label_smoothing
from ..vanilla_transformer.configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig

CARD_TEMPLATE = Path(__file__).resolve().parent / "model_cards" / "template.md"
NOT_MEASURED = "not measured"
# The Hub repo folder of a model's CTranslate2 export, which the card points its users to.
CTRANSLATE2_DIR = "ctranslate2"
# The file name Jinja gives the frames of a template compiled from a string, in a traceback.
JINJA_TEMPLATE_FRAME = "<template>"
# Model card metadata that holds for every model this package publishes; the rest comes from the run.
CARD_METADATA = {
    "license": "apache-2.0",
    "library_name": "transformers",
    "pipeline_tag": "translation",
    "tags": ["translation", "seq2seq", "transformer", "attention-is-all-you-need", "vanilla-transformer"],
    "metrics": ["sacrebleu"],
}


@dataclass(frozen=True)
class RunRecords:
    """Measured figures of the training run, read by `read_run_records` from the model folder.

    `results.json` (written by `hf_vanilla_transformer.training.run_training`) supplies every field under
    the same key: `bleu`, `bleu_signature` and `test_set` (test BLEU with its sacreBLEU signature),
    `dev_bleu`, `dev_loss`, `steps`, `train_pairs`, `train_seconds`, `target_tokens_per_second`,
    `averaged_checkpoints` (names of the averaged checkpoints; empty: no averaging), `dataset`, `src_lang`,
    `tgt_lang`, `label_smoothing` (the eps_ls it trained with), and `dev_bleu_by_length_penalty` (the dev
    BLEU of each alpha tried, where the run chose its length penalty on the dev set). Other keys are
    ignored.

    `trainer_state.json` (written by the Trainer) fills in what `results.json` lacks: `global_step` for
    `steps`, and the last evaluation's `eval_loss` and `eval_bleu` in `log_history` for `dev_loss` and
    `dev_bleu`. None means the figure was not recorded.
    """

    bleu: float | None = None
    bleu_signature: str | None = None
    test_set: str | None = None
    dev_bleu: float | None = None
    dev_loss: float | None = None
    steps: int | None = None
    train_pairs: int | None = None
    train_seconds: float | None = None
    target_tokens_per_second: float | None = None
    averaged_checkpoints: tuple[str, ...] | None = None
    dataset: str | None = None
    src_lang: str | None = None
    tgt_lang: str | None = None
    dev_bleu_by_length_penalty: dict[str, float] | None = None
    label_smoothing: float | None = None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    return read_json_object(path, "write it again, or delete it to publish without it")


def read_run_records(model_dir: str | Path) -> RunRecords:
    """The run's figures from `results.json` and `trainer_state.json` in `model_dir` (both optional)."""
    model_dir = Path(model_dir)
    results = _read_json(model_dir / RESULTS_FILE)
    state = _read_json(model_dir / TRAINER_STATE_FILE)
    evaluations = [entry for entry in state.get("log_history", []) if "eval_loss" in entry]
    last_evaluation = evaluations[-1] if evaluations else {}
    fallbacks = {
        "steps": state.get("global_step"),
        "dev_loss": last_evaluation.get("eval_loss"),
        "dev_bleu": last_evaluation.get("eval_bleu"),
    }
    values = {
        field.name: results.get(field.name, fallbacks.get(field.name))
        for field in dataclasses.fields(RunRecords)
    }
    if values["averaged_checkpoints"] is not None:
        values["averaged_checkpoints"] = tuple(values["averaged_checkpoints"])
    return RunRecords(**values)


def _is_hub_dataset_id(name: str) -> bool:
    # Run records may name local data ("data/multi30k/train", a file prefix) instead of a Hub dataset; only
    # the latter belongs in the card's metadata, which the Hub turns into dataset links.
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    path = Path(name)
    return not (path.exists() or (path.parent != Path(".") and path.parent.is_dir()))


def _figure(value: Any, template: str = "{}") -> str:
    return NOT_MEASURED if value is None else template.format(value)


def _max_output_length(generation_config: GenerationConfig) -> str:
    """The paper's bound (input length + 50, Section 6.1) where the model keeps one, else transformers'
    fixed `max_length` (a converted Marian model's, say)."""
    offset = getattr(generation_config, "max_length_offset", None)
    if offset is not None:
        return f"the input length + {offset} tokens"
    return f"{generation_config.max_length} tokens"


def transformers_requirement() -> str:
    """The transformers versions this package is tested with (its installed metadata), which the repo's
    copied code needs too: e.g. `transformers>=5.24,<5.25`; plain `transformers` when the package runs
    from a source tree without being installed."""
    try:
        requirements = importlib.metadata.requires("hf-vanilla-transformer") or []
    except importlib.metadata.PackageNotFoundError:
        requirements = []
    for line in requirements:
        requirement = Requirement(line)
        if requirement.name == "transformers":
            return f"transformers{','.join(sorted(map(str, requirement.specifier), reverse=True))}"
    return "transformers"


def _positions_text(config: VanillaTransformerConfig) -> str:
    if config.position_embedding_type == "learned":
        return "learned positional embeddings (Table 3, row E)"
    return "sinusoidal positional encodings (Section 3.5)"


def _vocabulary_text(config: VanillaTransformerConfig) -> tuple[str, str]:
    """The sentence on the model's vocabularies (Section 3.4) and the table cell with their sizes."""
    if config.share_encoder_decoder_embeddings:
        return (
            "one shared source/target vocabulary whose embedding matrix is also the pre-softmax projection "
            "(Sections 3.4 and 5.1)",
            f"{config.vocab_size:,}, shared",
        )
    projection = (
        "the target embedding matrix is also the pre-softmax projection"
        if config.tie_word_embeddings
        else "the pre-softmax projection has weights of its own"
    )
    return (
        f"separate source and target vocabularies, where {projection}",
        f"{config.vocab_size:,} source / {config.decoder_vocab_size:,} target",
    )


@dataclass
class CardFacts:
    """What a model card tells of a model: its repo, config, decoding settings, size, the records of the run
    that trained it, and `ctranslate2`, the weight type of the repo's CTranslate2 export ("float32", "int8",
    ...; None when the repo has none)."""

    repo_id: str
    config: VanillaTransformerConfig
    generation_config: GenerationConfig
    num_parameters: int
    records: RunRecords
    ctranslate2: str | None = None


def card_values(facts: CardFacts) -> dict[str, str]:
    """The value of each variable a model card template may use (`{{ name }}`), as text.

    `paper_model` is the paper's model size the card compares with: "big" for models of its width, "base"
    otherwise. `ctranslate2` is empty when the repo has no CTranslate2 export (`{% if ctranslate2 %}` in a
    template).
    """
    repo_id, config, generation_config = facts.repo_id, facts.config, facts.generation_config
    num_parameters, records, ctranslate2 = facts.num_parameters, facts.records, facts.ctranslate2
    averaged = records.averaged_checkpoints
    if averaged is None:
        averaging = NOT_MEASURED
    elif averaged:
        averaging = f"the last {len(averaged)} checkpoints ({', '.join(averaged)})"
    else:
        averaging = "none (the last checkpoint)"
    vocabulary_text, vocabulary_sizes = _vocabulary_text(config)
    train_hours = None if records.train_seconds is None else records.train_seconds / 3600
    length_penalty_choice = ""
    if records.dev_bleu_by_length_penalty:
        alphas, scores = zip(*records.dev_bleu_by_length_penalty.items())
        length_penalty_choice = (
            f" α was chosen on the validation set, whose BLEU at α = {' / '.join(alphas)} was "
            f"{' / '.join(f'{score:.2f}' for score in scores)}; the validation BLEU above is the chosen α's."
        )
    return {
        "repo_id": repo_id,
        "paper_model": "big" if config.hidden_size >= PRESETS["big"]["hidden_size"] else "base",
        "parameters": f"{num_parameters:,}",
        "d_model": str(config.d_model),
        "layers": f"{config.encoder_layers} / {config.decoder_layers}",
        "heads": f"{config.encoder_attention_heads} / {config.decoder_attention_heads}",
        "head_dims": "{} / {}".format(*config.encoder_head_dims),
        "d_ff": f"{config.encoder_ffn_dim} / {config.decoder_ffn_dim}",
        "dropout": str(config.dropout),
        "label_smoothing": _figure(
            records.label_smoothing if records.label_smoothing is not None else legacy_label_smoothing(config)
        ),
        "vocab_size": str(config.vocab_size),
        "vocabulary_sizes": vocabulary_sizes,
        "vocabulary_text": vocabulary_text,
        "positions_text": _positions_text(config),
        "position_embedding_type": config.position_embedding_type,
        "num_beams": str(generation_config.num_beams),
        "length_penalty": str(generation_config.length_penalty),
        "length_penalty_type": str(getattr(generation_config, "length_penalty_type", None) or "transformers"),
        "max_output_length": _max_output_length(generation_config),
        "length_penalty_choice": length_penalty_choice,
        "src_lang": _figure(records.src_lang),
        "tgt_lang": _figure(records.tgt_lang),
        "dataset": _figure(records.dataset),
        "train_pairs": _figure(records.train_pairs, "{:,}"),
        "steps": _figure(records.steps, "{:,}"),
        "train_hours": _figure(train_hours, "{:.1f} h"),
        "tokens_per_second": _figure(records.target_tokens_per_second, "{:,.0f}"),
        "averaging": averaging,
        "bleu": _figure(records.bleu, "{:.2f}"),
        "bleu_signature": _figure(records.bleu_signature, "`{}`"),
        "test_set": _figure(records.test_set),
        "dev_bleu": _figure(records.dev_bleu, "{:.2f}"),
        "dev_loss": _figure(records.dev_loss, "{:.4f}"),
        "ctranslate2": ctranslate2 or "",
        "ctranslate2_dir": CTRANSLATE2_DIR,
        "transformers_requirement": transformers_requirement(),
    }


def card_data(repo_id: str, records: RunRecords) -> ModelCardData:
    """The card's metadata: `CARD_METADATA`, `language` from the run's language pair, `datasets` from a Hub
    dataset name (local data paths are left out), and a measured test BLEU as the `model-index` entry
    (metric `sacrebleu`, the score's sacreBLEU signature as its config) that the Hub shows as an evaluation
    result."""
    data = ModelCardData(**CARD_METADATA)
    if records.src_lang and records.tgt_lang:
        data.language = [records.src_lang, records.tgt_lang]
    if records.dataset is not None and _is_hub_dataset_id(records.dataset):
        data.datasets = [records.dataset]
    if records.bleu is not None:
        test_set = records.test_set or NOT_MEASURED
        data.model_name = repo_id.split("/")[-1]
        data.eval_results = [
            EvalResult(
                task_type="translation",
                task_name="Translation",
                dataset_type=test_set if _is_hub_dataset_id(test_set) else Path(test_set).name,
                dataset_name=test_set,
                metric_type="sacrebleu",
                metric_name="BLEU",
                metric_value=round(records.bleu, 2),
                metric_config=records.bleu_signature,
            )
        ]
    return data


class CardTemplateError(ValueError):
    """A model card template that cannot be read or rendered; the message starts with the template's name
    (its path, for a file) and says what to change."""


def _compile_card_template(template: str, template_name: str) -> tuple[jinja2.Template, set[str]]:
    """The compiled Jinja `template` and the variables it reads; CardTemplateError if it is not Jinja."""
    # StrictUndefined: `{{ bleu.value }}` fails instead of rendering as nothing.
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined)
    try:
        syntax_tree = environment.parse(template)
        # Compiling finds what parsing does not, such as a filter Jinja does not have.
        compiled = environment.from_string(syntax_tree)
    except jinja2.TemplateSyntaxError as error:
        reason = first_line(error.message or type(error).__name__)
        raise CardTemplateError(
            f"{template_name} line {error.lineno}: template syntax error ({reason}); fix the template."
        ) from None
    return compiled, jinja2.meta.find_undeclared_variables(syntax_tree)


def read_card_template(path: str | Path) -> str:
    """The text of the model card template file at `path`, less its final newline (Jinja drops it too).

    Raises:
        FileNotFoundError: there is no file at `path`.
        CardTemplateError (a ValueError): the file is not UTF-8 text, or not valid Jinja.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Model card template {str(path)!r} does not exist.")
    try:
        template = "\n".join(read_lines(path))
    except ValueError as error:
        raise CardTemplateError(str(error)) from None
    _compile_card_template(template, str(path))
    return template


def _template_line(error: BaseException) -> int | None:
    """The template line whose code raised `error`: Jinja lists the template's own lines in the traceback."""
    frames = traceback.extract_tb(error.__traceback__)
    lines = [frame.lineno for frame in frames if frame.filename == JINJA_TEMPLATE_FRAME]
    return lines[-1] if lines else None


def render_model_card(
    template: str, facts: CardFacts, template_name: str = "The model card template"
) -> ModelCard:
    """The model card of the model `facts` describe: the Jinja `template` rendered with `card_data(...)` as
    `{{ card_data }}` (the YAML block) and `card_values(facts)` for its other variables. `template_name` (the
    file's path) starts every refusal.

    Raises:
        CardTemplateError (a ValueError): the template is not valid Jinja (a syntax error, an unknown
            filter), uses a variable `card_values` does not provide or an attribute a value lacks (a typo
            must not publish a blank), lacks `{{ card_data }}` (the card would carry no metadata), or its
            code fails while rendering (`{{ 1 / 0 }}`).
    """
    values = card_values(facts)
    compiled, used = _compile_card_template(template, template_name)
    unknown = sorted(used - values.keys() - {"card_data"})
    if unknown:
        raise CardTemplateError(
            f"{template_name}: unknown model card variables {unknown}; known: {sorted(values)}."
        )
    if "card_data" not in used:
        raise CardTemplateError(
            f"{template_name} must start with its metadata: ---, {{{{ card_data }}}}, ---."
        )
    metadata = card_data(facts.repo_id, facts.records).to_yaml()
    try:
        text = compiled.render(card_data=metadata, **values)
    # Only the template's own code runs here, so whatever it raises is the template's to fix.
    except Exception as error:
        line = _template_line(error)
        where = f" line {line}" if line is not None else ""
        reason = f"{type(error).__name__}: {first_line(str(error))}"
        raise CardTemplateError(
            f"{template_name}{where}: rendering the template failed ({reason}); fix the template."
        ) from None
    return ModelCard(text)


__all__ = [
    "CARD_TEMPLATE",
    "CTRANSLATE2_DIR",
    "NOT_MEASURED",
    "CardFacts",
    "CardTemplateError",
    "RunRecords",
    "card_data",
    "card_values",
    "read_card_template",
    "read_run_records",
    "render_model_card",
    "transformers_requirement",
]
