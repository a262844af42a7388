"""Translation with sequence-to-sequence models as a transformers pipeline.

transformers 5 removed its "translation" task: `pipeline("translation", ...)` raises for it unless the model's
config names its own code for that task. This module provides the pipeline both ways:

- With the package imported, `TranslationPipeline` is registered with transformers' public pipeline registry
  under the task `TASK` ("seq2seq-translation"), so `pipeline("seq2seq-translation", model=...)` translates
  with any encoder-decoder model, with no remote code. transformers' own tables are left as they are.
- Hub repos published by `vanilla-transformer push` carry a copy of this file and a `custom_pipelines` entry
  for `HUB_TASK` ("translation") in config.json, so that users without the package call
  `pipeline("translation", model=repo, trust_remote_code=True)`.

It imports only transformers, so that its copy in a Hub repo runs without the package.
"""

from pathlib import Path
from typing import Any

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, Pipeline, PreTrainedTokenizerBase
from transformers.pipelines import PIPELINE_REGISTRY
from transformers.utils import cached_file

# The task this package registers: a name transformers does not block (its "translation" and
# "translation_xx_to_yy" tasks raise), saying which models it serves.
TASK = "seq2seq-translation"
# The task under which Hub repos name their copy of this pipeline in config.json's `custom_pipelines`: a task
# found there is served by the repo's code (with trust_remote_code=True) before transformers' list is checked.
HUB_TASK = "translation"
# Where a model with separate source and target vocabularies (a converted fairseq model) keeps the
# tokenizer that decodes its outputs.
TARGET_TOKENIZER_DIR = "target_tokenizer"


def find_target_tokenizer(
    name_or_path: str | Path, revision: str | None = None
) -> PreTrainedTokenizerBase | None:
    """The `target_tokenizer/` of a model folder or Hub repo, or None when it has one vocabulary."""
    if not str(name_or_path):  # a model built in memory: no folder to look in (not the working directory)
        return None
    if Path(name_or_path).is_dir():
        folder = Path(name_or_path) / TARGET_TOKENIZER_DIR
        return AutoTokenizer.from_pretrained(folder) if folder.is_dir() else None
    found = cached_file(
        str(name_or_path),
        "tokenizer_config.json",
        subfolder=TARGET_TOKENIZER_DIR,
        revision=revision,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )
    if found is None:
        return None
    return AutoTokenizer.from_pretrained(name_or_path, subfolder=TARGET_TOKENIZER_DIR, revision=revision)


class TranslationPipeline(Pipeline):
    """Translate text: tokenize, `model.generate()` (with the model's own generation config, e.g. the
    paper's beam search), decode. Returns `[{"translation_text": ...}]` per input, like transformers 4.

    Build it with `pipeline("seq2seq-translation", model=...)` (the package registers that task), or
    directly: `TranslationPipeline(model=model, tokenizer=tokenizer)`.

    Outputs are decoded with `target_tokenizer=` when given, else with the model's `target_tokenizer/`
    when it has one (separate vocabularies), else with the tokenizer.
    """

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True
    _pipeline_calls_generate = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "target_tokenizer" not in self._postprocess_params:
            self._postprocess_params["target_tokenizer"] = find_target_tokenizer(
                self.model.name_or_path, revision=getattr(self.model.config, "_commit_hash", None)
            )

    def _sanitize_parameters(
        self,
        truncation: bool | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        target_tokenizer: PreTrainedTokenizerBase | None = None,
        **generate_kwargs,
    ) -> tuple[dict, dict, dict]:
        preprocess = {} if truncation is None else {"truncation": truncation}
        postprocess = {}
        if clean_up_tokenization_spaces is not None:
            postprocess["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        if target_tokenizer is not None:
            postprocess["target_tokenizer"] = target_tokenizer
        return preprocess, generate_kwargs, postprocess

    def __call__(
        self, inputs: str | list[str], **kwargs: Any
    ) -> list[dict[str, str]] | list[list[dict[str, str]]]:
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, str):
            return result
        return [r[0] if isinstance(r, list) and len(r) == 1 else r for r in result]

    def preprocess(self, text: str, truncation: bool = False) -> dict[str, Any]:
        if not isinstance(text, str):
            raise TypeError(
                f"The translation pipeline takes a string or a list of strings, got {type(text).__name__}."
            )
        return self.tokenizer(text, return_tensors="pt", truncation=truncation)

    def _forward(self, model_inputs: dict[str, Any], **generate_kwargs: Any) -> dict[str, Any]:
        # From transformers 5.20 the pipeline adds its generation defaults here; before, generate() takes the
        # call's settings as they are.
        prepare = getattr(self, "_prepare_generate_kwargs", None)
        if prepare is not None:
            generate_kwargs = prepare(generate_kwargs)
        return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(
        self,
        model_outputs: dict[str, Any],
        clean_up_tokenization_spaces: bool = False,
        target_tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> list[dict[str, str]]:
        decoder = target_tokenizer or self.tokenizer
        return [
            {
                "translation_text": decoder.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            }
            for ids in model_outputs["output_ids"]
        ]


def register_translation_pipeline() -> None:
    """Register `TranslationPipeline` under `TASK` with transformers' public pipeline registry, so that
    `pipeline("seq2seq-translation", model=...)` builds one."""
    PIPELINE_REGISTRY.register_pipeline(
        TASK, pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )
