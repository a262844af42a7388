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
- `README.md`, the model card, rendered by `model_card.render_model_card`;
- on request, `ctranslate2/`: the model exported for CTranslate2 by
  `ctranslate2_export.export_ctranslate2` (model, vocabularies, tokenizers and decoding settings), which
  `ctranslate2.Translator` loads once downloaded, and the card says how.
"""

import shutil
import tempfile
from pathlib import Path

from huggingface_hub import CommitInfo, HfApi, ModelCard
from huggingface_hub.utils import validate_repo_id
from transformers.utils import logging

from .. import VanillaTransformerForConditionalGeneration, translation_pipeline
from ..common.model_location import TARGET_TOKENIZER_DIR, check_holds_tokenizer
from ..common.model_weights import load_pretrained
from ..common.tokenization import load_tokenizer
from ..conversion import FAIRSEQ_BPE_FILES
from ..inference.engines.ctranslate2_export import export_ctranslate2
from ..inference.engines.export_common import ExportSource
from ..translation_pipeline import find_target_tokenizer
from ..vanilla_transformer.generation_vanilla_transformer import paper_generation_config
from .model_card import (
    CARD_TEMPLATE,
    CTRANSLATE2_DIR,
    CardFacts,
    read_card_template,
    read_run_records,
    render_model_card,
)

logger = logging.get_logger(__name__)

CARD_FILE = "README.md"
# The Hub takes files up to 50 GB but advises smaller ones, which download in parallel and resume better.
DEFAULT_MAX_SHARD_SIZE = "5GB"
# Weight files of an earlier push that this one does not overwrite must go: a stale `model.safetensors`
# next to a new sharded index would be loaded instead of the new shards, and vice versa.
STALE_WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json")
# An earlier push's CTranslate2 export that this push does not replace goes too: it holds the earlier
# weights.
STALE_PATTERNS = (*STALE_WEIGHT_PATTERNS, f"{CTRANSLATE2_DIR}/*")


def _check_model_dir(model_dir: Path) -> None:
    if not model_dir.is_dir():
        raise FileNotFoundError(f"Model directory {str(model_dir)!r} does not exist.")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"{str(model_dir)!r} holds no config.json: pass the folder written by model.save_pretrained "
            "(for a training run, its final model folder)."
        )
    check_holds_tokenizer(model_dir)


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
    model = load_pretrained(VanillaTransformerForConditionalGeneration, model_dir)

    # A generation config derived from the model config holds no decoding choices: use the paper's.
    if model.generation_config._from_model_config:
        model.generation_config = paper_generation_config(model.config)
    # Rendered before any file is written or exported: a template the user must fix stops the push at once.
    facts = CardFacts(
        repo_id,
        model.config,
        model.generation_config,
        model.num_parameters(),
        read_run_records(model_dir),
        ctranslate2=(ctranslate2_quantization or "float32") if with_ctranslate2 else None,
    )
    card = render_model_card(template, facts, template_name=str(template_path))
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
    "DEFAULT_MAX_SHARD_SIZE",
    "push_model",
    "stage_repo",
]
