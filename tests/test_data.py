"""Reading and tokenizing parallel data (Section 5.1)."""

import gzip
import json
import os
import subprocess
import sys
import textwrap

import datasets
import pyarrow as pa
import pytest
import torch
from conftest import REPO_ROOT, free_port
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast

from hf_vanilla_transformer.training import data
from hf_vanilla_transformer.training.data import (
    load_hub_pairs,
    load_parallel_data,
    read_jsonl,
    read_text_pair,
    read_tsv,
    tokenize_pairs,
    validate_language_code,
)

SENTENCES = [
    "a cat sat on the mat",
    "the dog ran to the house",
    "eine katze sass auf der matte",
    "der hund lief zum haus",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer with the package's special tokens; its post-processor appends </s>."""
    model = Tokenizer(models.WordLevel(unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    model.train_from_iterator(
        SENTENCES, trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<s>", "</s>"])
    )
    model.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 3)])
    return PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """Each test converts its files into a cache of its own, not the user's HF_DATASETS_CACHE."""
    cache = tmp_path / "hf_datasets_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    return cache


def write(path, text):
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode("utf-8")))
    else:
        path.write_text(text, encoding="utf-8", newline="")
    return path


def test_text_pair_keeps_unicode_separators_and_strips_crlf_and_bom(tmp_path):
    src = write(tmp_path / "train.en", "\ufeffone\u2028still one\r\ntwo\n")
    tgt = write(tmp_path / "train.de", "eins\r\nzwei\n")
    dataset = read_text_pair(src, tgt)
    assert dataset.column_names == ["src", "tgt"]
    assert dataset["src"] == ["one\u2028still one", "two"]
    assert dataset["tgt"] == ["eins", "zwei"]


def test_empty_lines_are_dropped_with_a_count(tmp_path, capsys):
    src = write(tmp_path / "a.en", "one\n\nthree\nfour\n")
    tgt = write(tmp_path / "a.de", "eins\nzwei\n   \nvier\n")
    dataset = read_text_pair(src, tgt)
    assert dataset["src"] == ["one", "four"]
    assert "Dropped 2 of 4 pairs" in capsys.readouterr().err


def test_mismatched_line_counts_name_both(tmp_path):
    src = write(tmp_path / "a.en", "one\ntwo\nthree\n")
    tgt = write(tmp_path / "a.de", "eins\nzwei\n")
    with pytest.raises(ValueError, match=r"a\.en has 3 lines but .*a\.de has 2"):
        read_text_pair(src, tgt)


def test_missing_and_empty_files(tmp_path):
    tgt = write(tmp_path / "a.de", "eins\n")
    with pytest.raises(FileNotFoundError, match=r"missing\.en does not exist"):
        read_text_pair(tmp_path / "missing.en", tgt)
    with pytest.raises(ValueError, match=r"empty\.en is empty"):
        read_text_pair(write(tmp_path / "empty.en", ""), tgt)
    with pytest.raises(ValueError, match="no sentence pair with both sides non-empty"):
        read_text_pair(write(tmp_path / "blank.en", "\n"), tgt)
    with pytest.raises(ValueError, match="line 2: not valid UTF-8"):
        (tmp_path / "latin1.en").write_bytes(b"ok\n\xe9t\xe9\n")
        read_text_pair(tmp_path / "latin1.en", write(tmp_path / "b.de", "x\ny\n"))


def test_tsv(tmp_path, capsys):
    path = write(tmp_path / "pairs.tsv", "hello\thallo\n\t\nbye\ttschüss\n")
    dataset = read_tsv(path)
    assert list(zip(dataset["src"], dataset["tgt"], strict=True)) == [("hello", "hallo"), ("bye", "tschüss")]
    assert "Dropped 1 of 3" in capsys.readouterr().err
    with pytest.raises(ValueError, match="line 2: expected 2 tab-separated fields .* found 3"):
        read_tsv(write(tmp_path / "bad.tsv", "a\tb\na\tb\tc\n"))


def test_jsonl_with_keys_and_translation_layout(tmp_path):
    plain = write(
        tmp_path / "plain.jsonl", '{"en": "hello", "de": "hallo"}\n\n{"en": "bye", "de": "tschüss"}\n'
    )
    dataset = read_jsonl(plain, src_key="en", tgt_key="de")
    assert dataset["src"] == ["hello", "bye"] and dataset["tgt"] == ["hallo", "tschüss"]

    rows = [{"translation": {"de": "hallo", "en": "hello"}}, {"translation": {"de": "ja", "en": "yes"}}]
    nested = write(tmp_path / "wmt.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    dataset = read_jsonl(nested, src_lang="en", tgt_lang="de")
    assert dataset["src"] == ["hello", "yes"] and dataset["tgt"] == ["hallo", "ja"]
    with pytest.raises(ValueError, match=r"line 1: no language 'fr'; available: \['de', 'en'\]"):
        read_jsonl(nested, src_lang="en", tgt_lang="fr")


def test_jsonl_errors(tmp_path):
    with pytest.raises(ValueError, match="line 2: invalid JSON"):
        read_jsonl(write(tmp_path / "a.jsonl", '{"src": "a", "tgt": "b"}\n{"src": \n'))
    with pytest.raises(ValueError, match=r"line 1: no key 'tgt'; available: \['source', 'src'\]"):
        read_jsonl(write(tmp_path / "b.jsonl", '{"src": "a", "source": "b"}\n'))
    with pytest.raises(ValueError, match="line 1: expected a JSON object, found list"):
        read_jsonl(write(tmp_path / "c.jsonl", '["a", "b"]\n'))
    with pytest.raises(ValueError, match="key 'tgt' holds int, not a string"):
        read_jsonl(write(tmp_path / "d.jsonl", '{"src": "a", "tgt": 3}\n'))
    with pytest.raises(ValueError, match="Invalid language code 'e n'"):
        read_jsonl(write(tmp_path / "e.jsonl", '{"src": "a", "tgt": "b"}\n'), src_lang="e n", tgt_lang="de")


@pytest.mark.parametrize("code", ["en", "de", "haw", "pt_BR", "eng_Latn", "zh-Hans", "zho_Hant", "EN"])
def test_valid_language_codes(code):
    assert validate_language_code(code) == code


@pytest.mark.parametrize("code", ["", "de ", "e n", "en.gz", "../en", "a/b", "-en", "en_", "pt__BR", None])
def test_invalid_language_codes(code):
    with pytest.raises(ValueError, match="Invalid language code"):
        validate_language_code(code)


def test_load_parallel_data_dispatch(tmp_path):
    write(tmp_path / "train.en", "hello\nbye\n")
    write(tmp_path / "train.de", "hallo\ntschüss\n")
    by_prefix = load_parallel_data(tmp_path / "train", src_lang="en", tgt_lang="de")
    assert by_prefix["src"] == ["hello", "bye"] and by_prefix["tgt"] == ["hallo", "tschüss"]
    reverse = load_parallel_data(tmp_path / "train.de", tmp_path / "train.en")
    assert reverse["src"] == ["hallo", "tschüss"]
    tsv = load_parallel_data(write(tmp_path / "p.tsv", "a\tb\n"))
    assert tsv["tgt"] == ["b"]
    jsonl = load_parallel_data(
        write(tmp_path / "p.jsonl", '{"x": "a", "y": "b"}\n'), src_key="x", tgt_key="y"
    )
    assert jsonl["src"] == ["a"]

    with pytest.raises(ValueError, match="neither .tsv nor .jsonl"):
        load_parallel_data(tmp_path / "train.en")
    with pytest.raises(FileNotFoundError, match=r"train\.fr does not exist"):
        load_parallel_data(tmp_path / "train", src_lang="en", tgt_lang="fr")
    with pytest.raises(FileNotFoundError, match="is not a file"):
        load_parallel_data(tmp_path / "nothing", src_lang="en", tgt_lang="de")
    with pytest.raises(ValueError, match="Invalid language code 'en/x'"):
        load_parallel_data(tmp_path / "train", src_lang="en/x", tgt_lang="de")


def test_gzip_files_read_like_plain_ones(tmp_path):
    english, german = "hello\n\nbye\n", "hallo\nleer\ntschüss\n"
    expected = {"src": ["hello", "bye"], "tgt": ["hallo", "tschüss"]}
    write(tmp_path / "train.en.gz", english)
    write(tmp_path / "train.de", german)  # one side compressed, the other not
    assert load_parallel_data(tmp_path / "train", src_lang="en", tgt_lang="de").to_dict() == expected
    two_files = load_parallel_data(tmp_path / "train.en.gz", write(tmp_path / "b.de.gz", german))
    assert two_files.to_dict() == expected
    tsv = write(tmp_path / "pairs.tsv.gz", "hello\thallo\n\tleer\nbye\ttschüss\n")
    assert load_parallel_data(tsv).to_dict() == expected
    jsonl = write(
        tmp_path / "pairs.jsonl.gz", '{"src": "hello", "tgt": "hallo"}\n{"src": "bye", "tgt": "tschüss"}\n'
    )
    assert load_parallel_data(jsonl).to_dict() == expected
    with pytest.raises(ValueError, match=r"empty\.en\.gz is empty"):
        read_text_pair(write(tmp_path / "empty.en.gz", ""), tmp_path / "train.de")
    with pytest.raises(ValueError, match="line 3: expected 2 tab-separated fields"):
        read_tsv(write(tmp_path / "bad.tsv.gz", "a\tb\nc\td\ne\n"))


def test_flores_style_language_codes(tmp_path):
    write(tmp_path / "dev.eng_Latn", "hello\n")
    write(tmp_path / "dev.zh-Hans", "你好\n")
    dataset = load_parallel_data(tmp_path / "dev", src_lang="eng_Latn", tgt_lang="zh-Hans")
    assert dataset.to_dict() == {"src": ["hello"], "tgt": ["你好"]}
    rows = write(
        tmp_path / "flores.jsonl", json.dumps({"translation": {"eng_Latn": "hi", "deu_Latn": "hallo"}})
    )
    assert read_jsonl(rows, src_lang="eng_Latn", tgt_lang="deu_Latn")["tgt"] == ["hallo"]


def test_files_are_converted_once_into_a_memory_mapped_cache(tmp_path, datasets_cache, monkeypatch, capsys):
    src = write(tmp_path / "a.en", "one\n\nthree\n")
    tgt = write(tmp_path / "a.de", "eins\nzwei\ndrei\n")
    first = read_text_pair(src, tgt)
    [cache_file] = first.cache_files
    assert cache_file["filename"].startswith(str(datasets_cache / "parallel_pairs"))
    assert "Dropped 1 of 3 pairs" in capsys.readouterr().err

    def no_reading(path):
        raise AssertionError(f"{path} was read again")

    monkeypatch.setattr(data, "_read_lines", no_reading)
    again = read_text_pair(src, tgt)
    assert again.cache_files == first.cache_files
    assert again.to_dict() == {"src": ["one", "three"], "tgt": ["eins", "drei"]}
    assert "Dropped 1 of 3 pairs" in capsys.readouterr().err, "the count is reported from the cache too"
    monkeypatch.undo()
    # A changed file (size, modification time) is read again, into a cache of its own.
    write(src, "one\ntwo\nthree\n")
    changed = read_text_pair(src, tgt)
    assert changed["src"] == ["one", "two", "three"] and changed.cache_files != first.cache_files
    own = read_text_pair(src, tgt, cache_dir=tmp_path / "own")
    assert own.cache_files[0]["filename"].startswith(str(tmp_path / "own"))
    assert list((datasets_cache / "parallel_pairs").glob("*incomplete*")) == []


def test_reads_shipped_multi30k():
    dataset = load_parallel_data(REPO_ROOT / "data" / "multi30k" / "val", src_lang="en", tgt_lang="de")
    assert len(dataset) == 1014
    assert dataset[0]["src"].startswith("A group of men")


def test_hub_languages_are_checked_before_download(monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("load_dataset must not be called")

    monkeypatch.setattr(data.datasets, "load_dataset", no_download)
    with pytest.raises(
        ValueError, match=r"Language 'fr' is not part of wmt14 config 'de-en' \(languages: de, en\)"
    ):
        load_hub_pairs("wmt14", "de-en", src_lang="en", tgt_lang="fr")
    with pytest.raises(ValueError, match="both 'en'"):
        load_hub_pairs("wmt14", "de-en", src_lang="en", tgt_lang="en")
    with pytest.raises(ValueError, match="needs both src_lang and tgt_lang"):
        load_parallel_data("wmt14", config="de-en", src_lang="en")


def test_hub_translation_column_is_flattened(monkeypatch, capsys):
    features = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})
    rows = {
        "translation": [{"de": "hallo", "en": "hello"}, {"de": "", "en": "empty"}, {"de": "ja", "en": "yes"}]
    }
    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_dict(rows, features=features)

    monkeypatch.setattr(data.datasets, "load_dataset", fake_load_dataset)
    dataset = load_parallel_data("wmt14", config="de-en", src_lang="en", tgt_lang="de", split="validation")
    assert calls == [("wmt14", "de-en", "validation")]
    assert dataset.column_names == ["src", "tgt"]
    assert dataset["src"] == ["hello", "yes"] and dataset["tgt"] == ["hallo", "ja"]
    assert "Dropped 1 of 3 pairs from wmt14" in capsys.readouterr().err


def test_hub_offline_error_says_what_to_do(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wmt14' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(data.datasets, "load_dataset", offline)
    with pytest.raises(ConnectionError, match="pass local files"):
        load_hub_pairs("wmt14", "de-en", src_lang="en", tgt_lang="de")


def pairs(*rows):
    return datasets.Dataset.from_dict({"src": [r[0] for r in rows], "tgt": [r[1] for r in rows]})


def write_three_pairs(prefix):
    """PREFIX.en / PREFIX.de: three pairs, of which the first's source is 7 tokens with </s>."""
    write(prefix.with_suffix(".en"), "a cat sat on the mat\nthe dog ran\na cat\n")
    write(prefix.with_suffix(".de"), "eine katze sass\nder hund lief zum haus\nkatze\n")


def test_tokenization_is_cached_in_int32_and_collates_to_int64(tokenizer, tmp_path):
    write_three_pairs(tmp_path / "t")
    text = load_parallel_data(tmp_path / "t", src_lang="en", tgt_lang="de")
    tokenized = tokenize_pairs(text, tokenizer, 6, 6)
    [cache_file] = tokenized.cache_files
    written = os.stat(cache_file["filename"]).st_mtime_ns
    assert os.path.dirname(cache_file["filename"]) == os.path.dirname(text.cache_files[0]["filename"])
    assert tokenized.data.schema.field("input_ids").type == pa.list_(pa.int32())
    assert tokenized.data.schema.field("labels").type == pa.list_(pa.int32())
    assert tokenized.data.schema.field("attention_mask").type == pa.list_(pa.int8())
    assert len(tokenized) == 2, "the 7-token source is filtered out"

    again = tokenize_pairs(text, tokenizer, 6, 6)
    assert again.cache_files == tokenized.cache_files
    assert os.stat(cache_file["filename"]).st_mtime_ns == written, "the cache is read, not written again"

    batch = DataCollatorForSeq2Seq(tokenizer)([tokenized[0], tokenized[1]])
    assert {name: batch[name].dtype for name in ("input_ids", "attention_mask", "labels")} == dict.fromkeys(
        ("input_ids", "attention_mask", "labels"), torch.int64
    )
    assert batch["labels"][1].tolist()[-1] == -100, "shorter labels are padded with the ignored index"


def test_tokenizing_in_two_processes_gives_the_one_process_result(tokenizer, tmp_path, datasets_cache):
    """`num_proc=2` writes one cache file per process, and together they hold what one process writes.

    map() forks its pool from the calling process. A command forks from a fresh interpreter, so the two
    processes are asked for there: a fork of this test process inherits the threads and locks that earlier
    tests left in it, and can wait for ever on one of them."""
    write_three_pairs(tmp_path / "t")
    in_one_process = tokenize_pairs(
        load_parallel_data(tmp_path / "t", src_lang="en", tgt_lang="de"), tokenizer, 6, 6
    )
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    script = textwrap.dedent(
        f"""
        import json
        import datasets
        from transformers import PreTrainedTokenizerFast
        from hf_vanilla_transformer.training.data import load_parallel_data, tokenize_pairs

        datasets.config.HF_DATASETS_CACHE = {str(datasets_cache)!r}
        tokenizer = PreTrainedTokenizerFast.from_pretrained({str(tmp_path / "tokenizer")!r})
        # A cache of its own: map() would otherwise find the one-process result, whatever num_proc.
        text = load_parallel_data({str(tmp_path / "t")!r}, src_lang="en", tgt_lang="de",
                                  cache_dir={str(tmp_path / "two")!r})
        tokenized = tokenize_pairs(text, tokenizer, 6, 6, num_proc=2)
        print(json.dumps({{"files": len(tokenized.cache_files), "rows": tokenized.to_dict()}}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    in_two_processes = json.loads(done.stdout.strip().splitlines()[-1])
    assert in_two_processes["files"] == 2, "one file per process"
    assert in_two_processes["rows"] == in_one_process.to_dict()


@pytest.mark.slow
def test_two_processes_prepare_once_and_share_the_result(tmp_path):
    """Under torch.distributed (gloo), rank 0 reads and tokenizes; rank 1 waits, then loads the cache."""
    write(tmp_path / "t.en", "a cat sat\nthe dog ran\n")
    write(tmp_path / "t.de", "eine katze\nder hund\n")
    script = tmp_path / "prepare.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            import datasets
            from accelerate import PartialState
            from tokenizers import Tokenizer, models, pre_tokenizers
            from transformers import PreTrainedTokenizerFast
            from hf_vanilla_transformer.training import data

            datasets.config.HF_DATASETS_CACHE = {str(tmp_path / "cache")!r}
            state = PartialState(cpu=True)
            read = []
            original = data._read_lines
            data._read_lines = lambda path: read.append(str(path)) or original(path)
            model = Tokenizer(models.WordLevel({{"<unk>": 0, "<pad>": 1}}, unk_token="<unk>"))
            model.pre_tokenizer = pre_tokenizers.Whitespace()
            tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>", unk_token="<unk>")
            text = data.load_parallel_data({str(tmp_path / "t")!r}, src_lang="en", tgt_lang="de")
            tokenized = data.tokenize_pairs(text, tokenizer, 8, 8)
            print(json.dumps({{"rank": state.process_index, "read": len(read),
                               "files": [f["filename"] for f in tokenized.cache_files],
                               "rows": tokenized.to_dict()}}))
            """
        )
    )
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    processes = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env=dict(base, RANK=str(rank), LOCAL_RANK=str(rank)),
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = [
        json.loads(process.communicate(timeout=300)[0].strip().splitlines()[-1]) for process in processes
    ]
    assert [process.returncode for process in processes] == [0, 0]
    assert [result["read"] for result in results] == [2, 0], "only the main process reads the files"
    assert results[0]["files"] == results[1]["files"] and results[0]["rows"] == results[1]["rows"]


def test_tokenize_pairs_appends_eos(tokenizer):
    tokenized = tokenize_pairs(pairs(("a cat sat", "eine katze")), tokenizer, 16, 16)
    assert sorted(tokenized.column_names) == ["attention_mask", "input_ids", "labels"]
    row = tokenized[0]
    assert row["input_ids"] == tokenizer.convert_tokens_to_ids(["a", "cat", "sat"]) + [3]
    assert row["attention_mask"] == [1, 1, 1, 1]
    assert row["labels"] == tokenizer.convert_tokens_to_ids(["eine", "katze"]) + [3]


def test_long_pairs_are_filtered_with_a_count(tokenizer, capsys):
    dataset = pairs(
        ("a cat", "eine katze"), ("a cat sat on the mat", "eine katze"), ("a", "der hund lief zum haus")
    )
    tokenized = tokenize_pairs(dataset, tokenizer, max_source_length=4, max_target_length=4)
    assert len(tokenized) == 1
    assert tokenized[0]["input_ids"] == tokenizer("a cat")["input_ids"]
    assert "Filtered out 2 of 3 pairs longer than 4 source / 4 target tokens" in capsys.readouterr().err


def test_long_pairs_are_truncated_with_a_count(tokenizer, capsys):
    dataset = pairs(("a cat", "eine katze"), ("a cat sat on the mat", "der hund lief zum haus"))
    tokenized = tokenize_pairs(
        dataset, tokenizer, max_source_length=4, max_target_length=3, long_pairs="truncate"
    )
    assert len(tokenized) == 2
    assert tokenized[0]["input_ids"] == tokenizer("a cat")["input_ids"]
    long_row = tokenized[1]
    assert long_row["input_ids"] == tokenizer.convert_tokens_to_ids(["a", "cat", "sat"]) + [3]
    assert long_row["labels"] == tokenizer.convert_tokens_to_ids(["der", "hund"]) + [3]
    assert len(long_row["attention_mask"]) == 4
    assert "Truncated 1 of 2 pairs longer than 4 source / 3 target tokens" in capsys.readouterr().err


def test_tokenize_pairs_errors(tokenizer):
    dataset = pairs(("a cat sat", "eine katze"))
    with pytest.raises(ValueError, match="long_pairs must be 'filter' or 'truncate'"):
        tokenize_pairs(dataset, tokenizer, 8, 8, long_pairs="drop")
    with pytest.raises(ValueError, match="must be positive"):
        tokenize_pairs(dataset, tokenizer, 0, 8)
    with pytest.raises(ValueError, match="Every pair is longer than 2 source / 8 target tokens"):
        tokenize_pairs(dataset, tokenizer, 2, 8)
    renamed = dataset.rename_column("src", "source")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['src'\]"):
        tokenize_pairs(renamed, tokenizer, 8, 8)
