"""Translating with a trained model on one of three engines: `Translator` (`translator`) reads a model
folder, Hub id or export, and translates in length-sorted batches (`translation`) with the paper's decoding,
giving each input's n best (`hypotheses`), log-probabilities by forced decoding (`scoring`), word alignments
(`alignment`) and paragraphs translated sentence by sentence (`sentence_splitting`). `engines` holds each
engine, PyTorch, CTranslate2 and ONNX Runtime, with its exporter beside it, and `shortlist` the vocabulary
shortlists of CTranslate2 exports."""

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .translator import Translator, load_model, load_translator

__all__ = ["Translator", "load_model", "load_translator"]

__getattr__, __dir__ = lazy_exports(__name__, __file__)
