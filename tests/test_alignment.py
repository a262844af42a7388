"""Word alignment from encoder-decoder attention: the Pharaoh rule on matrices whose alignment is known,
subword-to-word grouping on real sentences against the tokens' own word marks, and forced-decoding
attention against the attention generate() itself returns."""

import pytest
import torch
from conftest import REPO_ROOT, tiny_model

from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
from hf_vanilla_transformer.conversion.fairseq import tokenizer_from_fairseq_dictionary
from hf_vanilla_transformer.inference.alignment import (
    align,
    alignment_layer,
    cross_attention,
    cross_attention_heads,
    pharaoh,
    token_words,
    word_attention,
)

MULTI30K = REPO_ROOT / "data" / "multi30k"
SENTENCES = 200
MARK = "\u2581"


def lines(name: str, count: int) -> list[str]:
    return (MULTI30K / name).read_text(encoding="utf-8").splitlines()[:count]


@pytest.fixture(scope="module")
def tokenizer():
    """A real shared BPE vocabulary, small enough (300) that most words are several subwords; learned on
    the sentences the tests split too, so that every character is known."""
    texts = lines("train.en", 2000) + lines("train.de", 2000)
    texts += lines("test_2016_flickr.en", SENTENCES) + lines("test_2016_flickr.de", SENTENCES)
    return train_shared_bpe_tokenizer(texts, vocab_size=300, show_progress=False)


def words_by_marks(tokenizer, ids: list[int]) -> list[list[int]]:
    """Token positions of each word, read off the SentencePiece marks: a word starts at a token that
    begins with "▁"; special tokens belong to no word."""
    groups: list[list[int]] = []
    for position, token in enumerate(tokenizer.convert_ids_to_tokens(ids)):
        if token in tokenizer.all_special_tokens:
            continue
        if token.startswith(MARK) or not groups:
            groups.append([])
        groups[-1].append(position)
    return groups


def test_pharaoh_links_each_target_word_to_its_largest_source_weight():
    # Rows are target words, columns source words; the largest weight of each row, worked out by hand.
    weights = torch.tensor([[0.1, 0.9, 0.0], [0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.0, 0.1, 0.9]])
    assert pharaoh(weights) == "0-1 1-0 1-2 2-3"


def test_pharaoh_recovers_a_known_alignment_under_noise():
    generator = torch.Generator().manual_seed(0)
    sources, targets = 9, 12
    truth = torch.randint(0, sources, (targets,), generator=generator).tolist()
    weights = torch.rand(targets, sources, generator=generator) * 0.5
    for j, i in enumerate(truth):
        weights[j, i] = 0.6
    expected = " ".join(f"{i}-{j}" for i, j in sorted((i, j) for j, i in enumerate(truth)))
    assert pharaoh(weights / weights.sum(dim=1, keepdim=True)) == expected
    assert pharaoh(torch.zeros(3, 0)) == ""


def test_token_words_are_the_whitespace_words_of_real_sentences(tokenizer):
    for text in lines("test_2016_flickr.en", SENTENCES) + lines("test_2016_flickr.de", SENTENCES):
        ids = tokenizer(text)["input_ids"]
        words, owners = token_words(tokenizer, ids)
        assert words == text.split()
        groups = words_by_marks(tokenizer, ids)
        assert len(groups) == len(words)
        for word, positions in enumerate(groups):
            assert [k for k, owner in enumerate(owners) if owner == (word,)] == positions
            assert tokenizer.decode([ids[k] for k in positions]) == words[word]
        assert owners[-1] == ()  # </s>


def test_token_words_of_generated_outputs_skip_start_end_and_padding(tokenizer):
    text = "Zwei Männer stehen am Strand."
    body = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = [tokenizer.bos_token_id, *body, tokenizer.eos_token_id, tokenizer.pad_token_id]
    words, owners = token_words(tokenizer, ids)
    assert words == text.split()
    assert owners[0] == owners[-2] == owners[-1] == ()
    assert [owner for owner in owners[1:-2]] == [
        (word,) for word, positions in enumerate(words_by_marks(tokenizer, body)) for _ in positions
    ]


def test_token_words_give_whitespace_only_and_unknown_tokens_to_the_next_word(tokenizer):
    # A lone "▁" (double space) and <unk> (a character the vocabulary lacks) spell no character of a word.
    space, unk = tokenizer.convert_tokens_to_ids(MARK), tokenizer.unk_token_id
    assert space != unk
    first = tokenizer("Zwei", add_special_tokens=False)["input_ids"]
    second = tokenizer("Hunde", add_special_tokens=False)["input_ids"]
    ids = [*first, space, unk, *second, tokenizer.eos_token_id]
    words, owners = token_words(tokenizer, ids)
    assert words == ["Zwei", "Hunde"]
    assert owners == [(0,)] * len(first) + [(1,), (1,)] + [(1,)] * len(second) + [()]


def test_token_words_of_a_subword_nmt_target_vocabulary():
    # A converted fairseq model's target tokenizer: "@@" marks a piece that the next one continues.
    target = tokenizer_from_fairseq_dictionary(
        ["<s>", "<pad>", "</s>", "<unk>", "Hun@@", "de", "lau@@", "f@@", "en"]
    )
    pieces = ["Hun@@", "de", "lau@@", "f@@", "en"]
    ids = [*target.convert_tokens_to_ids(pieces), target.eos_token_id]
    words, owners = token_words(target, ids)
    assert words == ["Hunde", "laufen"]
    assert owners == [(0,), (0,), (1,), (1,), (1,), ()]


def test_word_attention_sums_source_subwords_and_averages_target_subwords(tokenizer):
    source_text, target_text = (
        "A black dog runs through tall grass.",
        "Ein schwarzer Hund rennt durch hohes Gras.",
    )
    source_ids = tokenizer(source_text)["input_ids"]
    target_ids = tokenizer(target_text)["input_ids"]
    generator = torch.Generator().manual_seed(1)
    # Extra rows and columns stand for batch padding, which word_attention must cut off.
    attention = torch.softmax(
        torch.randn(len(target_ids) + 2, len(source_ids) + 3, generator=generator), dim=-1
    )

    source_words, target_words, weights = word_attention(
        attention, source_ids, target_ids, tokenizer, target_tokenizer=tokenizer
    )
    assert source_words == source_text.split() and target_words == target_text.split()
    source_groups, target_groups = (
        words_by_marks(tokenizer, source_ids),
        words_by_marks(tokenizer, target_ids),
    )
    expected = torch.zeros(len(target_groups), len(source_groups))
    for j, rows in enumerate(target_groups):
        for i, columns in enumerate(source_groups):
            expected[j, i] = sum(float(attention[t, s]) for t in rows for s in columns) / len(rows)
    expected /= expected.sum(dim=1, keepdim=True)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(weights.sum(dim=1), torch.ones(len(target_words)))
    # Leading dimensions (layers, heads) are kept, each slice computed as alone.
    stacked = word_attention(torch.stack([attention, attention.flip(-1)]), source_ids, target_ids, tokenizer)[
        2
    ]
    torch.testing.assert_close(stacked[0], weights)
    torch.testing.assert_close(
        stacked[1], word_attention(attention.flip(-1), source_ids, target_ids, tokenizer)[2]
    )


def test_word_attention_rows_with_all_weight_on_the_end_token_become_uniform(tokenizer):
    source_ids = tokenizer("Two dogs")["input_ids"]
    target_ids = tokenizer("Zwei")["input_ids"]
    attention = torch.zeros(len(target_ids), len(source_ids))
    attention[:, -1] = 1.0  # everything on </s>
    _, _, weights = word_attention(attention, source_ids, target_ids, tokenizer)
    torch.testing.assert_close(weights, torch.full((1, 2), 0.5))


def test_forced_decoding_attention_is_the_attention_generate_returns():
    eager = tiny_model(attn_implementation="eager")
    sdpa = tiny_model(attn_implementation="sdpa")  # same seed, same weights
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10, 2], [11, 12, 13, 2, 1, 1, 1]])
    attention_mask = (input_ids != eager.config.pad_token_id).long()
    generated = eager.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        num_beams=1,
        do_sample=False,
        max_new_tokens=8,
        output_attentions=True,
        return_dict_in_generate=True,
    )
    # generate() gives, per step, per layer, [batch, heads, 1, source]: the step's row.
    layers = range(eager.config.decoder_layers)
    expected = torch.stack(
        [torch.cat([step[layer] for step in generated.cross_attentions], dim=2) for layer in layers]
    )
    forced = cross_attention_heads(sdpa, input_ids, attention_mask, generated.sequences, list(layers))
    assert forced.shape == expected.shape
    torch.testing.assert_close(forced, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(
        cross_attention(sdpa, input_ids, attention_mask, generated.sequences), expected[-1].mean(dim=1)
    )
    assert forced[:, 1, :, :, 4:].abs().max() == 0  # padded source positions


def test_align_gives_one_alignment_per_pair_with_the_words_of_both_sides(tokenizer):
    model = tiny_model(vocab_size=len(tokenizer))
    sources = ["A dog runs.", "Two men sit on a bench."]
    source_ids = [tokenizer(text)["input_ids"] for text in sources]
    start = model.config.decoder_start_token_id
    outputs = ["Ein Hund rennt.", "Zwei Männer sitzen.", "Zwei Männer sitzen auf einer Bank."]
    sequences = [[start, *tokenizer(text)["input_ids"]] for text in outputs]
    pairs = [source_ids[0], source_ids[1], source_ids[1]]  # an n-best list of two for the second input
    results = align(model, tokenizer, pairs, sequences, batch_size=2)
    for result, source, output, ids, sequence in zip(
        results, [sources[0], *sources[1:] * 2], outputs, pairs, sequences
    ):
        assert result.source_words == source.split() and result.target_words == output.split()
        weights = torch.tensor(result.attention)
        torch.testing.assert_close(weights.sum(dim=1), torch.ones(len(result.target_words)))
        assert result.alignment == pharaoh(weights)
        inputs = torch.tensor([ids])
        single = cross_attention(model, inputs, torch.ones_like(inputs), torch.tensor([sequence]))[0]
        torch.testing.assert_close(weights, word_attention(single, ids, sequence[1:], tokenizer)[2])


def test_bad_requests_are_refused_with_what_to_do():
    model = tiny_model()
    input_ids = torch.tensor([[5, 6, 2]])
    with pytest.raises(ValueError, match="start with the decoder start token"):
        cross_attention(model, input_ids, None, torch.tensor([[7, 8, 2]]))
    with pytest.raises(ValueError, match="layer 5 does not exist"):
        cross_attention(model, input_ids, None, torch.tensor([[0, 8, 2]]), layer=5)
    with pytest.raises(ValueError, match="no encoder-decoder attention"):
        alignment_layer(0)
    with pytest.raises(ValueError, match="one input per output"):
        align(model, None, [[5, 2]], [])
