"""Shared BPE vocabulary (Section 5.1): special ids, lossless decoding, save/reload, errors."""

from pathlib import Path

import datasets
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hf_vanilla_transformer.common.tokenization import load_tokenizer, train_shared_bpe_tokenizer

MULTI30K = Path(__file__).resolve().parent.parent / "data" / "multi30k"

KOREAN = [
    "안녕하세요, 만나서 반갑습니다.",
    "오늘 날씨가 정말 좋네요!",
    "두 남자가 공원에서 축구를 하고 있다.",
    "작은 소녀가 나무로 만든 놀이집에 올라가고 있다.",
    "저녁에 뭐 먹을까요?",
    "한 남자가 자전거를 타고 다리를 건너고 있다.",
]


def _lines(name: str, count: int | None = None) -> list[str]:
    return (MULTI30K / name).read_text(encoding="utf-8").splitlines()[:count]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    # The full training files hold every character of test_2016_flickr, so decoding it is lossless.
    sources = [MULTI30K / "train.en", MULTI30K / "train.de", *KOREAN]
    return train_shared_bpe_tokenizer(sources, vocab_size=3000, show_progress=False)


def test_special_token_ids(tokenizer):
    roles = ("pad", "unk", "bos", "eos")
    assert [getattr(tokenizer, f"{role}_token") for role in roles] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert [getattr(tokenizer, f"{role}_token_id") for role in roles] == [1, 3, 0, 2]
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<s>", "<pad>", "</s>", "<unk>"]
    assert len(tokenizer) == 3000
    assert tokenizer.model_max_length == 1024


def test_eos_appended_and_no_bos(tokenizer):
    source = tokenizer("A man rides a bike.").input_ids
    target = tokenizer(text_target="Ein Mann fährt Fahrrad.").input_ids
    for ids in (source, target):
        assert ids[-1] == tokenizer.eos_token_id
        assert ids.count(tokenizer.eos_token_id) == 1
        assert tokenizer.bos_token_id not in ids
    assert tokenizer("A man rides a bike.", add_special_tokens=False).input_ids == source[:-1]


def test_vocabulary_is_shared(tokenizer):
    vocab = tokenizer.get_vocab()
    assert {"▁man", "▁Mann", "▁dog", "▁Hund"} <= vocab.keys()
    for text in _lines("test_2016_flickr.en", 50) + _lines("test_2016_flickr.de", 50):
        assert tokenizer.unk_token_id not in tokenizer(text).input_ids


@pytest.mark.parametrize("split", ["test_2016_flickr.en", "test_2016_flickr.de"])
def test_round_trip_on_multi30k(tokenizer, split):
    lines = _lines(split)
    decoded = tokenizer.batch_decode(tokenizer(lines).input_ids, skip_special_tokens=True)
    assert [d for d, line in zip(decoded, lines, strict=True) if d != line] == []


def test_round_trip_korean(tokenizer):
    for text in KOREAN:
        ids = tokenizer(text).input_ids
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_decoding_after_decoder_start_token(tokenizer):
    # Generated sequences begin with <s> (decoder_start_token_id); it must not leave a leading space.
    ids = [tokenizer.bos_token_id] + tokenizer("Zwei Hunde spielen im Schnee.").input_ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Zwei Hunde spielen im Schnee."


def test_padding_is_right_with_pad_id(tokenizer):
    batch = tokenizer(["Ein Hund.", "Ein großer brauner Hund rennt über die Wiese."], padding=True)
    short, long = batch.input_ids
    assert len(short) == len(long)
    assert short[-1] == tokenizer.pad_token_id
    assert batch.attention_mask[0][-1] == 0


def test_a_model_folder_without_a_tokenizer_is_named_with_the_fix(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"no tokenizer \(tokenizer.json or tokenizer_config.json\): save"):
        load_tokenizer(tmp_path)


def test_save_and_autotokenizer_reload(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    for reloaded in (AutoTokenizer.from_pretrained(tmp_path), load_tokenizer(tmp_path)):
        lines = _lines("val.en", 20) + _lines("val.de", 20) + KOREAN
        assert reloaded(lines).input_ids == tokenizer(lines).input_ids
        assert reloaded(text_target=lines).input_ids == tokenizer(text_target=lines).input_ids
        assert reloaded.all_special_ids == tokenizer.all_special_ids
        assert (reloaded.pad_token_id, reloaded.bos_token_id, reloaded.eos_token_id) == (1, 0, 2)
        assert reloaded.model_max_length == tokenizer.model_max_length
        assert reloaded.decode(reloaded(KOREAN[0]).input_ids, skip_special_tokens=True) == KOREAN[0]


def test_accepts_files_and_generators(tmp_path):
    texts = _lines("val.en", 300) + _lines("val.de", 300)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    from_list = train_shared_bpe_tokenizer(texts, vocab_size=500, show_progress=False)
    from_file = train_shared_bpe_tokenizer(corpus, vocab_size=500, show_progress=False)
    from_generator = train_shared_bpe_tokenizer((t for t in texts), vocab_size=500, show_progress=False)
    assert from_file.get_vocab() == from_list.get_vocab() == from_generator.get_vocab()


def test_dataset_is_read_in_arrow_batches_with_the_same_vocabulary(tmp_path, monkeypatch):
    english, german = _lines("val.en", 300), _lines("val.de", 300)
    rows = {"src": [*english, "  "], "tgt": [*german, ""], "id": list(range(301))}
    datasets.Dataset.from_dict(rows).save_to_disk(tmp_path / "pairs")
    pairs = datasets.load_from_disk(tmp_path / "pairs")  # memory-mapped Arrow, as load_parallel_data gives

    def row_by_row(*args, **kwargs):
        raise AssertionError("the dataset must be read in Arrow batches, not row by row")

    monkeypatch.setattr(datasets.Dataset, "__iter__", row_by_row)
    monkeypatch.setattr(datasets.Dataset, "__getitem__", row_by_row)
    from_dataset = train_shared_bpe_tokenizer(pairs, vocab_size=500, show_progress=False)
    from_list = train_shared_bpe_tokenizer(english + german, vocab_size=500, show_progress=False)
    assert from_dataset.get_vocab() == from_list.get_vocab()
    with pytest.raises(ValueError, match="no string column"):
        train_shared_bpe_tokenizer(pairs.select_columns(["id"]), show_progress=False)


def test_empty_input_is_rejected():
    with pytest.raises(ValueError, match="No training text"):
        train_shared_bpe_tokenizer([], show_progress=False)
    with pytest.raises(ValueError, match="No training text"):
        train_shared_bpe_tokenizer(["", "   "], show_progress=False)


def test_vocab_too_small_names_the_minimum():
    # Alphabet: a, b, c and Metaspace's "▁"; plus the four special tokens.
    with pytest.raises(ValueError, match="alphabet of 4 characters.*minimum is 8"):
        train_shared_bpe_tokenizer(["abc cab", "bca abc"], vocab_size=7, show_progress=False)
    assert len(train_shared_bpe_tokenizer(["abc cab", "bca abc"], vocab_size=8, show_progress=False)) == 8


def test_bad_argument_types():
    with pytest.raises(TypeError, match="single str"):
        train_shared_bpe_tokenizer("a sentence", show_progress=False)
    with pytest.raises(TypeError, match="got int"):
        train_shared_bpe_tokenizer([1, 2], show_progress=False)
    with pytest.raises(ValueError, match="names an existing file"):
        train_shared_bpe_tokenizer([str(MULTI30K / "val.en")], show_progress=False)


def test_load_tokenizer_requires_special_tokens(tokenizer, tmp_path):
    incomplete = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, unk_token="<unk>")
    incomplete.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="pad_token is not set; eos_token is not set"):
        load_tokenizer(tmp_path)
