"""What a run of the Korean chatbot tutorial (`chatbot`) is given: the tutorial's hyperparameters and the
run's options (`ChatbotSettings`), the shipped corpus and the tutorial's sample questions. The `chatbot train`
command's flags are generated from these fields; the module imports no torch, so that `--help` answers at
once."""

from dataclasses import dataclass
from pathlib import Path

from ..common.cli import non_negative_int, positive_float, positive_int, probability, random_seed
from ..common.settings_schema import check_settings, setting

# Shipped inside the package, so that installed wheels have it too (origin and terms: data/README.md).
DEFAULT_DATA = Path(__file__).resolve().parent / "chatbot_ko" / "ChatbotData.csv"

# The tutorial's own example questions, answered after training.
SAMPLE_QUESTIONS = ("영화 볼래?", "고민이 있어", "너무 화가나")


@dataclass
class ChatbotSettings:
    """The tutorial's hyperparameters (its upper-case constants, lower-cased; the defaults are its values) and
    the run's options, each with the help text and check of its `chatbot train` flag (`settings_schema`); a
    value no run could use is refused (ValueError) when the settings are made."""

    # BPE stops earlier when no pair occurs twice.
    vocab_size: int = setting(
        2**13, "target size of the subword vocabulary (the tutorial's 2^13)", check=positive_int
    )
    max_length: int = setting(
        40, "longest question or answer in tokens, start and end included", check=positive_int
    )
    num_layers: int = setting(2, "N, layers in the encoder and in the decoder", check=positive_int)
    d_model: int = setting(256, "d_model, the model width", check=positive_int)
    num_heads: int = setting(8, "h, attention heads; must divide d_model", check=positive_int)
    dff: int = setting(512, "d_ff, the inner size of the feed-forward networks", check=positive_int)
    dropout: float = setting(0.1, "P_drop, the dropout rate", check=probability)
    label_smoothing: float = setting(0.0, "eps_ls; the tutorial uses none, the paper 0.1", check=probability)
    warmup_steps: int = setting(4000, "warm-up of the paper's learning rate (Eq. 3)", check=positive_int)
    batch_size: int = setting(64, "question-answer pairs per update", check=positive_int)
    epochs: float = setting(
        50.0, "passes over the training pairs; ignored when --max-steps is above 0", check=positive_float
    )
    max_steps: int = setting(-1, "stop after this many updates when above 0", check=int)
    eval_size: int = setting(
        500, "pairs held out to measure accuracy on unseen questions (0: none)", check=non_negative_int
    )
    limit: int | None = setting(
        None, "use only the first N rows of the corpus (quick trials)", check=positive_int
    )
    logging_steps: int = setting(50, "updates between logged training losses", check=positive_int)
    keep_checkpoints: int = setting(
        2, "checkpoints to keep of those saved at the end of each epoch", check=positive_int
    )
    seed: int = setting(42, "seed of the split, the shuffling and the initialisation", check=random_seed)

    def __post_init__(self) -> None:
        check_settings(self)
