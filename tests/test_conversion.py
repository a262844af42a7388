"""`vanilla-transformer convert` and the converters in hf_vanilla_transformer.conversion.

A converted model must compute what its source computes. Marian is checked against transformers'
MarianMTModel. For fairseq, transformers' FSMTForConditionalGeneration (a port of fairseq's transformer) is
the reference: its weights are written out under the key names and in the checkpoint layout fairseq uses.
"""

import argparse
import io
import json
import shutil
import sys
import types
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from conftest import TINY_REFERENCE_DIMS
from test_marian_reference import random_marian
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    FSMTConfig,
    FSMTForConditionalGeneration,
    pipeline,
)

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.commands import command_module
from hf_vanilla_transformer.common.model_location import RESULTS_FILE
from hf_vanilla_transformer.common.tokenization import load_tokenizer
from hf_vanilla_transformer.conversion import (
    ConversionError,
    bpe_file_name,
    convert_fairseq_checkpoint,
    convert_marian_folder,
    fairseq_model_args,
    load_fairseq_checkpoint,
)
from hf_vanilla_transformer.hub.publishing import stage_repo
from hf_vanilla_transformer.inference.translation import load_tokenizers

REPO_ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-4


def script_main():
    return command_module("convert").main


def padded_batch(vocab_size: int, target_vocab_size: int, pad: int, start: int, seed: int = 1):
    """Right-padded source and target ids with their masks; no padding id inside the text."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab_size, (3, 11), generator=generator)
    tgt = torch.randint(3, target_vocab_size, (3, 8), generator=generator)
    src[src == pad], tgt[tgt == pad] = 3, 3
    tgt[:, 0] = start
    src_mask, tgt_mask = torch.ones_like(src), torch.ones_like(tgt)
    src_mask[1, 7:], tgt_mask[2, 5:] = 0, 0
    src[src_mask == 0], tgt[tgt_mask == 0] = pad, pad
    return src, src_mask, tgt, tgt_mask


# ---------------------------------------------------------------------------------------------------
# Marian


def test_marian_cli_round_trip(tmp_path, capsys):
    marian = random_marian()
    marian.save_pretrained(tmp_path / "marian")
    status = script_main()(
        ["--from", "marian", "--src", str(tmp_path / "marian"), "--out", str(tmp_path / "out")]
    )
    output = capsys.readouterr()
    assert status == 0, output.err
    assert "model.encoder.layers.N.fc1.weight" in output.out
    assert "model.encoder.layers.N.ffn.fc1.weight" in output.out
    assert "(ignored: sinusoids are computed)" in output.out

    ours = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    assert isinstance(ours, VanillaTransformerForConditionalGeneration)
    assert ours.generation_config.num_beams == marian.generation_config.num_beams
    src, src_mask, tgt, _ = padded_batch(96, 96, pad=95, start=95)
    with torch.no_grad():
        expected = marian(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
        actual = ours(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    assert (actual - expected).abs().max().item() <= TOLERANCE
    kwargs = dict(attention_mask=src_mask, num_beams=4, max_new_tokens=12, do_sample=False)
    assert torch.equal(ours.generate(input_ids=src, **kwargs), marian.generate(input_ids=src, **kwargs))


def test_a_forced_conversion_drops_what_described_the_earlier_model(tmp_path, capsys):
    random_marian().save_pretrained(tmp_path / "marian")
    earlier = tmp_path / "out"
    earlier.mkdir()
    results = earlier / RESULTS_FILE
    results.write_text('{"bleu": 37.0}')
    convert = ["--from", "marian", "--src", str(tmp_path / "marian"), "--out", str(earlier)]
    with pytest.raises(SystemExit) as refused:
        script_main()(convert)
    assert refused.value.code == 2 and results.is_file(), capsys.readouterr().err
    assert script_main()([*convert, "--force"]) == 0
    assert (earlier / "config.json").is_file() and not results.exists()


def save_tiny_marian_tokenizer(folder: Path, vocab_size: int = 96) -> None:
    """Marian tokenizer files as opus-mt ships them: a SentencePiece model trained here and a vocab.json
    in Marian's order, </s>=0, <unk>=1, the pieces, <pad>=vocab_size - 1 (random_marian's ids)."""
    sentencepiece = pytest.importorskip("sentencepiece")
    from transformers import MarianTokenizer

    texts = ["the cat sat on the mat", "a dog ran in the park", "hello world, how are you?"] * 30
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=40,
        minloglevel=2,
        hard_vocab_limit=False,
    )
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in pieces:
        if piece != "<s>":  # Marian's vocabularies have no <s>
            vocab.setdefault(piece, len(vocab))
    while len(vocab) < vocab_size - 1:
        vocab[f"<extra_{len(vocab)}>"] = len(vocab)
    vocab["<pad>"] = vocab_size - 1
    (folder / "vocab.json").write_text(json.dumps(vocab))
    files = [str(folder / name) for name in ("source.spm", "target.spm", "vocab.json")]
    MarianTokenizer(*files).save_pretrained(folder)
    # As in opus-mt repos: no tokenizer_class; AutoTokenizer goes by config.json's model_type "marian".
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))


@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
def test_a_forced_conversion_drops_the_earlier_models_tokenizer(tmp_path):
    """A model converted without a tokenizer must not be loaded with the one an earlier model left."""
    with_tokenizer = tmp_path / "with_tokenizer"
    random_marian().save_pretrained(with_tokenizer)
    save_tiny_marian_tokenizer(with_tokenizer)
    random_marian().save_pretrained(tmp_path / "without_tokenizer")
    out = tmp_path / "out"
    convert_marian_folder(with_tokenizer, out)
    AutoTokenizer.from_pretrained(out)
    report = convert_marian_folder(tmp_path / "without_tokenizer", out)
    assert any("no tokenizer saved" in note for note in report.notes)
    convert_marian_folder(tmp_path / "without_tokenizer", tmp_path / "fresh")
    assert sorted(path.name for path in out.iterdir()) == sorted(
        path.name for path in (tmp_path / "fresh").iterdir()
    )
    with pytest.raises(ValueError, match="holds no tokenizer"):
        load_tokenizer(out)


@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
def test_marian_tokenizer_carried_over(tmp_path):
    marian = random_marian()
    marian.save_pretrained(tmp_path / "marian")
    save_tiny_marian_tokenizer(tmp_path / "marian")
    report = convert_marian_folder(tmp_path / "marian", tmp_path / "out")
    assert any("Marian's SentencePiece tokenizer" in note for note in report.notes)

    original = AutoTokenizer.from_pretrained(tmp_path / "marian")
    converted = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert type(converted) is type(original)
    text = ["the cat sat on the mat", "hello world"]
    batch = converted(text, return_tensors="pt", padding=True)
    assert torch.equal(batch.input_ids, original(text, return_tensors="pt", padding=True).input_ids)

    ours = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    kwargs = dict(num_beams=4, max_new_tokens=10, do_sample=False)
    expected = marian.generate(**batch, **kwargs)
    actual = ours.generate(**batch, **kwargs)
    assert torch.equal(actual, expected)
    assert converted.batch_decode(actual, skip_special_tokens=True) == original.batch_decode(
        expected, skip_special_tokens=True
    )


def test_corrupted_marian_weights_are_named(tmp_path):
    random_marian().save_pretrained(tmp_path / "marian")
    weights = tmp_path / "marian" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ConversionError, match=r"Cannot read the Marian weights in .*model\.safetensors"):
        convert_marian_folder(tmp_path / "marian", tmp_path / "out")


def test_non_marian_folder_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bart"}))
    with pytest.raises(ConversionError, match="model_type 'bart'"):
        convert_marian_folder(tmp_path, tmp_path / "out")


# ---------------------------------------------------------------------------------------------------
# fairseq, with FSMT as the reference

SRC_PIECES = ["ha@@", "llo", "wor@@", "ld", "the", "cat"]
TGT_PIECES = ["hal@@", "lo", "we@@", "lt", "die", "katze", "der"]


def random_fsmt(shared: bool = False, seed: int = 0) -> FSMTForConditionalGeneration:
    """A tiny FSMT model with every weight random, LayerNorms included (FSMT initialises them to 1 and 0,
    which would hide a LayerNorm mix-up)."""
    vocab = (
        dict(src_vocab_size=48, tgt_vocab_size=48) if shared else dict(src_vocab_size=40, tgt_vocab_size=48)
    )
    config = FSMTConfig(
        langs=["en", "de"],
        **TINY_REFERENCE_DIMS,
        tie_word_embeddings=shared,
        **vocab,
    )
    torch.manual_seed(seed)
    fsmt = FSMTForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, parameter in fsmt.named_parameters():
            if "embed_positions" not in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    return fsmt


def fairseq_state(fsmt: FSMTForConditionalGeneration, old_layout: bool = False) -> OrderedDict:
    """FSMT's weights under fairseq's key names. `old_layout`: fairseq before 2019, with fused
    in_proj_weight/in_proj_bias, numbered layer_norms and decoder.embed_out."""
    state = OrderedDict()
    for key, tensor in fsmt.model.state_dict().items():
        if key.endswith("embed_positions.weight"):
            key, tensor = key.replace(".weight", "._float_tensor"), torch.FloatTensor(1)
        state[key] = tensor.clone()
    state["encoder.version"] = torch.Tensor([3])
    state["decoder.version"] = torch.Tensor([3])
    if not old_layout:
        return state
    for prefix in [k.removesuffix(".q_proj.weight") for k in list(state) if k.endswith(".q_proj.weight")]:
        for kind in ("weight", "bias"):
            parts = [state.pop(f"{prefix}.{name}_proj.{kind}") for name in "qkv"]
            state[f"{prefix}.in_proj_{kind}"] = torch.cat(parts)
    norms = {"encoder": ["self_attn", "final"], "decoder": ["self_attn", "encoder_attn", "final"]}
    for key in [k for k in list(state) if "_layer_norm." in k]:
        side, rest = key.split(".", 1)
        name = rest.split(".")[2].removesuffix("_layer_norm")
        state[key.replace(f"{name}_layer_norm", f"layer_norms.{norms[side].index(name)}")] = state.pop(key)
    state["decoder.embed_out"] = state.pop("decoder.output_projection.weight")
    return state


def fairseq_args(config: FSMTConfig, **overrides) -> argparse.Namespace:
    values = dict(
        arch="transformer_wmt_en_de",
        source_lang="en",
        target_lang="de",
        encoder_embed_dim=config.d_model,
        encoder_ffn_embed_dim=config.encoder_ffn_dim,
        encoder_layers=config.encoder_layers,
        encoder_attention_heads=config.encoder_attention_heads,
        decoder_embed_dim=config.d_model,
        decoder_ffn_embed_dim=config.decoder_ffn_dim,
        decoder_layers=config.decoder_layers,
        decoder_attention_heads=config.decoder_attention_heads,
        encoder_normalize_before=False,
        decoder_normalize_before=False,
        activation_fn="relu",
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        share_all_embeddings=config.tie_word_embeddings,
        share_decoder_input_output_embed=config.tie_word_embeddings,
        max_source_positions=config.max_position_embeddings,
        max_target_positions=config.max_position_embeddings,
        label_smoothing=0.1,
        lr=[0.0007],
    )
    values.update(overrides)
    return argparse.Namespace(**values)


def write_dictionary(path: Path, pieces: list[str], size: int) -> None:
    """A fairseq dict file for `size` ids: the four specials are implicit, then one `token count` a line."""
    lines = [f"{piece} {1000 - i}" for i, piece in enumerate(pieces)]
    lines += [f"w{i} {500 - i}" for i in range(size - 4 - len(pieces))]
    lines[-1] += " #fairseq:overwrite"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_fairseq_files(
    folder: Path, fsmt: FSMTForConditionalGeneration, checkpoint: dict, **save_kwargs
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = fsmt.config
    shared = config.tie_word_embeddings
    write_dictionary(folder / "dict.en.txt", SRC_PIECES if not shared else TGT_PIECES, config.src_vocab_size)
    write_dictionary(folder / "dict.de.txt", TGT_PIECES, config.tgt_vocab_size)
    (folder / "bpecodes").write_text("#version: 0.2\nh a\nha l\n", encoding="utf-8")
    torch.save(checkpoint, folder / "model.pt", **save_kwargs)
    return folder / "model.pt"


def assert_matches_fsmt(fsmt: FSMTForConditionalGeneration, ours: VanillaTransformerForConditionalGeneration):
    config = fsmt.config
    src, src_mask, tgt, tgt_mask = padded_batch(config.src_vocab_size, config.tgt_vocab_size, pad=1, start=2)
    with torch.no_grad():
        expected = fsmt(
            input_ids=src,
            attention_mask=src_mask,
            decoder_input_ids=tgt,
            decoder_attention_mask=tgt_mask,
            use_cache=False,  # with a cache FSMT skips its causal mask when given a whole target
        ).logits
        actual = ours(
            input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask
        ).logits
    # Padding positions differ by design: FSMT gives them a zero position vector; nothing reads them.
    real = tgt_mask.bool()
    assert (actual[real] - expected[real]).abs().max().item() <= TOLERANCE
    # FSMT forces </s> at the length limit, as fairseq's search does; ask ours for the same.
    kwargs = dict(
        attention_mask=src_mask, num_beams=1, max_new_tokens=10, do_sample=False, forced_eos_token_id=2
    )
    assert torch.equal(ours.generate(src, **kwargs), fsmt.generate(src, **kwargs))


def test_fairseq_cli_matches_fsmt(tmp_path, capsys):
    fsmt = random_fsmt()
    checkpoint = {
        "args": fairseq_args(fsmt.config),
        "model": fairseq_state(fsmt),
        "extra_state": {"epoch": 3},
    }
    model_path = write_fairseq_files(tmp_path / "fairseq", fsmt, checkpoint)
    argv = ["--from", "fairseq", "--src", str(model_path), "--data-dir", str(model_path.parent)]
    assert script_main()([*argv, "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "encoder.layers.N.fc1.weight" in printed
    assert "model.encoder.layers.N.ffn.fc1.weight" in printed
    assert "decoder.output_projection.weight" in printed and "lm_head.weight" in printed
    assert "does NOT tokenize raw text" in printed

    ours = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    config = ours.config
    assert (config.sinusoidal_layout, config.share_encoder_decoder_embeddings) == ("fairseq", False)
    assert (config.vocab_size, config.decoder_vocab_size, config.decoder_start_token_id) == (40, 48, 2)
    assert ours.generation_config.length_penalty_type == "gnmt"
    assert_matches_fsmt(fsmt, ours)

    assert (tmp_path / "out" / "bpecodes").read_text() == (tmp_path / "fairseq" / "bpecodes").read_text()
    source_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    target_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out" / "target_tokenizer")
    ids = source_tokenizer("ha@@ llo wor@@ ld unseen").input_ids
    assert ids == [4, 5, 6, 7, 3, 2]
    assert source_tokenizer.decode(ids, skip_special_tokens=True) == "hallo world"  # <unk> is special
    assert target_tokenizer.convert_tokens_to_ids(["hal@@", "lo"]) == [4, 5]
    assert target_tokenizer.decode([2, 4, 5, 6, 7, 2], skip_special_tokens=True) == "hallo welt"
    assert target_tokenizer.decode([2, 2], skip_special_tokens=True) == ""  # an empty translation


def test_translate_decodes_with_the_target_tokenizer(tmp_path):
    """Separate vocabularies: translate.py and the translation pipeline find the converted model's target
    tokenizer and decode the outputs with it, not with the source tokenizer."""
    fsmt = random_fsmt(seed=2)
    checkpoint = {"args": fairseq_args(fsmt.config), "model": fairseq_state(fsmt), "extra_state": {}}
    model_path = write_fairseq_files(tmp_path / "fairseq", fsmt, checkpoint)
    out = tmp_path / "out"
    convert_fairseq_checkpoint(model_path, model_path.parent, out)
    lines = ["ha@@ llo wor@@ ld", "wor@@ ld ha@@ llo ha@@ llo"]
    (tmp_path / "source.txt").write_text("\n".join(lines) + "\n")
    command_module("translate").main(
        ["--model", str(out), "--input", str(tmp_path / "source.txt"), "--output", str(tmp_path / "hyp")]
    )

    tokenizer, target_tokenizer = load_tokenizers(out)
    assert target_tokenizer is not None
    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    generated = [model.generate(**tokenizer(line, return_tensors="pt"))[0] for line in lines]
    expected = [target_tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in generated]
    assert (tmp_path / "hyp").read_text().splitlines() == expected
    assert expected != [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in generated]
    translator = pipeline("seq2seq-translation", model=str(out))
    assert [r["translation_text"].strip() for r in translator(lines)] == expected


def test_fairseq_old_layout_legacy_file(tmp_path):
    """fairseq before 2019: fused in_proj weights, numbered layer_norms, decoder.embed_out, relu_dropout,
    no activation_fn in args, and torch's pre-1.6 (non-zip) file format."""
    fsmt = random_fsmt(seed=3)
    args = fairseq_args(fsmt.config, arch="transformer_vaswani_wmt_en_de_big", relu_dropout=0.1)
    del args.activation_fn, args.activation_dropout
    checkpoint = {"args": args, "model": fairseq_state(fsmt, old_layout=True)}
    model_path = write_fairseq_files(
        tmp_path / "fairseq", fsmt, checkpoint, _use_new_zipfile_serialization=False
    )
    report = convert_fairseq_checkpoint(model_path, tmp_path / "fairseq", tmp_path / "out")
    table = report.format()
    assert "encoder.layers.N.self_attn.in_proj_weight" in table
    assert "model.encoder.layers.N.self_attn.{q,k,v}_proj.weight (split)" in table
    assert "decoder.layers.N.layer_norms.1.weight" in table
    assert "decoder.embed_out" in table
    ours = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    assert ours.config.activation_dropout == 0.1
    assert_matches_fsmt(fsmt, ours)


def test_fairseq_shared_vocabulary_and_cfg_checkpoint(tmp_path):
    """share_all_embeddings with a joined dictionary (as in the WMT En-De models), and a newer fairseq
    checkpoint: 'args' None, 'cfg' a dict with nested encoder/decoder sections and an interpolation."""
    fsmt = random_fsmt(shared=True, seed=5)
    flat = vars(fairseq_args(fsmt.config))
    model_cfg = {"_name": flat.pop("arch"), "max_source_positions": "${task.max_source_positions}"}
    for side in ("encoder", "decoder"):
        prefix = f"{side}_"
        model_cfg[side] = {
            key.removeprefix(prefix): flat.pop(key) for key in list(flat) if key.startswith(prefix)
        }
    for key in ("source_lang", "target_lang", "max_source_positions"):
        del flat[key]
    model_cfg.update(flat)
    cfg = {"model": model_cfg, "task": {"source_lang": "en", "target_lang": "de", "max_source_positions": 64}}
    checkpoint = {"args": None, "cfg": cfg, "model": fairseq_state(fsmt)}
    model_path = write_fairseq_files(tmp_path / "fairseq", fsmt, checkpoint)
    convert_fairseq_checkpoint(model_path, tmp_path / "fairseq", tmp_path / "out")
    ours = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    assert ours.config.share_encoder_decoder_embeddings and ours.config.max_position_embeddings == 64
    assert not (tmp_path / "out" / "target_tokenizer").exists()
    assert_matches_fsmt(fsmt, ours)


def fake_omegaconf_module(monkeypatch) -> types.SimpleNamespace:
    """Classes pickled under omegaconf's names with omegaconf's state layout ({'_content': ...} for
    containers, {'_val': ...} for values), so the test needs no omegaconf."""

    class Node:
        def __init__(self, **state):
            self.__dict__.update(state)

    classes = {}
    for module_name, class_name in [("omegaconf.dictconfig", "DictConfig"), ("omegaconf.nodes", "AnyNode")]:
        cls = type(class_name, (Node,), {"__module__": module_name})
        module = types.ModuleType(module_name)
        setattr(module, class_name, cls)
        monkeypatch.setitem(sys.modules, module_name, module)
        classes[class_name] = cls
    monkeypatch.setitem(sys.modules, "omegaconf", types.ModuleType("omegaconf"))
    return types.SimpleNamespace(**classes)


def test_pickled_omegaconf_cfg_is_read_without_omegaconf(tmp_path, monkeypatch):
    omegaconf = fake_omegaconf_module(monkeypatch)

    def container(values: dict):
        content = {
            k: container(v) if isinstance(v, dict) else omegaconf.AnyNode(_val=v) for k, v in values.items()
        }
        return omegaconf.DictConfig(_content=content, _parent=None)

    cfg = container(
        {"model": {"encoder": {"embed_dim": 32, "layers": 2}, "dropout": 0.3}, "task": {"source_lang": "en"}}
    )
    torch.save({"args": None, "cfg": cfg, "model": {}}, tmp_path / "model.pt")
    monkeypatch.delitem(sys.modules, "omegaconf.dictconfig")  # loading must not need the classes
    args = fairseq_model_args(load_fairseq_checkpoint(tmp_path / "model.pt"))
    assert args["encoder_embed_dim"] == 32 and args["encoder_layers"] == 2
    assert args["dropout"] == 0.3 and args["source_lang"] == "en" and args["target_lang"] is None


class _CopiesAFile:
    """Unpickling this calls shutil.copyfile: what an attacker's checkpoint could do."""

    def __init__(self, source: Path, target: Path):
        self.source, self.target = source, target

    def __reduce__(self):
        return shutil.copyfile, (str(self.source), str(self.target))


def test_checkpoint_code_never_runs(tmp_path):
    fsmt = random_fsmt()
    marker = tmp_path / "copied"
    attack = _CopiesAFile(Path(__file__), marker)
    checkpoint = {
        "args": fairseq_args(fsmt.config),
        "model": fairseq_state(fsmt),
        "extra_state": {"x": attack},
    }
    model_path = write_fairseq_files(tmp_path / "fairseq", fsmt, checkpoint)
    convert_fairseq_checkpoint(model_path, tmp_path / "fairseq", tmp_path / "out")
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------
# Bad input


@pytest.fixture
def fairseq_folder(tmp_path) -> tuple[FSMTForConditionalGeneration, Path]:
    fsmt = random_fsmt()
    checkpoint = {"args": fairseq_args(fsmt.config), "model": fairseq_state(fsmt)}
    return fsmt, write_fairseq_files(tmp_path / "fairseq", fsmt, checkpoint)


def test_bpe_codes_given_under_another_name_are_copied_as_the_hub_expects(tmp_path, fairseq_folder):
    _, model_path = fairseq_folder
    codes = tmp_path / "my-codes.en-de.txt"
    codes.write_text("#version: 0.2\nh a\n", encoding="utf-8")
    convert_fairseq_checkpoint(model_path, model_path.parent, tmp_path / "out", bpe_codes=codes)
    assert (tmp_path / "out" / "bpecodes").read_text() == codes.read_text()
    stage_repo(tmp_path / "out", tmp_path / "staged", "org/name")
    assert (tmp_path / "staged" / "bpecodes").read_text() == codes.read_text()
    assert [bpe_file_name(Path(name)) for name in ("spm.model", "code", "sentencepiece.bpe.model")] == [
        "sentencepiece.bpe.model",
        "code",
        "sentencepiece.bpe.model",
    ]


def test_a_forced_conversion_into_its_data_folder_keeps_the_bpe_codes(fairseq_folder):
    """Saving the model removes an earlier model's BPE codes from the output folder; where that folder is
    the data folder, they are the ones to copy."""
    _, model_path = fairseq_folder
    codes = (model_path.parent / "bpecodes").read_text()
    convert_fairseq_checkpoint(model_path, model_path.parent, model_path.parent)
    assert (model_path.parent / "bpecodes").read_text() == codes


def test_bart_like_checkpoint_is_refused(tmp_path, fairseq_folder):
    fsmt, model_path = fairseq_folder
    state = fairseq_state(fsmt)
    state["encoder.layernorm_embedding.weight"] = torch.ones(32)
    state["encoder.embed_positions.weight"] = torch.zeros(66, 32)
    args = fairseq_args(fsmt.config, arch="bart_base", layernorm_embedding=True, encoder_learned_pos=True)
    torch.save({"args": args, "model": state}, model_path)
    with pytest.raises(ConversionError) as error:
        convert_fairseq_checkpoint(model_path, model_path.parent, tmp_path / "out")
    message = str(error.value)
    assert "arch 'bart_base'" in message
    assert "layernorm_embedding" in message
    assert (
        "learned positional embeddings (encoder_learned_pos=True, encoder.embed_positions.weight present)"
        in message
    )
    assert not (tmp_path / "out").exists()


def test_pre_ln_checkpoint_is_refused(tmp_path, fairseq_folder):
    fsmt, model_path = fairseq_folder
    state = fairseq_state(fsmt)
    state["encoder.layer_norm.weight"] = torch.ones(32)
    args = fairseq_args(fsmt.config, arch="transformer_wmt_en_de_big_t2t", encoder_normalize_before=True)
    torch.save({"args": args, "model": state}, model_path)
    with pytest.raises(
        ConversionError, match=r"pre-LN layers \(encoder_normalize_before=True, encoder\.layer_norm"
    ):
        convert_fairseq_checkpoint(model_path, model_path.parent, tmp_path / "out")


def test_non_finite_weights_are_refused(tmp_path, fairseq_folder):
    fsmt, model_path = fairseq_folder
    state = fairseq_state(fsmt)
    state["encoder.layers.0.fc1.weight"][0, 0] = float("nan")
    torch.save({"args": fairseq_args(fsmt.config), "model": state}, model_path)
    with pytest.raises(ConversionError, match=r"NaN or infinite values: model\.encoder\.layers\.0\.ffn\.fc1"):
        convert_fairseq_checkpoint(model_path, model_path.parent, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_dictionary_is_named(tmp_path, fairseq_folder, capsys):
    _, model_path = fairseq_folder
    (model_path.parent / "dict.de.txt").unlink()
    main = script_main()
    argv = ["--from", "fairseq", "--src", str(model_path), "--data-dir", str(model_path.parent)]
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--out", str(tmp_path / "out")])
    assert refused.value.code == 2
    assert "Dictionary " + str(model_path.parent / "dict.de.txt") + " not found" in capsys.readouterr().err


def test_vocabulary_size_mismatch_is_named(tmp_path, fairseq_folder):
    _, model_path = fairseq_folder
    dictionary = model_path.parent / "dict.en.txt"
    dictionary.write_text("".join(dictionary.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(ConversionError) as error:
        convert_fairseq_checkpoint(model_path, model_path.parent, tmp_path / "out")
    assert "dict.en.txt defines 39 symbols (4 special + 35 lines)" in str(error.value)
    assert "encoder.embed_tokens.weight in model.pt has 40 rows" in str(error.value)


def test_not_a_checkpoint_is_refused(tmp_path, fairseq_folder):
    _, model_path = fairseq_folder
    model_path.write_bytes(b"not a checkpoint")
    with pytest.raises(ConversionError, match="Cannot read .*model.pt as a fairseq checkpoint"):
        convert_fairseq_checkpoint(model_path, model_path.parent, tmp_path / "out")
