"""The model inside transformers' own training loop: Seq2SeqTrainer learns a toy task."""

import random

import torch
from conftest import tiny_config
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerFast,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
WORDS = [f"w{i}" for i in range(16)]


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def reverse_task(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 7))]
        pairs.append((" ".join(words), " ".join(reversed(words))))
    return pairs


def test_seq2seq_trainer_learns_to_reverse(tmp_path):
    tokenizer = word_tokenizer()
    train = Dataset.from_dict(dict(zip(("src", "tgt"), zip(*reverse_task(4000, seed=0)))))
    train = train.map(
        lambda batch: tokenizer(batch["src"], text_target=batch["tgt"]),
        batched=True,
        remove_columns=["src", "tgt"],
    )
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(
        tiny_config(vocab_size=len(tokenizer), d_model=64, h=4, d_ff=128, P_drop=0.0)
    )
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=300,
        per_device_train_batch_size=32,
        learning_rate=2e-3,
        warmup_steps=30,
        lr_scheduler_type="inverse_sqrt",
        adam_beta2=0.98,
        adam_epsilon=1e-9,
        logging_steps=50,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        label_smoothing_factor=0.1,  # the paper's (Section 5.4), on top of the model's cross-entropy
        disable_tqdm=True,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=train,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
    )
    losses = trainer.train()
    assert losses.training_loss < 2.0

    model.eval()
    tests = reverse_task(50, seed=1)
    batch = tokenizer([src for src, _ in tests], return_tensors="pt", padding=True)
    generated = model.generate(**batch, num_beams=4, max_new_tokens=12)
    outputs = tokenizer.batch_decode(generated, skip_special_tokens=True)
    correct = sum(output == tgt for output, (_, tgt) in zip(outputs, tests))
    assert correct >= 45, list(zip(outputs, tests))[:5]
