"""The export package, the engines package and `vanilla-transformer export`: CTranslate2 and ONNX exports
decode as generate() does.

The models are trained here for a few seconds to reverse word sequences (with separate vocabularies, also to
write them in upper case): far from perfect, so that their outputs vary in length and content as a real
model's do. Random weights repeat one token until the length limit, which hides most decoding differences.
"""

import importlib.util
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from transformers import AutoModelForSeq2SeqLM, GenerationConfig
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from hf_vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    paper_generation_config,
)
from hf_vanilla_transformer.commands import command_module
from hf_vanilla_transformer.commands import translate as translate_command
from hf_vanilla_transformer.common.model_location import EXPORT_INFO_FILE
from hf_vanilla_transformer.conversion import tokenizer_from_fairseq_dictionary
from hf_vanilla_transformer.inference.engines.base import detect_engine
from hf_vanilla_transformer.inference.engines.ctranslate2 import CTranslate2Options, ctranslate2_options
from hf_vanilla_transformer.inference.engines.ctranslate2_export import (
    ctranslate2_refusals,
    ctranslate2_vocabulary,
    export_ctranslate2,
)
from hf_vanilla_transformer.inference.engines.export_common import ExportError, ExportSource, load_for_export
from hf_vanilla_transformer.inference.engines.exporting import export
from hf_vanilla_transformer.inference.engines.onnx import OnnxSeq2SeqLM
from hf_vanilla_transformer.inference.engines.onnx_graphs import ONNX_DECODER_FILE, ONNX_ENCODER_FILE
from hf_vanilla_transformer.inference.engines.shortlist import VMAP_FILE, Shortlist, build_shortlist
from hf_vanilla_transformer.inference.translator import load_model, load_translator
from hf_vanilla_transformer.translation_pipeline import TARGET_TOKENIZER_DIR
from hf_vanilla_transformer.vanilla_transformer.generation_vanilla_transformer import gnmt_length_penalty


def _load_export_script():
    return command_module("export")


export_script = _load_export_script()


def _installed(*packages: str) -> bool:
    return all(importlib.util.find_spec(package) is not None for package in packages)


needs_ctranslate2 = pytest.mark.skipif(
    not _installed("ctranslate2"), reason="ctranslate2 is not installed (pip install -e '.[export]')"
)
needs_onnx = pytest.mark.skipif(
    not _installed("onnx", "onnxscript", "onnxruntime"),
    reason="onnx, onnxscript or onnxruntime is not installed (pip install -e '.[export]')",
)

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
SOURCE_WORDS = [f"w{i}" for i in range(16)]
# Separate-vocabulary models write the reversed words in upper case, from a target vocabulary of another size.
TARGET_WORDS = [f"W{i}" for i in range(16)] + ["X"]
# One trained model per positional layout, each with other features an export must carry.
VARIANTS: dict[str, dict] = {
    "paper": {},  # interleaved sinusoids, one shared vocabulary, ReLU
    "marian": {"sinusoidal_layout": "marian", "output_bias": True, "activation_function": "swish"},
    # fairseq's positions start at pad + 1, its decoder starts from </s>; separate vocabularies.
    "fairseq": {
        "sinusoidal_layout": "fairseq",
        "decoder_start_token_id": 2,
        "share_encoder_decoder_embeddings": False,
        "decoder_vocab_size": len(SPECIALS) + len(TARGET_WORDS),
    },
    "learned": {
        "position_embedding_type": "learned",
        "activation_function": "gelu",
        "share_encoder_decoder_embeddings": False,
        "tie_word_embeddings": False,
    },
}
SEPARATE_VOCABULARIES = {"fairseq"}
TRAINING_STEPS = 150


def _sentences(count: int, seed: int, longest: int = 12) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (count,), generator=generator).tolist()
    return [
        " ".join(SOURCE_WORDS[i] for i in torch.randint(0, len(SOURCE_WORDS), (n,), generator=generator))
        for n in lengths
    ]


# Inputs longer than the training ones (2-8 words) too, and a blank line.
SENTENCES = [*_sentences(23, seed=1), ""]


def _reverse_pairs(variant: str, count: int, seed: int) -> tuple[list[str], list[str]]:
    """Sentences of 1-8 words and their reversals (in upper case for separate vocabularies)."""
    sources = _sentences(count, seed, longest=8)
    targets = [" ".join(reversed(source.split())) for source in sources]
    if variant in SEPARATE_VOCABULARIES:
        targets = [target.upper() for target in targets]
    return sources, targets


def train_reverse_model(folder: Path, variant: str) -> Path:
    """Train a 2+2-layer, d_model 32 model for TRAINING_STEPS steps to reverse sequences of 2-8 words, and
    save it with its tokenizer(s) and the paper's generation config into `folder`."""
    separate = variant in SEPARATE_VOCABULARIES
    source_tokenizer = tokenizer_from_fairseq_dictionary(SPECIALS + SOURCE_WORDS)
    target_tokenizer = tokenizer_from_fairseq_dictionary(
        SPECIALS + (TARGET_WORDS if separate else SOURCE_WORDS)
    )
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset(
        "base",
        vocab_size=len(source_tokenizer),
        d_model=32,
        N=2,
        h=4,
        d_ff=64,
        max_position_embeddings=64,
        P_drop=0.0,
        **VARIANTS[variant],
    )
    model = VanillaTransformerForConditionalGeneration(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3, betas=(0.9, 0.98))
    generator = torch.Generator().manual_seed(0)
    for _ in range(TRAINING_STEPS):
        sources, targets = _reverse_pairs(
            variant, 32, int(torch.randint(0, 2**31, (1,), generator=generator))
        )
        sources = [s if len(s.split()) > 1 else f"{s} {s}" for s in sources]
        targets = [t if len(t.split()) > 1 else f"{t} {t}" for t in targets]
        batch = source_tokenizer(sources, return_tensors="pt", padding=True)
        labels = target_tokenizer(targets, return_tensors="pt", padding=True)["input_ids"]
        labels[labels == target_tokenizer.pad_token_id] = -100
        loss = model(**batch, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().generation_config = paper_generation_config(config)
    model.save_pretrained(folder)
    source_tokenizer.save_pretrained(folder)
    if separate:
        target_tokenizer.save_pretrained(folder / TARGET_TOKENIZER_DIR)
    return folder


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`exported(variant)`: the trained model's folder; `exported(variant, "ctranslate2" | "onnx",
    quantization)`: its export. Each is made once per test session."""
    folders: dict[tuple, Path] = {}

    def get(variant: str, target: str = "torch", quantization: str | None = None) -> Path:
        key = (variant, target, quantization)
        if key not in folders:
            folder = tmp_path_factory.mktemp(f"{variant}-{target}-{quantization}")
            if target == "torch":
                folders[key] = train_reverse_model(folder, variant)
            else:
                folders[key] = export(get(variant), target, folder, quantization=quantization, force=True)
        return folders[key]

    return get


def _batches(folder: Path, size: int = 8) -> list[dict[str, torch.Tensor]]:
    tokenizer = load_translator(folder).tokenizer
    texts = [s for s in SENTENCES if s]
    return [
        tokenizer(texts[i : i + size], return_tensors="pt", padding=True) for i in range(0, len(texts), size)
    ]


# The decodings compared: the paper's (beam 4, GNMT penalty 0.6, input + 50), greedy, and beam 4 with
# transformers' penalty |Y|^0.6.
DECODINGS = ({}, {"num_beams": 1}, {"length_penalty_type": "transformers"})


def _assert_decodes_as_generate(folder: Path, exported_folder: Path) -> None:
    """Token for token on padded batches, and through Translator (batching, blank lines, detokenization)."""
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    engine = load_model(exported_folder)
    reference = load_translator(folder)
    translator = load_translator(exported_folder)
    for decoding in DECODINGS:
        for batch in _batches(folder):
            expected = model.generate(**batch, **decoding)
            assert torch.equal(engine.generate(**batch, **decoding), expected), decoding
        expected_text = reference.translate(SENTENCES, batch_size=8, **decoding)
        assert translator.translate(SENTENCES, batch_size=8, **decoding) == expected_text, decoding
    # A test that could not fail on a model that writes one output for everything.
    assert len(set(expected_text)) > len(SENTENCES) // 2
    assert len({len(text.split()) for text in expected_text}) > 4


@needs_ctranslate2
@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ctranslate2_float32_export_decodes_as_generate(exported, variant):
    _assert_decodes_as_generate(exported(variant), exported(variant, "ctranslate2"))


def _cpu_has_vnni() -> bool:
    """Whether the CPU multiplies int8 with VNNI instructions (AVX-512 VNNI or AVX-VNNI)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


@needs_ctranslate2
@pytest.mark.slow
def test_ctranslate2_int8_exports_run_and_mostly_agree(exported):
    """int8 weights change the logits a little: every input is translated, and with VNNI most translations
    stay the same. Without VNNI, CTranslate2's int8 products differ more from float32 (measured in
    docs/export.md: 89 of 96 identical with AVX-512 VNNI, 37 of 96 on an AVX2-only CPU), so there the
    agreement is reported, not required."""
    same = total = 0
    for variant in VARIANTS:
        float32 = load_translator(exported(variant, "ctranslate2")).translate(SENTENCES)
        int8 = load_translator(exported(variant, "ctranslate2", "int8")).translate(SENTENCES)
        assert all(text.strip() or not source for text, source in zip(int8, SENTENCES))
        same += sum(a == b for a, b in zip(float32, int8))
        total += len(SENTENCES)
    print(f"CTranslate2 int8 agrees with float32 on {same} of {total} translations")
    if _cpu_has_vnni():
        assert same / total >= 0.8, f"int8 agrees with float32 on {same} of {total} sentences"


def test_build_shortlist_pairs_each_word_with_its_translation():
    """In the reversal data a source word always comes with its upper-case form: the best-ranked target
    token of every word; the pairs are read in chunks, whose counts must add up."""
    source_tokenizer = tokenizer_from_fairseq_dictionary(SPECIALS + SOURCE_WORDS)
    target_tokenizer = tokenizer_from_fairseq_dictionary(SPECIALS + TARGET_WORDS)
    sources, targets = _reverse_pairs("fairseq", 300, seed=7)
    shortlist = build_shortlist(
        sources, targets, source_tokenizer, target_tokenizer, size=1, frequent=3, chunk=64
    )
    assert shortlist.candidates == {word: [word.upper()] for word in SOURCE_WORDS}
    assert len(shortlist.always) == 3 and set(shortlist.always) < set(TARGET_WORDS)
    wider = build_shortlist(sources, targets, source_tokenizer, target_tokenizer, size=4, frequent=0)
    assert all(targets[0] == word.upper() and len(targets) > 1 for word, targets in wider.candidates.items())
    assert wider.always == []


def test_shortlist_file_has_ctranslate2s_vmap_format(tmp_path):
    """`source<TAB>targets` lines, the tokens always allowed on the line with an empty source (the format
    CTranslate2's VocabularyMap reads); tokens the format or the vocabularies cannot hold are refused."""
    shortlist = Shortlist(["W1", "W2"], {"w1": ["W1"], "w2": ["W2", "W3"]})
    shortlist.write(tmp_path / VMAP_FILE)
    assert (tmp_path / VMAP_FILE).read_text(encoding="utf-8") == "\tW1 W2\nw1\tW1\nw2\tW2 W3\n"
    assert shortlist.allowed(["w2", "w9"]) == {"W1", "W2", "W3"}
    shortlist.check(["w1", "w2"], ["W1", "W2", "W3"])
    with pytest.raises(ExportError, match="names target token 'W3', which is not in the target vocabulary"):
        shortlist.check(["w1", "w2"], ["W1", "W2"])
    with pytest.raises(ExportError, match="or holds whitespace"):
        Shortlist(["W 1"], {}).check([], ["W 1"])


@needs_ctranslate2
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["paper", "fairseq"])
def test_a_shortlist_of_every_token_decodes_as_no_shortlist(exported, tmp_path, variant):
    source = load_for_export(exported(variant))
    target_tokenizer = source.target_tokenizer or source.tokenizer
    every_token = ctranslate2_vocabulary(target_tokenizer, source.config.decoder_vocab_size, "target")
    folder = export_ctranslate2(source, tmp_path / "ct2", shortlist=Shortlist(every_token, {}))
    with_vmap, without = load_model(folder), load_model(folder, use_vmap=False)
    assert (with_vmap.use_vmap, without.use_vmap) == (True, False)
    for decoding in DECODINGS:
        for batch in _batches(exported(variant)):
            assert torch.equal(with_vmap.generate(**batch, **decoding), without.generate(**batch, **decoding))


@needs_ctranslate2
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["paper", "fairseq"])
def test_a_shortlist_restricts_outputs_to_its_tokens(exported, tmp_path, variant):
    """With one target token per source word and none always allowed, each output holds only the
    translations of its input's words (and CTranslate2's special tokens), where the unrestricted engine
    writes others."""
    source = load_for_export(exported(variant))
    target_tokenizer = source.target_tokenizer or source.tokenizer
    shortlist = build_shortlist(
        *_reverse_pairs(variant, 300, seed=7), source.tokenizer, target_tokenizer, size=1, frequent=0
    )
    folder = export_ctranslate2(source, tmp_path / "ct2", shortlist=shortlist)
    restricted, free = load_model(folder), load_model(folder, use_vmap=False)
    escapes = 0
    for text in filter(None, SENTENCES):
        batch = source.tokenizer([text], return_tensors="pt")
        allowed = shortlist.allowed(source.tokenizer.tokenize(text)) | set(SPECIALS)
        for decoding in DECODINGS:
            outputs = [
                set(target_tokenizer.convert_ids_to_tokens(engine.generate(**batch, **decoding)[0, 1:]))
                for engine in (restricted, free)
            ]
            assert outputs[0] <= allowed, (text, decoding)
            escapes += not outputs[1] <= allowed
    assert escapes > 0


@needs_onnx
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["paper", "fairseq", "marian", "learned"])
def test_onnx_export_gives_the_models_logits_step_by_step(exported, variant):
    """Teacher-forced logits of a padded batch: the PyTorch model in one call, the ONNX graphs as generate()
    runs them (the first steps together from an empty past, then one step at a time)."""
    model = AutoModelForSeq2SeqLM.from_pretrained(exported(variant)).eval()
    onnx_model = OnnxSeq2SeqLM(exported(variant, "onnx"))
    batch = _batches(exported(variant))[0]
    generator = torch.Generator().manual_seed(0)
    shape = (batch["input_ids"].shape[0], 7)
    targets = torch.randint(len(SPECIALS), model.config.decoder_vocab_size, shape, generator=generator)
    targets[:, 0] = model.config.decoder_start_token_id
    with torch.no_grad():
        expected = model(**batch, decoder_input_ids=targets).logits
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    encoder_outputs = onnx_model.get_encoder()(**batch)
    steps = []
    for start, end in ((0, 3), (3, 4), (4, 5), (5, 7)):
        output = onnx_model(
            attention_mask=batch["attention_mask"],
            decoder_input_ids=targets[:, start:end],
            encoder_outputs=encoder_outputs,
            cache=cache,
        )
        steps.append(output.logits)
    assert (torch.cat(steps, dim=1) - expected).abs().max() < 1e-4


@needs_onnx
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["paper", "fairseq", "marian", "learned"])
def test_onnx_export_decodes_as_generate(exported, variant):
    _assert_decodes_as_generate(exported(variant), exported(variant, "onnx"))


def _vocabulary_tokenizer(size: int):
    return tokenizer_from_fairseq_dictionary(SPECIALS + [f"t{i}" for i in range(size - len(SPECIALS))])


@needs_ctranslate2
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"sinusoidal_layout": "marian", "output_bias": True, "activation_function": "silu"},
        {"sinusoidal_layout": "fairseq", "decoder_start_token_id": 2},
        {"position_embedding_type": "learned", "share_encoder_decoder_embeddings": False},
        {"h": 2, "d_k": 6, "d_v": 6, "scale_embedding": False, "layer_norm_eps": 1e-6},
    ],
)
def test_ctranslate2_spec_gives_the_models_log_probabilities(tmp_path, overrides):
    """CTranslate2's scores of forced targets equal the model's log-probabilities, for every layout, head
    size, embedding scale, logits bias and LayerNorm epsilon."""
    import ctranslate2

    model = tiny_model(**overrides)
    if model.config.output_bias:
        with torch.no_grad():
            model.final_logits_bias.normal_()
    tokenizer = _vocabulary_tokenizer(model.config.vocab_size)
    export_ctranslate2(ExportSource(model, tokenizer, name="in memory"), tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), intra_threads=1)
    generator = torch.Generator().manual_seed(0)
    source = torch.randint(len(SPECIALS), model.config.vocab_size, (3, 7), generator=generator)
    source[:, -1] = model.config.eos_token_id
    target = torch.randint(len(SPECIALS), model.config.vocab_size, (3, 6), generator=generator)
    decoder_input_ids = torch.cat(
        [torch.full((3, 1), model.config.decoder_start_token_id), target[:, :-1]], 1
    )
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=source, decoder_input_ids=decoder_input_ids).logits, -1)
    expected = log_probs.gather(2, target[..., None])[..., 0]
    results = translator.score_batch(
        [tokenizer.convert_ids_to_tokens(row) for row in source.tolist()],
        [tokenizer.convert_ids_to_tokens(row) for row in target.tolist()],
    )
    scores = torch.tensor([result.log_probs[: target.shape[1]] for result in results])  # then </s>'s
    assert (scores - expected).abs().max() < 1e-4


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"d_k": 8, "d_v": 4}, "d_k (8) differs from d_v (4)"), ({"eos_token_id": [2, 3]}, "eos_token_id")],
)
def test_ctranslate2_refuses_what_its_spec_cannot_hold(overrides, field):
    assert any(field in reason for reason in ctranslate2_refusals(tiny_model(**overrides).config))


def test_ctranslate2_refuses_an_activation_it_lacks():
    config = tiny_model().config
    config.activation_function = "gelu_new"  # tanh-approximated GELU: not the erf GELU CTranslate2 has
    assert ctranslate2_refusals(config) == ["activation_function 'gelu_new' has no CTranslate2 counterpart"]
    assert ctranslate2_refusals(tiny_model().config) == []


@needs_ctranslate2
def test_ctranslate2_export_stops_at_a_refused_field(tmp_path):
    model = tiny_model(d_k=8, d_v=4)
    with pytest.raises(ExportError, match=r"^Cannot export to CTranslate2: d_k \(8\) differs from d_v"):
        export_ctranslate2(ExportSource(model, _vocabulary_tokenizer(64)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_ctranslate2_options_follow_generate_and_refuse_what_they_cannot_apply():
    config = paper_generation_config(tiny_model().config)
    tokens = [f"t{i}" for i in range(64)]
    paper = ctranslate2_options(config, {}, tokens)
    assert (paper.beam_size, paper.alpha, paper.gnmt_penalty) == (4, 0.6, True)
    assert paper.max_decoding_length(10, positions=1024) == 60
    assert paper.max_decoding_length(1000, positions=1024) == 1024
    fixed = ctranslate2_options(config, {"max_new_tokens": 7, "num_beams": 1}, tokens)
    assert (fixed.beam_size, fixed.max_decoding_length(10, positions=1024)) == (1, 7)
    assert (
        paper.min_new_tokens,
        ctranslate2_options(config, {"min_new_tokens": 5}, tokens).min_new_tokens,
    ) == (0, 5)
    assert ctranslate2_options(GenerationConfig(max_length=12), {}, tokens).max_decoding_length(3, 64) == 11
    sampling = ctranslate2_options(config, {"do_sample": True, "top_k": 5}, tokens)
    assert (sampling.sampling, sampling.sampling_topk, sampling.search_options()["beam_size"]) == (True, 5, 1)
    assert ctranslate2_options(config, {"do_sample": False, "early_stopping": True}, tokens) == paper
    with pytest.raises(ValueError, match=r"cannot apply \['repetition_penalty'\]"):
        ctranslate2_options(GenerationConfig(repetition_penalty=1.2), {}, tokens)


def test_ctranslate2_hypotheses_are_ranked_by_transformers_penalty():
    """CTranslate2's score is log p / |Y|^alpha; the rank is log p / lp(|Y|) with |Y| as transformers counts
    it, which includes the end token the paper's length rule forces."""
    gnmt = CTranslate2Options(beam_size=4, alpha=0.6, gnmt_penalty=True, length_offset=50)
    finished, cut = ["a", "b", "</s>"], ["a", "b", "c"]
    log_p = -2.0
    assert gnmt.rank(finished, log_p / 3**0.6, "</s>") == pytest.approx(log_p / gnmt_length_penalty(3, 0.6))
    assert gnmt.rank(cut, log_p / 3**0.6, "</s>") == pytest.approx(log_p / gnmt_length_penalty(4, 0.6))
    plain = CTranslate2Options(beam_size=4, alpha=0.6, gnmt_penalty=False, max_new_tokens=3)
    assert plain.rank(cut, log_p / 3**0.6, "</s>") == pytest.approx(log_p / 3**0.6)
    neutral = CTranslate2Options(beam_size=4, alpha=0.0, gnmt_penalty=False, max_new_tokens=3)
    assert neutral.ctranslate2_length_penalty > 0  # 0 would stop CTranslate2 at the first finished beam
    assert neutral.rank(cut, log_p, "</s>") == pytest.approx(log_p)


@needs_ctranslate2
@needs_onnx
@pytest.mark.slow
def test_exports_translate_inputs_longer_than_their_position_table_from_their_start(exported, caplog):
    too_long = " ".join(["w1"] * 70)  # 71 tokens with </s>; the table has max_position_embeddings = 64 rows
    start = " ".join(["w1"] * 63)  # what fits: 63 tokens and </s>
    for target in ("ctranslate2", "onnx"):
        translator = load_translator(exported("marian", target))
        [cut, whole] = translator.translate_n_best([too_long, start])
        assert cut.truncated and not whole.truncated and cut.text == whole.text
        assert "line 1: 71 tokens, more than the model's 64 positions" in caplog.text


@needs_ctranslate2
def test_export_script_writes_a_self_contained_folder(tmp_path, capsys):
    model = tiny_model(share_encoder_decoder_embeddings=False, decoder_vocab_size=40)
    model.generation_config = paper_generation_config(model.config)
    model.save_pretrained(tmp_path / "model")
    _vocabulary_tokenizer(64).save_pretrained(tmp_path / "model")
    _vocabulary_tokenizer(40).save_pretrained(tmp_path / "model" / TARGET_TOKENIZER_DIR)
    export_script.main(
        ["--model", str(tmp_path / "model"), "--to", "ctranslate2", "--out", str(tmp_path / "out")]
    )
    assert "Exported" in capsys.readouterr().out
    shutil.move(tmp_path / "out", tmp_path / "moved")
    shutil.rmtree(tmp_path / "model")
    folder = tmp_path / "moved"
    assert json.loads((folder / EXPORT_INFO_FILE).read_text())["engine"] == "ctranslate2"
    vocabularies = [
        json.loads((folder / f"{side}_vocabulary.json").read_text()) for side in ("source", "target")
    ]
    assert [len(tokens) for tokens in vocabularies] == [64, 40]
    translator = load_translator(folder)
    assert (translator.engine, detect_engine(folder)) == ("ctranslate2", "ctranslate2")
    assert translator.target_tokenizer is not None and len(translator.target_tokenizer) == 40
    assert len(translator.translate(["t1 t2 t3", ""], max_new_tokens=3)) == 2


@needs_ctranslate2
def test_export_script_builds_a_shortlist_from_training_files(tmp_path):
    model = tiny_model()
    model.generation_config = paper_generation_config(model.config)
    model.save_pretrained(tmp_path / "model")
    _vocabulary_tokenizer(64).save_pretrained(tmp_path / "model")
    (tmp_path / "train.en").write_text("t5 t9\nt7 t3\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("t9 t5\nt3 t7\n", encoding="utf-8")
    common = ["--model", str(tmp_path / "model"), "--to", "ctranslate2"]
    export_script.main(
        [
            *common,
            "--out",
            str(tmp_path / "ct2"),
            "--shortlist-from",
            str(tmp_path / "train"),
            "--shortlist-size",
            "1",
        ]
    )
    lines = (tmp_path / "ct2" / VMAP_FILE).read_text(encoding="utf-8").splitlines()
    assert sorted(lines[0].split("\t")[1].split()) == ["t3", "t5", "t7", "t9"]
    assert sorted(line.split("\t")[0] for line in lines[1:]) == ["t3", "t5", "t7", "t9"]
    info = json.loads((tmp_path / "ct2" / EXPORT_INFO_FILE).read_text())
    assert info["shortlist"] == {"always": 4, "source_tokens": 4}
    assert load_model(tmp_path / "ct2").use_vmap and not load_model(tmp_path / "ct2", use_vmap=False).use_vmap
    export_script.main([*common, "--out", str(tmp_path / "plain")])
    assert not load_model(tmp_path / "plain").use_vmap
    with pytest.raises(ValueError, match="has no vocabulary shortlist"):
        load_model(tmp_path / "plain", use_vmap=True)


def _script_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        export_script.main(list(argv))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    return error


def test_export_script_reports_bad_input_in_one_line(tmp_path, capsys):
    error = _script_error(capsys, "--model", str(tmp_path), "--to", "tflite", "--out", str(tmp_path / "out"))
    assert "argument --to: invalid choice: 'tflite' (choose from" in error and "onnx" in error
    missing = str(tmp_path / "no-such-model")
    error = _script_error(
        capsys, "--model", missing, "--to", "onnx", "--quantization", "int8", "--out", str(tmp_path / "out")
    )
    assert "quantization (--quantization) applies to CTranslate2 exports only" in error
    error = _script_error(
        capsys,
        "--model",
        missing,
        "--to",
        "onnx",
        "--shortlist-from",
        "train",
        "--out",
        str(tmp_path / "out"),
    )
    assert "shortlist (--shortlist-from) applies to CTranslate2 exports only" in error
    error = _script_error(
        capsys,
        "--model",
        missing,
        "--to",
        "ctranslate2",
        "--shortlist-from",
        str(tmp_path / "nothing"),
        "--out",
        str(tmp_path / "out"),
    )
    assert f"No such shortlist file: {tmp_path / 'nothing'}.en, {tmp_path / 'nothing'}.de" in error


@needs_ctranslate2
def test_export_script_names_a_missing_model_folder_in_one_line(tmp_path, capsys):
    missing = str(tmp_path / "no-such-model")
    error = _script_error(capsys, "--model", missing, "--to", "ctranslate2", "--out", str(tmp_path / "out"))
    assert f"{missing}: no such folder. Give a folder written by save_pretrained" in error
    assert not (tmp_path / "out").exists()


@needs_ctranslate2
def test_export_refuses_an_occupied_folder_unless_forced(exported, tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "model")
    _vocabulary_tokenizer(64).save_pretrained(tmp_path / "model")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("keep")
    with pytest.raises(ExportError, match="exists and is not empty: give a new folder, or --force"):
        export(tmp_path / "model", "ctranslate2", tmp_path / "out")
    assert (tmp_path / "out" / "notes.txt").read_text() == "keep"
    # --force replaces an earlier export only, never a folder of other files (a training run, say).
    with pytest.raises(
        ExportError, match="holds files that no export wrote .*: --force replaces only an earlier"
    ):
        export(tmp_path / "model", "ctranslate2", tmp_path / "out", force=True)
    assert (tmp_path / "out" / "notes.txt").read_text() == "keep"
    # An earlier export, which --force replaces: of any model, so the ONNX export the other tests decode
    # (exported once a session, where an export of its own took most of this test's time), else one made
    # here.
    if _installed("onnx", "onnxscript", "onnxruntime"):
        shutil.copytree(exported("paper", "onnx"), tmp_path / "earlier")
        assert detect_engine(tmp_path / "earlier") == "onnx"
    else:
        export(tmp_path / "model", "ctranslate2", tmp_path / "earlier")
    export(tmp_path / "model", "ctranslate2", tmp_path / "earlier", force=True)
    assert detect_engine(tmp_path / "earlier") == "ctranslate2"
    with pytest.raises(ExportError, match="holds the model being exported"):
        export(tmp_path / "model", "ctranslate2", tmp_path, force=True)


@needs_ctranslate2
def test_export_refuses_shortlist_files_that_are_not_line_aligned_utf8(tmp_path, capsys):
    model = tiny_model()
    model.save_pretrained(tmp_path / "model")
    _vocabulary_tokenizer(64).save_pretrained(tmp_path / "model")
    (tmp_path / "short.en").write_text("a b\nc d\ne f\n", encoding="utf-8")
    (tmp_path / "short.de").write_text("a b\nc d\n", encoding="utf-8")
    (tmp_path / "latin.en").write_bytes("a b\nd\xe9j\xe0\n".encode("latin-1"))
    (tmp_path / "latin.de").write_text("a b\nc d\n", encoding="utf-8")
    common = ["--model", str(tmp_path / "model"), "--to", "ctranslate2", "--out", str(tmp_path / "out")]

    def error_after_loading(*argv: str) -> str:  # the model loads (with its progress bar) before the refusal
        with pytest.raises(SystemExit) as exit_info:
            export_script.main([*common, *argv])
        assert exit_info.value.code == 2
        error = capsys.readouterr().err
        assert "Traceback" not in error
        return error.splitlines()[-1]

    error = error_after_loading("--shortlist-from", str(tmp_path / "short"))
    assert "The shortlist's target text ends after 2 lines, before the other side" in error
    error = error_after_loading("--shortlist-from", str(tmp_path / "latin"))
    assert f"{tmp_path / 'latin.en'}, line 2: not valid UTF-8" in error
    assert not (tmp_path / "out").exists()


@needs_ctranslate2
def test_load_model_says_which_engine_a_folder_needs(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "model")
    _vocabulary_tokenizer(64).save_pretrained(tmp_path / "model")
    export(tmp_path / "model", "ctranslate2", tmp_path / "ct2")
    with pytest.raises(ValueError, match="is a ctranslate2 export: export it first"):
        load_model(tmp_path / "ct2", "onnx")
    with pytest.raises(ValueError, match="is not an exported folder"):
        load_model(tmp_path / "model", "ctranslate2")
    with pytest.raises(ValueError, match="is an export for ctranslate2, not a PyTorch model folder"):
        load_model(tmp_path / "ct2", "torch")
    assert detect_engine(tmp_path / "model") == "torch"


def _load_translate_script():
    return command_module("translate")


@needs_ctranslate2
def test_translate_script_decodes_an_exported_folder_as_the_model(tmp_path, capsys):
    translate_script = _load_translate_script()
    model = tiny_model(seed=4)
    model.generation_config = paper_generation_config(model.config)
    model.save_pretrained(tmp_path / "model")
    _vocabulary_tokenizer(64).save_pretrained(tmp_path / "model")
    export_script.main(
        ["--model", str(tmp_path / "model"), "--to", "ctranslate2", "--out", str(tmp_path / "ct2")]
    )
    (tmp_path / "source.txt").write_text("t5 t9 t13\n\nt7 t3 t21 t8\n")
    outputs = {}
    for name in ("model", "ct2"):
        translate_script.main(
            [
                "--model",
                str(tmp_path / name),
                "--input",
                str(tmp_path / "source.txt"),
                "--output",
                str(tmp_path / f"{name}.hyp"),
            ]
        )
        outputs[name] = (tmp_path / f"{name}.hyp").read_text()
    assert outputs["ct2"] == outputs["model"] and outputs["model"].count("\n") == 3
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        translate_script.main(
            ["--model", str(tmp_path / "ct2"), "--int8", "--input", str(tmp_path / "source.txt")]
        )
    assert exit_info.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def _translate_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line `vanilla-transformer translate ARGV` refuses with (exit status 2), after the progress
    bar where the refusal comes from the first batch."""
    with pytest.raises(SystemExit) as exit_info:
        translate_command.main(list(argv))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error, error
    last_line = error.strip().splitlines()[-1].split("\r")[-1]
    assert ": error: " in last_line, error
    return last_line


@needs_ctranslate2
@needs_onnx
@pytest.mark.slow
def test_an_input_longer_than_an_exports_positions_is_translated_with_a_warning(
    exported, tmp_path, capsys, caplog
):
    (tmp_path / "long.en").write_text("w1 w2\n" + " ".join(["w1"] * 70) + "\n", encoding="utf-8")
    for target in ("ctranslate2", "onnx"):
        folder = str(exported("marian", target))
        translate_command.main(
            ["--model", folder, "--input", str(tmp_path / "long.en"), "--output-format", "jsonl"]
        )
        captured = capsys.readouterr()
        objects = [json.loads(line) for line in captured.out.splitlines()]
        assert [obj.get("truncated", False) for obj in objects] == [False, True]
        assert "line 2: 71 tokens" in caplog.text


@needs_ctranslate2
@needs_onnx
@pytest.mark.parametrize(
    ("target", "damaged_file", "damage"),
    [
        ("ctranslate2", "model.bin", "delete"),
        ("ctranslate2", "model.bin", "truncate"),
        ("onnx", ONNX_DECODER_FILE, "delete"),
        ("onnx", ONNX_ENCODER_FILE, "truncate"),
    ],
)
def test_an_export_with_a_missing_or_damaged_file_is_refused_in_one_line(
    exported, tmp_path, capsys, target, damaged_file, damage
):
    folder = tmp_path / "export"
    shutil.copytree(exported("paper", target), folder)
    if damage == "delete":
        (folder / damaged_file).unlink()
    else:
        (folder / damaged_file).write_bytes((folder / damaged_file).read_bytes()[:1000])
    with pytest.raises(ValueError, match=f"Cannot load the export in {folder} .*export the model again"):
        load_translator(folder)
    (tmp_path / "src.en").write_text("w1 w2\n", encoding="utf-8")
    error = _translate_error(capsys, "--model", str(folder), "--input", str(tmp_path / "src.en"))
    assert "a file is missing or damaged" in error


@needs_onnx
def test_an_onnx_export_of_a_fixed_number_of_new_tokens_is_refused_in_one_line(exported, tmp_path, capsys):
    import onnx

    folder = tmp_path / "export"
    shutil.copytree(exported("paper", "onnx"), folder)
    graph = onnx.load(str(folder / ONNX_DECODER_FILE), load_external_data=False)
    (decoder_input_ids,) = (value for value in graph.graph.input if value.name == "decoder_input_ids")
    decoder_input_ids.type.tensor_type.shape.dim[1].dim_value = 2  # what a specialized trace leaves
    onnx.save(graph, str(folder / ONNX_DECODER_FILE))
    with pytest.raises(ValueError, match=f"The ONNX export in {folder} decodes exactly 2 tokens a step"):
        load_translator(folder)
    (tmp_path / "src.en").write_text("w1 w2\n", encoding="utf-8")
    error = _translate_error(capsys, "--model", str(folder), "--input", str(tmp_path / "src.en"))
    assert "export the model again" in error


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{bad", "is not valid JSON (JSONDecodeError, line 1 column 2)"),
        ("{}", "names no engine"),
        ("[]", "holds a list"),
    ],
)
def test_a_damaged_export_info_file_is_refused_in_one_line(tmp_path, capsys, content, problem):
    (tmp_path / EXPORT_INFO_FILE).write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(problem)):
        detect_engine(tmp_path)
    (tmp_path / "src.en").write_text("w1 w2\n", encoding="utf-8")
    error = _translate_error(capsys, "--model", str(tmp_path), "--input", str(tmp_path / "src.en"))
    assert problem in error and "export the model again" in error
