"""The training loss of Section 5.4 (`hf_vanilla_transformer.training.loss`): label smoothing against the
formula computed by hand and against torch's `cross_entropy(label_smoothing=...)`, the chunked CPU
implementation against torch's (losses, gradients, double backward), and the Trainer that trains with it
against the model's own cross-entropy and against transformers' `label_smoothing_factor`."""

import pytest
import torch
from conftest import grad_fn_names, tiny_model
from datasets import Dataset
from torch import nn
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

from hf_vanilla_transformer.training import loss as training_loss
from hf_vanilla_transformer.training.loss import (
    LabelSmoothedLoss,
    LabelSmoothedSeq2SeqTrainer,
    label_smoothed_cross_entropy,
)

BOS, PAD, EOS = 0, 1, 2


@pytest.mark.parametrize("requires_grad", [False, True], ids=["torch's cross_entropy", "chunked on a CPU"])
def test_label_smoothed_loss_equals_hand_computation(requires_grad):
    """Both implementations of Section 5.4's loss, torch's `cross_entropy` (GPUs, evaluation, compiled) and
    the chunked loss (CPU training), against the formula computed by hand."""
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=requires_grad)
    labels = torch.randint(0, 11, (2, 5))
    labels[1, 3:] = -100
    eps = 0.1
    total, count = 0.0, 0
    for b in range(2):
        for t in range(5):
            y = labels[b, t].item()
            if y == -100:
                continue
            log_p = torch.log_softmax(logits[b, t].double(), dim=-1)
            smoothed = torch.full((11,), eps / 11, dtype=torch.float64)
            smoothed[y] += 1 - eps
            total += -(smoothed * log_p).sum().item()
            count += 1
    assert label_smoothed_cross_entropy(logits, labels, eps).item() == pytest.approx(total / count, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_and_gradient_equal_torch_cross_entropy(monkeypatch, dtype):
    vocab = 50
    # 3 rows per chunk: 10 positions make chunks of 3, 3, 3 and 1, with ignored positions across a boundary.
    monkeypatch.setitem(training_loss._CROSS_ENTROPY_CHUNK_BYTES, "cpu", 3 * 4 * vocab)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, vocab, generator=generator).to(dtype).requires_grad_()
    assert training_loss._chunk_rows(logits) == 3
    labels = torch.randint(0, vocab, (2, 5), generator=generator)
    labels[0, 2:4] = -100
    loss = label_smoothed_cross_entropy(logits, labels, 0.1)
    assert "_SmoothedCrossEntropySumBackward" in grad_fn_names(loss)
    loss.backward()
    reference_logits = logits.detach().float().requires_grad_()
    reference = nn.functional.cross_entropy(
        reference_logits.view(-1, vocab), labels.view(-1), ignore_index=-100, label_smoothing=0.1
    )
    reference.backward()
    torch.testing.assert_close(loss, reference)
    assert logits.grad.dtype == dtype
    torch.testing.assert_close(logits.grad, reference_logits.grad.to(dtype))
    assert (logits.grad[0, 2:4] == 0).all()


def test_chunked_loss_of_a_batch_without_labels_leaves_zero_gradients_like_torch():
    """All positions -100: the mean is 0 / 0 (NaN) in both, but no gradient may carry the NaN into the
    weights: torch's cross_entropy gives every unlabelled position a zero gradient."""
    logits = torch.randn(2, 3, 11, requires_grad=True)
    labels = torch.full((2, 3), -100)
    loss = label_smoothed_cross_entropy(logits, labels, 0.1)
    assert "_SmoothedCrossEntropySumBackward" in grad_fn_names(loss)
    loss.backward()
    reference_logits = logits.detach().clone().requires_grad_()
    reference = nn.functional.cross_entropy(
        reference_logits.view(-1, 11), labels.view(-1), ignore_index=-100, label_smoothing=0.1
    )
    reference.backward()
    assert loss.isnan() and reference.isnan()
    assert torch.equal(reference_logits.grad, torch.zeros_like(logits))
    assert torch.equal(logits.grad, torch.zeros_like(logits))


@pytest.mark.parametrize("label", [-1, -101, 50])
def test_chunked_loss_refuses_labels_that_cross_entropy_refuses(label):
    logits = torch.randn(4, 50, requires_grad=True)
    labels = torch.tensor([1, 2, label, -100])
    with pytest.raises(IndexError):
        nn.functional.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1)
    with pytest.raises(IndexError, match=f"Label {label} is out of bounds"):
        training_loss.chunked_label_smoothed_cross_entropy_sum(logits, labels, 0.1)


def test_chunked_loss_double_backward_and_torch_func_equal_torch_cross_entropy():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 11, generator=generator, requires_grad=True)
    labels = torch.tensor([1, 2, -100, 4, 5, 6])

    def reference(z: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(z, labels, ignore_index=-100, label_smoothing=0.1)

    (grad,) = torch.autograd.grad(
        label_smoothed_cross_entropy(logits, labels, 0.1), logits, create_graph=True
    )
    (grad_ref,) = torch.autograd.grad(reference(logits), logits, create_graph=True)
    torch.testing.assert_close(grad, grad_ref)
    (second,) = torch.autograd.grad(grad.square().sum(), logits)
    (second_ref,) = torch.autograd.grad(grad_ref.square().sum(), logits)
    torch.testing.assert_close(second, second_ref)
    func_grad = torch.func.grad(lambda z: label_smoothed_cross_entropy(z, labels, 0.1))(logits.detach())
    torch.testing.assert_close(func_grad, torch.func.grad(reference)(logits.detach()))


def test_label_smoothed_loss_smooths_in_training_and_is_the_models_loss_in_evaluation():
    model = tiny_model()
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, 64, (3, 6), generator=generator)
    labels = torch.randint(4, 64, (3, 5), generator=generator)
    labels[2, 3:] = -100
    smoothed = LabelSmoothedLoss(model, 0.1)
    with torch.no_grad():
        model.eval()
        out = model(input_ids=src, labels=labels)
        torch.testing.assert_close(smoothed(out, labels), out.loss)
        model.train()
        torch.manual_seed(0)
        out = model(input_ids=src, labels=labels)
    expected = nn.functional.cross_entropy(
        out.logits.view(-1, out.logits.shape[-1]), labels.view(-1), ignore_index=-100, label_smoothing=0.1
    )
    torch.testing.assert_close(smoothed(out, labels), expected)


def _pairs(count: int = 8) -> Dataset:
    generator = torch.Generator().manual_seed(2)
    rows = []
    for i in range(count):
        rows.append(
            {
                "input_ids": torch.randint(4, 64, (3 + i % 4,), generator=generator).tolist() + [EOS],
                "labels": torch.randint(4, 64, (2 + i % 3,), generator=generator).tolist() + [EOS],
            }
        )
    return Dataset.from_list(rows)


class _Tokenizer:
    """What DataCollatorForSeq2Seq reads of a tokenizer to pad the pairs."""

    pad_token_id = PAD
    padding_side = "right"
    model_input_names = ["input_ids", "attention_mask"]

    def pad(self, features, padding=True, max_length=None, pad_to_multiple_of=None, return_tensors="pt"):
        width = max(len(f["input_ids"]) for f in features)
        ids = [f["input_ids"] + [PAD] * (width - len(f["input_ids"])) for f in features]
        mask = [[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in features]
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


@pytest.mark.parametrize("trainer_kind", ["ours", "transformers' label_smoothing_factor"])
def test_a_training_step_is_label_smoothed_and_evaluation_is_the_cross_entropy(tmp_path, trainer_kind):
    """One Trainer step of lr 0 on every pair: the logged training loss is the label-smoothed loss of the
    batch, whether the smoothing comes from this package's Trainer or from transformers'
    `label_smoothing_factor` on top of the model's loss (smoothed once, not twice)."""
    model = tiny_model(P_drop=0.0)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(30)  # peaked distributions, far from smoothed targets
    pairs = _pairs()
    collator = DataCollatorForSeq2Seq(_Tokenizer(), model=model)
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=len(pairs),
        per_device_eval_batch_size=len(pairs),
        max_steps=1,
        learning_rate=0.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        label_smoothing_factor=0.1 if trainer_kind != "ours" else 0.0,
    )
    common = dict(model=model, args=args, train_dataset=pairs, eval_dataset=pairs, data_collator=collator)
    if trainer_kind == "ours":
        trainer = LabelSmoothedSeq2SeqTrainer(**common, label_smoothing=0.1)
    else:
        trainer = Seq2SeqTrainer(**common)
    trainer.train()
    batch = collator([pairs[i] for i in range(len(pairs))])
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=batch["decoder_input_ids"],
        ).logits
    labels = batch["labels"]
    flat_logits, flat_labels = logits.view(-1, logits.shape[-1]), labels.view(-1)
    smoothed = nn.functional.cross_entropy(flat_logits, flat_labels, ignore_index=-100, label_smoothing=0.1)
    plain = nn.functional.cross_entropy(flat_logits, flat_labels, ignore_index=-100)
    train_loss = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
    assert abs(smoothed - plain) > 0.1  # far apart, so that each comparison tells them apart
    assert train_loss == pytest.approx(smoothed.item(), rel=1e-5)
    # transformers smooths its evaluation loss too; this package's Trainer reports the model's own.
    expected_eval = plain if trainer_kind == "ours" else smoothed
    assert trainer.evaluate()["eval_loss"] == pytest.approx(expected_eval.item(), rel=1e-5)
