"""What one request to the translation server may ask for, and who may ask: per-request limits on
characters, segments and alternatives, the body size they imply, and the optional API keys.

A request over a limit is refused with a `Refusal` that names the limit and its value, which the server
answers as a JSON error: 413 for a request too large, 400 for a value out of range, 401 for a missing API
key, 403 for a wrong one.
"""

import hmac
from dataclasses import dataclass
from pathlib import Path


class Refusal(Exception):
    """A request the server answers with `status` and a JSON error: `message`, and where a limit refused
    it, the limit's name and value."""

    def __init__(self, status: int, message: str, limit: str | None = None, value: int | None = None):
        super().__init__(message)
        self.status, self.message, self.limit, self.value = status, message, limit, value

    def body(self) -> dict:
        """The JSON error: {"error": message} (LibreTranslate's shape), plus "limit" and "value"."""
        data: dict = {"error": self.message}
        if self.limit is not None:
            data |= {"limit": self.limit, "value": self.value}
        return data


@dataclass(frozen=True)
class Limits:
    """Per-request limits: `max_characters` over all segments of a request (Unicode code points, as
    LibreTranslate counts them: an emoji or a Chinese character is one), `max_segments` in it, and
    `max_alternatives` beyond the best translation (the beam size less one: the beam holds the n best)."""

    max_characters: int = 5000
    max_segments: int = 64
    max_alternatives: int = 3

    @property
    def max_body_bytes(self) -> int:
        """The largest request body read, and the longest request head (a query string may carry the
        texts): `max_characters` at 12 bytes each, the most any client's encoding of one character takes (an
        emoji is 4 bytes of UTF-8, 12 percent-encoded in a form or a URL, and 12 as the JSON escapes
        "\\ud83d\\ude00"), 16 bytes a segment for the separators, and 64 KiB for the other fields and a
        multipart form's framing. A larger body is refused before it is read whole."""
        return 12 * self.max_characters + 16 * self.max_segments + 64 * 1024

    def check_characters(self, characters: int) -> None:
        """Refuse (413) a request of more than `max_characters` characters."""
        if characters > self.max_characters:
            raise Refusal(
                413,
                f"{characters} characters in one request; send at most {self.max_characters} a request.",
                "max_characters",
                self.max_characters,
            )

    def check(self, segments: list[str], alternatives: int) -> None:
        """Refuse (`Refusal`) a request of `segments` asking for `alternatives` beyond the best: too many
        segments or characters (413), more alternatives than the beam holds (400)."""
        if len(segments) > self.max_segments:
            raise Refusal(
                413,
                f"{len(segments)} segments in one request; send at most {self.max_segments} a request.",
                "max_segments",
                self.max_segments,
            )
        self.check_characters(sum(len(segment) for segment in segments))
        if alternatives > self.max_alternatives:
            raise Refusal(
                400,
                f"{alternatives} alternatives asked for; the beam gives at most {self.max_alternatives} "
                "besides the best translation.",
                "max_alternatives",
                self.max_alternatives,
            )


def read_api_keys(path: str | Path) -> frozenset[str]:
    """The API keys in a text file, one a line (blank lines and lines starting with # left out).

    Raises:
        ValueError: there is no such file, or it holds no key.
    """
    if not Path(path).is_file():
        raise ValueError(f"--api-keys {path}: no such file; give a text file of keys, one a line.")
    keys = {
        line.strip()
        for line in Path(path).read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    }
    if not keys:
        raise ValueError(f"--api-keys {path} holds no key: write one key a line.")
    return frozenset(keys)


@dataclass(frozen=True)
class ApiKeys:
    """The keys that may translate; none: anyone may."""

    keys: frozenset[str] = frozenset()

    def check(self, key: str | None) -> None:
        """Refuse a missing key (401) or a key not among `keys` (403); every key is compared in constant
        time, so the time taken does not tell how much of a guess was right."""
        if not self.keys:
            return
        if not key:
            raise Refusal(
                401,
                "this server needs an API key: send it as 'Authorization: Bearer KEY', an X-API-Key header, "
                "or the api_key field.",
            )
        matches = [
            hmac.compare_digest(key.encode("utf-8", "surrogatepass"), known.encode()) for known in self.keys
        ]
        if not any(matches):
            raise Refusal(403, "the API key is not one of this server's keys.")


__all__ = ["ApiKeys", "Limits", "Refusal", "read_api_keys"]
