"""Language identification for LibreTranslate's `POST /detect` and `"source": "auto"`, with py3langid: a
naive Bayes model over byte n-grams for 140 languages (a fork of langid.py) whose model ships inside its
4.6 MB package, so nothing is downloaded when the server runs.

Chosen over lingua-language-detector, the most accurate on very short texts: on Multi30k's and WMT's English
and German test sentences both name the language of 97-100% of the lines, while lingua's package is 96 MB,
takes 900 MiB of memory with all its languages loaded and 30-100 times as long a text. langid.py itself
carries the same model in slower code. py3langid comes with the `serve` extra; without it `/detect`
answers 501.
"""

import functools
import importlib.util
from dataclasses import dataclass
from typing import Any

# Candidates `/detect` lists, best first.
CANDIDATES = 3


def detection_installed() -> bool:
    """Whether py3langid can be imported here."""
    return importlib.util.find_spec("py3langid") is not None


@functools.cache
def _identifier() -> Any:
    """py3langid's model, loaded once a process (0.8 s of decompressing it on a 2-core CPU) and shared by
    its apps: ranking a text reads the model and changes nothing in it."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


@dataclass
class LanguageDetector:
    """py3langid's identifier with probabilities normalized over its languages."""

    identifier: Any

    @classmethod
    def load(cls) -> "LanguageDetector | None":
        """The detector, or None where py3langid is not installed."""
        if not detection_installed():
            return None
        return cls(_identifier())

    def ranked(self, text: str) -> list[dict]:
        """The `CANDIDATES` likeliest languages of `text`, best first, in LibreTranslate's shape:
        {"confidence": percent, "language": ISO 639 code}."""
        return [
            {"confidence": round(100 * probability, 2), "language": code}
            for code, probability in self.identifier.rank(text)[:CANDIDATES]
        ]

    def confidence(self, text: str, language: str) -> float:
        """How likely (in percent) `text` is in `language`; 0 for a language the model does not know."""
        for code, probability in self.identifier.rank(text):
            if code == language:
                return round(100 * probability, 2)
        return 0.0


__all__ = ["CANDIDATES", "LanguageDetector", "detection_installed"]
