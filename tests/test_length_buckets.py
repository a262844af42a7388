"""Batch lengths rounded up to buckets (`training.length_buckets`): few shapes, at most one step of padding,
and the padding masked, so that a step's loss and gradients are those of the unpadded batch."""

import json

import pytest
import torch
from conftest import tiny_model
from test_trainer import reverse_task, word_tokenizer
from test_training import corpus, settings  # noqa: F401  (the corpus fixture)
from transformers import DataCollatorForSeq2Seq

from hf_vanilla_transformer.commands.train import parse_args
from hf_vanilla_transformer.training.length_buckets import (
    BUCKET_STEPS,
    LAST_STEP,
    BucketPadding,
    bucket_length,
)
from hf_vanilla_transformer.training.loss import label_smoothed_cross_entropy
from hf_vanilla_transformer.training.pipeline import run_training


def test_a_length_goes_up_to_its_bucket_and_no_further():
    steps = [step for limit, step in BUCKET_STEPS]
    for length in range(1, 700):
        bucket = bucket_length(length)
        step = next((step for limit, step in BUCKET_STEPS if length <= limit), LAST_STEP)
        assert bucket >= length and bucket % step == 0 and bucket - length < step, length
    assert steps == sorted(steps) and all(step % 8 == 0 for step in steps)
    assert len({bucket_length(length) for length in range(1, 257)}) == 8 + 4 + 4


def test_padding_up_to_the_bucket_is_masked_and_leaves_the_step_unchanged():
    tokenizer = word_tokenizer()
    # Sentences of 9 to 15 tokens: none of their lengths is a bucket.
    texts = [(f"{a} {b}", f"{b2} {a2}") for (a, a2), (b, b2) in zip(reverse_task(6, 3), reverse_task(6, 4))]
    pairs = [tokenizer(source, text_target=target) for source, target in texts]
    features = [{"input_ids": p["input_ids"], "labels": p["labels"]} for p in pairs]
    model = tiny_model(vocab_size=len(tokenizer), P_drop=0.0).train()
    plain = DataCollatorForSeq2Seq(tokenizer, model=model)
    bucketed = BucketPadding(plain, tokenizer.pad_token_id)
    results = []
    for collator in (plain, bucketed):
        batch = collator(features)
        model.zero_grad()
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=batch["decoder_input_ids"],
        ).logits
        loss = label_smoothed_cross_entropy(logits, batch["labels"], 0.1)
        loss.backward()
        results.append((batch, loss, [p.grad.clone() for p in model.parameters()]))
    (short, loss, grads), (long, bucket_loss, bucket_grads) = results
    for key, fill in (("input_ids", tokenizer.pad_token_id), ("attention_mask", 0), ("labels", -100)):
        length = short[key].shape[1]
        assert long[key].shape[1] == bucket_length(length) > length
        assert torch.equal(long[key][:, :length], short[key]) and (long[key][:, length:] == fill).all()
    torch.testing.assert_close(bucket_loss, loss)
    for grad, expected in zip(bucket_grads, grads):
        torch.testing.assert_close(grad, expected, atol=1e-6, rtol=1e-5)


def test_a_run_with_length_buckets_trains_as_one_without(corpus, tmp_path):  # noqa: F811
    """Without dropout, whose masks follow the padded shapes, and in float32: the same losses."""
    model = {"d_model": 32, "N": 1, "h": 2, "d_ff": 64, "P_drop": 0.0}
    model |= {"attention_dropout": 0.0, "activation_dropout": 0.0}
    losses = []
    for buckets in (False, True):
        out = tmp_path / f"buckets-{buckets}"
        run = dict(max_steps=3, save_steps=3, average_checkpoints=1, bf16=False, model_overrides=model)
        run_training(settings(corpus, out, length_buckets=buckets, **run))
        history = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())["log_history"]
        losses.append([entry["loss"] for entry in history if "loss" in entry])
    assert len(losses[0]) == 3
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)


def test_the_command_line_turns_buckets_and_compiling_on_and_off():
    on = parse_args(["--output-dir", "out", "--length-buckets", "--compile"]).recipe()
    assert on.length_buckets and on.compile
    off = parse_args(["--output-dir", "out", "--no-length-buckets", "--no-compile"]).recipe()
    assert not off.length_buckets and not off.compile
