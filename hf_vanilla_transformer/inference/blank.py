"""The one rule for what has nothing to translate: a text of white space, control characters (NUL
included) and invisible format characters only. `translate_n_best` gives such a text an empty translation
without reaching the model, which would otherwise decode a sentence from nothing, and the sentence
splitter and the server leave it out by the same rule."""

import unicodedata

# Unicode's control characters (Cc: NUL, the C0 and C1 controls) and format characters (Cf: the zero-width
# space U+200B, the zero-width non-joiner and joiner U+200C/U+200D, the word joiner U+2060, the byte-order
# mark U+FEFF, the soft hyphen, the directional marks, ...): none is written or read as text.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf"})


def is_blank(text: str) -> bool:
    """Whether `text` holds nothing to translate: no character other than white space, control and
    format characters."""
    return all(char.isspace() or unicodedata.category(char) in _INVISIBLE_CATEGORIES for char in text)


__all__ = ["is_blank"]
