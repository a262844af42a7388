"""The training loss of Section 5.4: cross-entropy against label-smoothed targets, where the model's own
loss (`outputs.loss`) is the plain cross-entropy.

- `label_smoothed_cross_entropy`: the loss per labelled token, as the Trainer needs it.
- `LabelSmoothedLoss`: that loss as a Trainer's `compute_loss_func`, smoothing while the model trains and
  giving the plain cross-entropy in evaluation, so that the dev loss is the model's own.
- `LabelSmoothedSeq2SeqTrainer`: `Seq2SeqTrainer` training with it, the base of every training run of the
  package.

On CPUs the loss and its gradient are computed in cache-sized row chunks (`_SmoothedCrossEntropySum`), the
same formula as torch's `cross_entropy(..., label_smoothing=eps)` without keeping tokens x vocabulary
log-probabilities for the backward pass.
"""

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import Seq2SeqTrainer
from transformers.modeling_outputs import ModelOutput

from ..common.cpu_speedups import eager_cpu

if TYPE_CHECKING:
    from .compilation import CompiledTrainingLoss

# Float32 chunks of 2 MB, 1 MB per core when two threads share the rows, so that a chunk's passes stay in
# the cores' L2 caches: 16 rows of a 32k vocabulary, 65 of an 8k one. On a GPU a chunk is a few kernel
# launches, so chunks there are large (4194 rows of a 32k vocabulary) and only bound the float32 memory.
_CROSS_ENTROPY_CHUNK_BYTES = {"cpu": 2 * 2**20, "cuda": 2**29}


def _chunk_rows(logits: torch.Tensor) -> int:
    chunk_bytes = _CROSS_ENTROPY_CHUNK_BYTES.get(logits.device.type, _CROSS_ENTROPY_CHUNK_BYTES["cuda"])
    return max(1, chunk_bytes // (4 * logits.shape[-1]))


def _smoothed_gradient(logits: torch.Tensor, targets: torch.Tensor, epsilon: float) -> torch.Tensor:
    """d loss / d z = softmax(z) - ((1 - eps) onehot(y) + eps / V), in float32."""
    gradient = torch.softmax(logits, dim=-1, dtype=torch.float32).sub(epsilon / logits.shape[-1])
    return gradient.scatter_add(1, targets[:, None], gradient.new_full((gradient.shape[0], 1), epsilon - 1))


class _SmoothedCrossEntropySum(torch.autograd.Function):
    """Sum over labelled positions of the label-smoothed cross-entropy, with its gradient written directly.

    Per position, with log-probabilities log p = log_softmax(z) of the V logits z and reference token y:
        loss = -(1 - eps) log p_y - eps mean_j log p_j
        d loss / d z = p - ((1 - eps) onehot(y) + eps / V)
    torch's cross_entropy gives the same numbers through a dense one-hot gradient and a smoothing term,
    each a pass over the tokens x vocabulary tensor, and keeps the log-probabilities alive until the
    backward pass. Here nothing of that size is kept, the backward recomputes p and makes the gradient in
    one pass, and rows go in chunks that stay in cache, in float32 whatever the logits' dtype. A double
    backward takes the same formula on the whole tensor, in differentiable ops.
    `label_smoothed_cross_entropy` names the tests that hold this and torch's loss together.
    """

    @staticmethod
    def forward(logits: torch.Tensor, labels: torch.Tensor, epsilon: float) -> torch.Tensor:
        targets = labels.clamp_min(0)
        losses = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        step = _chunk_rows(logits)
        for start in range(0, logits.shape[0], step):
            rows = slice(start, start + step)
            log_probs = torch.log_softmax(logits[rows], dim=-1, dtype=torch.float32)
            nll = log_probs.gather(1, targets[rows, None]).squeeze(1).neg_()
            losses[rows] = nll.mul_(1 - epsilon).sub_(log_probs.mean(-1), alpha=epsilon)
        return torch.where(labels != -100, losses, 0.0).sum()

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        logits, labels, epsilon = inputs
        ctx.save_for_backward(logits, labels)
        ctx.epsilon = epsilon

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, labels = ctx.saved_tensors
        epsilon, targets = ctx.epsilon, labels.clamp_min(0)
        # Unlabelled positions get a zero gradient whatever grad_total is, as in torch's cross_entropy: a
        # batch without labels divides the sum by a count of 0, and inf * 0 would write NaN into every row.
        scale = torch.where(labels != -100, grad_total.float(), 0.0)
        if torch.is_grad_enabled():  # double backward: the same formula in differentiable ops
            gradient = _smoothed_gradient(logits, targets, epsilon) * scale[:, None]
            return gradient.to(logits.dtype), None, None
        gradient = torch.empty_like(logits)
        step = _chunk_rows(logits)
        for start in range(0, logits.shape[0], step):
            rows = slice(start, start + step)
            chunk = torch.softmax(logits[rows], dim=-1, dtype=torch.float32).sub_(epsilon / logits.shape[-1])
            chunk.scatter_add_(1, targets[rows, None], chunk.new_full((chunk.shape[0], 1), epsilon - 1))
            torch.mul(chunk, scale[rows, None], out=gradient[rows])
        return gradient, None, None


def chunked_loss_applies(logits: torch.Tensor) -> bool:
    """The chunked loss is for CPU training: on GPUs a Python loop over chunks would only add launches,
    and torch.compile fuses torch's own loss and gradient better than it traces the loop."""
    return eager_cpu(logits) and logits.requires_grad and torch.is_grad_enabled()


def chunked_label_smoothed_cross_entropy_sum(
    logits: torch.Tensor, labels: torch.Tensor, epsilon: float
) -> torch.Tensor:
    """`cross_entropy(logits.float(), labels, ignore_index=-100, label_smoothing=epsilon, reduction="sum")`
    for 2-D logits, computed as `_SmoothedCrossEntropySum` describes. A label that is neither a token id
    nor -100 raises, as `cross_entropy` does."""
    invalid = ((labels < 0) & (labels != -100)) | (labels >= logits.shape[-1])
    if logits.device.type != "cpu":  # checked on the device, without waiting for it
        torch._assert_async(
            ~invalid.any(), "label out of bounds: token ids below the vocabulary size, or -100"
        )
    elif invalid.any():
        raise IndexError(
            f"Label {labels[invalid][0].item()} is out of bounds: labels are token ids below the vocabulary "
            f"size {logits.shape[-1]}, or -100 for positions without a loss."
        )
    return _SmoothedCrossEntropySum.apply(logits, labels, float(epsilon))


def label_smoothed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy against targets smoothed with epsilon (Section 5.4, after Szegedy et al. 2016).

    The target distribution puts 1 - epsilon on the reference token and spreads epsilon uniformly over
    the vocabulary; epsilon 0 is the model's own cross-entropy. Positions labelled -100 are ignored. The
    sum is divided by `num_items_in_batch` when the Trainer passes it, so that gradient accumulation over
    micro-batches equals one big batch; otherwise by this batch's count of labelled tokens. Computed in
    float32 (in CPU training in cache-sized chunks, `chunked_label_smoothed_cross_entropy_sum`: the same
    formula). Two tests hold the two implementations together: tests/test_loss.py's
    `test_label_smoothed_loss_equals_hand_computation` (each against the formula) and
    `test_chunked_loss_and_gradient_equal_torch_cross_entropy` (losses and gradients).
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"labels have shape {tuple(labels.shape)} but the decoder gave logits for "
            f"{tuple(logits.shape[:-1])} positions: pass labels of the same shape as decoder_input_ids."
        )
    logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    if chunked_loss_applies(logits):
        loss = chunked_label_smoothed_cross_entropy_sum(logits, labels, epsilon)
    else:
        loss = nn.functional.cross_entropy(
            logits.float(), labels, ignore_index=-100, label_smoothing=epsilon, reduction="sum"
        )
    if num_items_in_batch is None:
        num_items_in_batch = (labels != -100).sum()
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


class LabelSmoothedLoss:
    """A Trainer's `compute_loss_func`: the label-smoothed loss of `model`'s logits while it trains, the
    plain cross-entropy (its own `outputs.loss`) while it is evaluated."""

    def __init__(self, model: nn.Module, epsilon: float) -> None:
        self.model = model
        self.epsilon = epsilon

    def __call__(
        self, outputs: ModelOutput, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        epsilon = self.epsilon if self.model.training else 0.0
        logits = outputs["logits"]
        return label_smoothed_cross_entropy(logits, labels.to(logits.device), epsilon, num_items_in_batch)


class LabelSmoothedSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` whose training loss is smoothed with `label_smoothing` (`LabelSmoothedLoss`), and
    whose teacher-forced steps keep no cache of keys and values, which only decoding uses.

    With `compiled_loss` (`compilation.CompiledTrainingLoss`), a training step's forward and loss run as
    that compiled function, the model's layers compiled once per class while training; evaluation stays
    eager."""

    def __init__(
        self,
        *args: Any,
        label_smoothing: float,
        compiled_loss: "CompiledTrainingLoss | None" = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.compute_loss_func = LabelSmoothedLoss(self.model, label_smoothing)
        self.compiled_loss = compiled_loss

    def train(self, *args: Any, **kwargs: Any) -> Any:
        regions = self.compiled_loss.regions(self.model) if self.compiled_loss is not None else nullcontext()
        with regions:
            return super().train(*args, **kwargs)

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: int | torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        inputs = {**inputs, "use_cache": False}
        if self.compiled_loss is None or not model.training or return_outputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        loss = self.compiled_loss(model, inputs, num_items_in_batch)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            # As Trainer.compute_loss: the count is over all processes, and DDP averages their gradients.
            loss = loss * self.accelerator.num_processes
        return loss
