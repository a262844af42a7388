"""Publish a trained model on the Hugging Face Hub: weights, config, tokenizer, code and model card.

`push_model` stages everything a repo needs in a temporary folder and uploads it with
`HfApi.upload_folder` (one commit for a folder of this size):

- the weights as safetensors (sharded above `max_shard_size`), `config.json` and the modeling code, so that
  `AutoModelForSeq2SeqLM.from_pretrained(repo)` works with the package installed, and with
  `trust_remote_code=True` without it (`auto_map` names `AutoConfig`, `AutoModel` and
  `AutoModelForSeq2SeqLM`); weight files of an earlier push that this one does not overwrite are deleted;
- `generation_config.json`: the model folder's own decoding settings, or the paper's (beam 4, GNMT length
  penalty 0.6, outputs up to input length + 50) when it saved none;
- the tokenizer;
- `translation_pipeline.py` and a `custom_pipelines` entry for the task "translation" in `config.json`, so
  that `pipeline("translation", model=repo, trust_remote_code=True)` works without the package (transformers
  5 has no translation task of its own); package users call `pipeline("seq2seq-translation", model=repo)`;
- `README.md`, the model card: the package's Jinja template `model_cards/template.md` (or the caller's)
  rendered into a `huggingface_hub.ModelCard`, its metadata a `ModelCardData` whose `model-index` holds the
  measured test BLEU with its sacreBLEU signature (the Hub shows it as an evaluation result);
- on request, `ctranslate2/`: the model exported for CTranslate2 by `export.export_ctranslate2` (model,
  vocabularies, tokenizers and decoding settings), which `ctranslate2.Translator` loads once downloaded, and
  the card says how.

Model card figures are never typed by hand: architecture and decoding figures come from the model's config
and generation config, measured ones from the run's own records in the model folder (see `RunRecords`).
A figure the records lack is shown as "not measured".
"""

import dataclasses
import importlib.metadata
import shutil
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
from huggingface_hub import CommitInfo, EvalResult, HfApi, ModelCard, ModelCardData
from huggingface_hub.utils import HFValidationError, validate_repo_id
from packaging.requirements import Requirement
from transformers import GenerationConfig
from transformers.utils import logging

from . import translation_pipeline
from .cli import read_lines
from .configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from .conversion import FAIRSEQ_BPE_FILES
from .export import ExportSource, export_ctranslate2
from .generation_vanilla_transformer import paper_generation_config
from .model_location import RESULTS_FILE, TRAINER_STATE_FILE, loading, read_json_object
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .tokenization import TOKENIZER_FILES, load_tokenizer
from .translation_pipeline import TARGET_TOKENIZER_DIR, find_target_tokenizer

logger = logging.get_logger(__name__)

CARD_FILE = "README.md"
CARD_TEMPLATE = Path(__file__).resolve().parent / "model_cards" / "template.md"
# The Hub takes files up to 50 GB but advises smaller ones, which download in parallel and resume better.
DEFAULT_MAX_SHARD_SIZE = "5GB"
NOT_MEASURED = "not measured"
# Weight files of an earlier push that this one does not overwrite must go: a stale `model.safetensors`
# next to a new sharded index would be loaded instead of the new shards, and vice versa.
STALE_WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json")
# The repo folder of the CTranslate2 export. An earlier push's export that this push does not replace goes
# too: it holds the earlier weights.
CTRANSLATE2_DIR = "ctranslate2"
STALE_PATTERNS = (*STALE_WEIGHT_PATTERNS, f"{CTRANSLATE2_DIR}/*")
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
    `tgt_lang`, and `dev_bleu_by_length_penalty` (the dev BLEU of each alpha tried, where the run chose its
    length penalty on the dev set). Other keys are ignored.

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


def card_values(
    repo_id: str,
    config: VanillaTransformerConfig,
    generation_config: GenerationConfig,
    num_parameters: int,
    records: RunRecords,
    ctranslate2: str | None = None,
) -> dict[str, str]:
    """The value of each variable a model card template may use (`{{ name }}`), as text.

    `paper_model` is the paper's model size the card compares with: "big" for models of its width, "base"
    otherwise. `ctranslate2` is the weight type of the repo's CTranslate2 export ("float32", "int8", ...),
    empty when the repo has none (`{% if ctranslate2 %}` in a template).
    """
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
        "paper_model": "big" if config.d_model >= PRESETS["big"]["d_model"] else "base",
        "parameters": f"{num_parameters:,}",
        "d_model": str(config.d_model),
        "layers": f"{config.encoder_layers} / {config.decoder_layers}",
        "heads": f"{config.encoder_attention_heads} / {config.decoder_attention_heads}",
        "head_dims": "{} / {}".format(*config.encoder_head_dims),
        "d_ff": f"{config.encoder_ffn_dim} / {config.decoder_ffn_dim}",
        "dropout": str(config.dropout),
        "label_smoothing": str(config.label_smoothing),
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


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


def _compile_card_template(template: str, template_name: str) -> tuple[jinja2.Template, set[str]]:
    """The compiled Jinja `template` and the variables it reads; CardTemplateError if it is not Jinja."""
    # StrictUndefined: `{{ bleu.value }}` fails instead of rendering as nothing.
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined)
    try:
        syntax_tree = environment.parse(template)
        # Compiling finds what parsing does not, such as a filter Jinja does not have.
        compiled = environment.from_string(syntax_tree)
    except jinja2.TemplateSyntaxError as error:
        reason = _first_line(error.message or type(error).__name__)
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
        # read_lines refuses text that is not UTF-8 in the words every command uses for its input files.
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
    template: str,
    repo_id: str,
    config: VanillaTransformerConfig,
    generation_config: GenerationConfig,
    num_parameters: int,
    records: RunRecords,
    ctranslate2: str | None = None,
    template_name: str = "The model card template",
) -> ModelCard:
    """The model card: the Jinja `template` rendered with `card_data(...)` as `{{ card_data }}` (the YAML
    block) and `card_values(...)` for its other variables; `ctranslate2` is the weight type of the repo's
    CTranslate2 export, None when it has none. `template_name` (the file's path) starts every refusal.

    Raises:
        CardTemplateError (a ValueError): the template is not valid Jinja (a syntax error, an unknown
            filter), uses a variable `card_values` does not provide or an attribute a value lacks (a typo
            must not publish a blank), lacks `{{ card_data }}` (the card would carry no metadata), or its
            code fails while rendering (`{{ 1 / 0 }}`).
    """
    values = card_values(repo_id, config, generation_config, num_parameters, records, ctranslate2)
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
    metadata = card_data(repo_id, records).to_yaml()
    try:
        text = compiled.render(card_data=metadata, **values)
    # Only the template's own code runs here, so whatever it raises is the template's to fix.
    except Exception as error:
        line = _template_line(error)
        where = f" line {line}" if line is not None else ""
        reason = f"{type(error).__name__}: {_first_line(str(error))}"
        raise CardTemplateError(
            f"{template_name}{where}: rendering the template failed ({reason}); fix the template."
        ) from None
    return ModelCard(text)


def _check_model_dir(model_dir: Path) -> None:
    if not model_dir.is_dir():
        raise FileNotFoundError(f"Model directory {str(model_dir)!r} does not exist.")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"{str(model_dir)!r} holds no config.json: pass the folder written by model.save_pretrained "
            "(for a training run, its final model folder)."
        )
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"{str(model_dir)!r} holds no tokenizer ({' or '.join(TOKENIZER_FILES)}): save it next to the "
            "weights with tokenizer.save_pretrained(model_dir)."
        )


def stage_repo(
    model_dir: str | Path,
    folder: str | Path,
    repo_id: str,
    card_template: str | Path | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    with_ctranslate2: bool = False,
    ctranslate2_quantization: str | None = None,
) -> ModelCard:
    """Write into `folder` every file the Hub repo gets (see the module docstring); returns the card.

    With `with_ctranslate2`, `CTRANSLATE2_DIR` holds the model exported for CTranslate2 with weights of type
    `ctranslate2_quantization` (one of `export.CTRANSLATE2_QUANTIZATIONS`; None: float32).

    Raises:
        FileNotFoundError: `model_dir` is missing or lacks config.json or the tokenizer, or the card
            template does not exist.
        ValueError: the tokenizer lacks a special token, a record file is not a JSON object, or
            `ctranslate2_quantization` comes without `with_ctranslate2`.
        CardTemplateError (a ValueError): the card template is not UTF-8 text or cannot be rendered (see
            `render_model_card`); checked before any file is written, its text and syntax before the model
            loads.
        ExportError (a ValueError): ctranslate2 is not installed, or the model is one CTranslate2 cannot hold.
    """
    if ctranslate2_quantization is not None and not with_ctranslate2:
        raise ValueError("A CTranslate2 quantization applies to the CTranslate2 export: ask for it too.")
    model_dir, folder = Path(model_dir), Path(folder)
    _check_model_dir(model_dir)
    template_path = Path(card_template) if card_template is not None else CARD_TEMPLATE
    # Read and compiled before the model loads: an unreadable template or a syntax error shows at once.
    template = read_card_template(template_path)
    tokenizer = load_tokenizer(model_dir)
    with loading(model_dir):
        model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir)

    # A generation config derived from the model config holds no decoding choices: use the paper's.
    if model.generation_config._from_model_config:
        model.generation_config = paper_generation_config(model.config)
    # Rendered before any file is written or exported: a template the user must fix stops the push at once.
    card = render_model_card(
        template,
        repo_id,
        model.config,
        model.generation_config,
        model.num_parameters(),
        read_run_records(model_dir),
        ctranslate2=(ctranslate2_quantization or "float32") if with_ctranslate2 else None,
        template_name=str(template_path),
    )
    pipeline_module = Path(translation_pipeline.__file__)
    # The format transformers' own Pipeline.save_pretrained writes for a custom pipeline.
    model.config.custom_pipelines = {
        translation_pipeline.HUB_TASK: {
            "impl": f"{pipeline_module.stem}.{translation_pipeline.TranslationPipeline.__name__}",
            "pt": ["AutoModelForSeq2SeqLM"],
            "type": "text",
        }
    }
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(folder)
    shutil.copyfile(pipeline_module, folder / pipeline_module.name)
    # What a converted fairseq checkpoint needs besides the model: its BPE codes, and the target-side
    # vocabulary of separate-vocabulary models (see conversion/fairseq.py).
    for extra in (*FAIRSEQ_BPE_FILES, TARGET_TOKENIZER_DIR):
        source = model_dir / extra
        if source.is_dir():
            shutil.copytree(source, folder / extra, dirs_exist_ok=True)
        elif source.is_file():
            shutil.copyfile(source, folder / extra)
    if with_ctranslate2:
        # The export converts float32 weights; the model folder may hold others.
        exported = ExportSource(model.float(), tokenizer, find_target_tokenizer(model_dir), name=repo_id)
        logger.info(f"Exporting {model_dir} for CTranslate2 into {CTRANSLATE2_DIR}/ of {repo_id}")
        export_ctranslate2(exported, folder / CTRANSLATE2_DIR, ctranslate2_quantization)
    card.save(folder / CARD_FILE)
    return card


def push_model(
    model_dir: str | Path,
    repo_id: str,
    revision: str | None = None,
    private: bool | None = None,
    card_template: str | Path | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    commit_message: str | None = None,
    token: str | None = None,
    with_ctranslate2: bool = False,
    ctranslate2_quantization: str | None = None,
) -> CommitInfo:
    """Publish the model saved in `model_dir` as Hub repo `repo_id` with `HfApi.upload_folder`.

    Weight files (`STALE_WEIGHT_PATTERNS`) and CTranslate2 export files already in the repo that this push
    does not overwrite are deleted in the same commit.

    Args:
        model_dir: a folder written by `save_pretrained` with the tokenizer saved next to the weights, and
            optionally the run's `results.json` / `trainer_state.json` for the card's figures.
        repo_id: "org/name" (or "name" in the user's namespace); created if missing.
        revision: branch to commit to, created from `main` if missing; None commits to `main`.
        private: create the repo private (True) or public (False); None follows the Hub's default (public
            unless the organization's default is private). An existing repo keeps its visibility.
        card_template: Jinja model card template (see `render_model_card`); defaults to `CARD_TEMPLATE`.
        max_shard_size: largest safetensors file; bigger models are split into shards.
        commit_message: defaults to "Upload <model_dir name> with hf-vanilla-transformer".
        token: Hub token; defaults to the logged-in one (HF_TOKEN or `hf auth login`).
        with_ctranslate2: also upload the model exported for CTranslate2, in the repo's `CTRANSLATE2_DIR`.
        ctranslate2_quantization: the export's weight type (see `stage_repo`); None: float32.

    Returns:
        The commit's `CommitInfo` (`.oid`, `.commit_url`).

    Raises:
        HFValidationError: `repo_id` is malformed (checked before anything is loaded or sent).
        FileNotFoundError, ValueError: see `stage_repo`; ValueError also when the Hub rejects the card.
        HfHubHTTPError: the Hub refused a request, e.g. 401 (no valid token) or 403 (the token may not
            write to `repo_id`).
    """
    validate_repo_id(repo_id)
    model_dir = Path(model_dir)
    with tempfile.TemporaryDirectory() as folder:
        card = stage_repo(
            model_dir,
            folder,
            repo_id,
            card_template,
            max_shard_size,
            with_ctranslate2=with_ctranslate2,
            ctranslate2_quantization=ctranslate2_quantization,
        )
        card.validate()
        api = HfApi(token=token)
        logger.info(f"Uploading {model_dir} to {repo_id}@{revision or 'main'}")
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            revision=revision,
            commit_message=commit_message or f"Upload {model_dir.resolve().name} with hf-vanilla-transformer",
            delete_patterns=list(STALE_PATTERNS),
        )


__all__ = [
    "CARD_TEMPLATE",
    "CTRANSLATE2_DIR",
    "CardTemplateError",
    "RunRecords",
    "card_data",
    "card_values",
    "push_model",
    "read_card_template",
    "read_run_records",
    "render_model_card",
    "stage_repo",
]
