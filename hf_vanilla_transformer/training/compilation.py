"""The compiled training step: the model's forward and the label-smoothed loss (Section 5.4) traced by
`torch.compile` as one function, whose backward AOTAutograd compiles with it.

- Regional compilation (`compiled_regions`): the encoder and decoder layers are the N identical blocks of
  Section 3.1, so each layer class's `forward` is marked as a nested compile region
  (`torch.compiler.nested_compile_region`): Dynamo traces one layer of each stack and stamps the compiled
  code out over the other N - 1. The mark is put on each layer instance's own `forward` for the length of
  training only, and taken off after; the classes, torch and transformers are left as they are. In eager
  code a marked forward is the forward itself. It pays for deep stacks only (`regional_compilation_pays`):
  a region's subgraph is compiled on its own, which costs more than inlining a few layers.
- Shapes compiled once (`CompiledTrainingLoss`): token-budget batches (Section 5.1) change their number of
  pairs and their lengths at every step, so the batch and length dimensions of every input are declared
  dynamic (`torch._dynamo.maybe_mark_dynamic`; sizes 0 and 1 are always specialized) before the first
  call. Dynamic, not unconstrained: on CUDA, Inductor's SDPA kernels with a padding mask need lengths
  that are multiples of 8 (`SEQUENCE_MULTIPLE`) and the graph guards on it, so a compiled run pads its
  batches to such lengths (as length buckets do). One graph then serves every batch; a batch with one pair
  (or a one-token side) compiles one more. Within training, a step that would recompile past Dynamo's
  limit raises (`fail_on_recompile_limit_hit`) instead of falling back to eager code without a word.
- Cached under autocast (`CACHEABLE_AUTOCAST_CALLS`): a bf16 run's step, whose forward enters autocast
  within the compiled code, is found in AOTAutograd's cache by a warm start on a CPU as a float32 run's is.
- The loss inside the compiled code: `loss.label_smoothed_cross_entropy` over the logits, in float32, with
  padded positions (label -100) contributing nothing; no host synchronization within the step (no
  `.item()`: the loss stays on the device).
- `CompileCache`: what the compiler produced (`torch.compiler.save_cache_artifacts`) saved in the run's
  folder at every checkpoint and at the end, and loaded when a resumed run or a second run in the same
  folder starts, so that it finds its compiled code in the cache instead of compiling it again.
- Built kernels in the run's folder (`run_folder_inductor_cache`, `--inductor-cache-in-run-folder`): that
  file carries Inductor's generated C++ source, not the libraries built from it, so a run may also keep
  Inductor's own cache in its folder, one a CPU, and the run resumed from the folder with the same flag, on
  another machine with the same CPU or after `/tmp` was emptied, loads the built kernels instead of building
  them again.

benchmarks/RESULTS.md ("Compiled training") has the compile times and step speeds measured with and
without each of these.
"""

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from types import MethodType
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback
from transformers.utils import logging

from ..common.hardware import cpu_features
from ..vanilla_transformer.modeling_vanilla_transformer import (
    VanillaTransformerDecoderLayer,
    VanillaTransformerEncoderLayer,
)
from .loss import label_smoothed_cross_entropy

logger = logging.get_logger(__name__)

# The repeated blocks of Section 3.1: each class is traced and compiled once per stack shape.
REGION_CLASSES: tuple[type[nn.Module], ...] = (VanillaTransformerEncoderLayer, VanillaTransformerDecoderLayer)
# The layers a stack needs for regional compilation to compile faster than the whole model inlined: on a
# 2-core Zen 3 CPU the cold compile of the training step took 83-91 s regional against 105-114 s whole at
# 6 + 6 layers, and 56-72 s against 50-57 s at 3 + 3 (benchmarks/RESULTS.md, "Compiled training").
REGIONAL_FROM_LAYERS = 6
# The file in a run's folder that holds its compiled code (`CompileCache`).
COMPILE_CACHE_FILE = "compile_cache.bin"
# The folder in a run's folder that holds Inductor's cache, where it keeps it (`run_folder_inductor_cache`),
# and the variable that tells Inductor where its cache is.
INDUCTOR_CACHE_FOLDER = "inductor_cache"
INDUCTOR_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
# What a compiled run pads its batches' lengths to: SDPA's memory-efficient kernel on CUDA takes a mask
# whose rows are 8-aligned, Inductor guards the compiled graph on it, and tensor cores want it too.
SEQUENCE_MULTIPLE = 8
# Autocast entered within the compiled code, as accelerate's mixed precision wraps the model's forward in
# it, is a call AOTAutograd's cache takes only when marked cacheable; unmarked, a warm start of a bf16 run
# traces and partitions the joint graph again (`train --compile` at cpu-demo size on a 2-core Zen 4: 11 s
# against 4 s marked, benchmarks/RESULTS.md). The graph's cache key holds the calls' arguments (device,
# dtype), so a step under another autocast compiles anew. Marked on a CPU, where it was measured.
CACHEABLE_AUTOCAST_CALLS = {
    f"torch.amp.autocast_mode.{name}": torch.__version__ for name in ("_enter_autocast", "_exit_autocast")
}
# The inputs of a training step whose first two dimensions (pairs, tokens) change from batch to batch.
_BATCH_INPUTS = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask", "labels")


@contextmanager
def compiled_regions(model: nn.Module) -> Iterator[None]:
    """Within the block, the forward of every encoder and decoder layer of `model` is its class's forward
    marked as a nested compile region, one mark per class, so that a compiled function calling the model
    compiles each class once and reuses it over the stack's layers. Outside torch.compile the marked
    forward is the plain one; the marks are removed on the way out."""
    marked = {cls: torch.compiler.nested_compile_region(cls.forward) for cls in REGION_CLASSES}
    layers = [module for module in model.modules() if type(module) in marked]
    for layer in layers:
        layer.forward = MethodType(marked[type(layer)], layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def compiled_length(length: int) -> int:
    """The length a compiled run pads a batch side of `length` tokens to: the next multiple of
    `SEQUENCE_MULTIPLE`."""
    return -(-length // SEQUENCE_MULTIPLE) * SEQUENCE_MULTIPLE


def regional_compilation_pays(model: nn.Module) -> bool:
    """Whether `model`'s layers are compiled once per class (`compiled_regions`) rather than inlined: where
    both stacks have at least `REGIONAL_FROM_LAYERS` layers, as the paper's base and big models do."""
    config = model.config
    return min(config.encoder_layers, config.decoder_layers) >= REGIONAL_FROM_LAYERS


def with_dynamic_batch_dimensions(inputs: dict[str, Any]) -> dict[str, Any]:
    """`inputs` with the pairs and tokens dimensions of the batch's tensors declared dynamic for
    torch.compile, so that the first compilation makes code for every batch shape instead of one shape per
    batch. The marks go on new tensor objects over the same memory: the caller's tensors, which other
    compiled code may take, stay unmarked. The compiler may still guard on the dimensions (CUDA's
    attention kernels on lengths that are multiples of 8, say): such a guard adds a graph for the other
    side of it, not an error. Dimensions of size 1 are left static: Dynamo specializes sizes 0 and 1
    whatever it is told."""
    marked = dict(inputs)
    for key in _BATCH_INPUTS:
        tensor = inputs.get(key)
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2:
            continue
        dims = [dim for dim, size in enumerate(tensor.shape) if size >= 2]
        if dims:
            marked[key] = tensor.detach()  # ids, masks and labels: nothing to differentiate
            torch._dynamo.maybe_mark_dynamic(marked[key], dims)
    return marked


def forward_and_loss(
    model: nn.Module, inputs: dict[str, Any], epsilon: float, num_items_in_batch: torch.Tensor | None
) -> torch.Tensor:
    """The training loss of a batch: the model's logits for the decoder inputs, and their label-smoothed
    cross-entropy against the labels (`loss.label_smoothed_cross_entropy`, float32, -100 ignored), summed
    and divided by `num_items_in_batch` (the accumulated step's labels) or this batch's. No cache of keys
    and values is built: only decoding reads one."""
    labels = inputs["labels"]
    model_inputs = {key: value for key, value in inputs.items() if key != "labels"} | {"use_cache": False}
    logits = model(**model_inputs).logits
    return label_smoothed_cross_entropy(logits, labels.to(logits.device), epsilon, num_items_in_batch)


class CompiledTrainingLoss:
    """`forward_and_loss` compiled (`torch.compile` with `backend`), called with every batch's dimensions
    declared dynamic (`with_dynamic_batch_dimensions`), or, with `static_shapes` (packed batches, all of
    one shape), compiled for that one shape with no dynamic dimension; the model's layers compiled once per
    class where `regional` (within `regions`; None: where `regional_compilation_pays`). `mode` is
    `torch.compile`'s: "reduce-overhead" replays a static-shape step on a GPU as CUDA graphs, which
    `bench_packing.py --compile-mode` measures; `train` leaves it unset until a measurement shows it pays."""

    def __init__(
        self,
        epsilon: float,
        backend: str = "inductor",
        regional: bool | None = None,
        static_shapes: bool = False,
        mode: str | None = None,
    ) -> None:
        self.epsilon = epsilon
        self.regional = regional
        self.static_shapes = static_shapes
        self.function = torch.compile(
            forward_and_loss, backend=backend, mode=mode, dynamic=False if static_shapes else None
        )

    def regions(self, model: nn.Module) -> AbstractContextManager[None]:
        """The block within which `model`'s layers are compiled once per class (`compiled_regions`), or
        inlined into the one graph like the rest of the model."""
        regional = regional_compilation_pays(model) if self.regional is None else self.regional
        return compiled_regions(model) if regional else nullcontext()

    def __call__(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None
    ) -> torch.Tensor:
        if not self.static_shapes:
            inputs = with_dynamic_batch_dimensions(inputs)
        if isinstance(num_items_in_batch, int):
            # A Python number would be a constant of the graph: a new one at every batch.
            num_items_in_batch = torch.tensor(num_items_in_batch)
        cacheable = dict(torch._inductor.config.unsafe_marked_cacheable_functions)
        if inputs["input_ids"].device.type == "cpu":
            cacheable |= CACHEABLE_AUTOCAST_CALLS
        with (
            torch._dynamo.config.patch(fail_on_recompile_limit_hit=True),
            torch._inductor.config.patch(unsafe_marked_cacheable_functions=cacheable),
        ):
            return self.function(model, inputs, self.epsilon, num_items_in_batch)


def run_folder_inductor_cache(output_dir: str | Path) -> Path:
    """The folder in the run's folder where a compiled run keeps Inductor's cache where
    `--inductor-cache-in-run-folder` asks (given again with `--resume`; without it, torch's own cache, or the
    one `TORCHINDUCTOR_CACHE_DIR` names). `COMPILE_CACHE_FILE` carries Inductor's generated code but not the
    kernels built from it, nor the probe of the CPU's vector instructions: on a CPU a warm start from it
    alone took 23-39 s of a 34-55 s cold compile of the cpu-demo step, against 3-5 s with this folder, and
    10 s with an empty `/tmp`, where Inductor builds its precompiled C++ header again (2-core Zen 4,
    benchmarks/RESULTS.md). One folder a CPU (`CPUFeatures.fingerprint`): Inductor builds
    C++ kernels for the CPU it runs on (`-march=native`), and its keys do not tell two CPUs of the same
    vector width apart, so kernels built on one must not be loaded on another. Not the default: a new run
    in a new folder would find nothing that another run on the same machine compiled."""
    return Path(output_dir).resolve() / INDUCTOR_CACHE_FOLDER / cpu_features().fingerprint


@contextmanager
def inductor_cache_dir(folder: Path | None) -> Iterator[None]:
    """Within the block, Inductor's cache is `folder` (None: the one it had). `TORCHINDUCTOR_CACHE_DIR` is
    looked up at each use, so the variable set here serves what compiles within; it is set back after, for
    whatever else the process runs."""
    if folder is None:
        yield
        return
    before = os.environ.get(INDUCTOR_CACHE_VARIABLE)
    os.environ[INDUCTOR_CACHE_VARIABLE] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(INDUCTOR_CACHE_VARIABLE, None)
        else:
            os.environ[INDUCTOR_CACHE_VARIABLE] = before


class CompileCache(TrainerCallback):
    """The compiled code of a run in its folder (`COMPILE_CACHE_FILE`): loaded into torch's compiler caches
    when training begins, where an earlier run or segment saved it, and saved (everything compiled in this
    process so far) at every checkpoint and when training ends. A compilation that finds its graph there
    skips Inductor's code generation and the C++ compiler."""

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir) / COMPILE_CACHE_FILE

    def load(self) -> bool:
        """Loads the saved cache, if any; whether it was loaded. A cache that torch cannot read (saved by
        another torch version, say) is left unused with a warning: the run then compiles as if cold."""
        if not self.path.is_file():
            return False
        if torch.compiler.load_cache_artifacts(self.path.read_bytes()) is None:  # torch logs why
            logger.warning(f"Compiled code in {self.path} could not be loaded: compiling anew.")
            return False
        logger.info(f"Compiled code loaded from {self.path}")
        return True

    def save(self) -> None:
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_bytes(artifacts[0])

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.load()

    def on_save(self, args, state, control, **kwargs) -> None:
        if state.is_world_process_zero:
            self.save()

    def on_train_end(self, args, state, control, **kwargs) -> None:
        if state.is_world_process_zero:
            self.save()
