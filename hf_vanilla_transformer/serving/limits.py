"""What one request to the translation server may ask for, and who may ask how often: per-request limits
on characters, segments and alternatives, the body size they imply, the optional API keys, and the optional
rate of requests a client may send.

A request over a limit is refused with a `Refusal` that names the limit and its value, which the server
answers as a JSON error: 413 for a request too large, 400 for a value out of range, 401 for a missing API
key, 403 for a wrong one, 429 with Retry-After for a client over its rate.
"""

import hmac
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..common.text_lines import read_lines


class Refusal(Exception):
    """A request the server answers with `status` and a JSON error: `message`, and where a limit refused
    it, the limit's name and value; `retry_after`, the whole seconds after which the same request may
    pass (the Retry-After header)."""

    def __init__(
        self,
        status: int,
        message: str,
        limit: str | None = None,
        value: int | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.limit, self.value = status, message, limit, value
        self.retry_after = retry_after

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
    keys = {line.strip() for line in read_lines(path) if line.strip() and not line.lstrip().startswith("#")}
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
        matches = [hmac.compare_digest(key.encode(), known.encode()) for known in self.keys]
        if not any(matches):
            raise Refusal(403, "the API key is not one of this server's keys.")


class RequestRate:
    """How often each client may ask, as LibreTranslate's --req-limit: `per_minute` requests at once, then
    more at `per_minute` a minute, one every 60/`per_minute` seconds. A token bucket of `per_minute` tokens
    refilled at that rate, kept as one time per client (the generic cell rate algorithm): when the client's
    bucket is full again. A client is whatever string the server names it by (its API key or address).

    `clock` gives the time in seconds (monotonic). Clients whose buckets are full again are forgotten, so
    the memory held grows with the clients of the last minute, not with all clients ever seen."""

    # Float rounding of 60/per_minute must not refuse the last request of a full bucket.
    ROUNDING_S = 1e-6
    # The clients remembered before those with full buckets are forgotten (then twice those left).
    FORGET_ABOVE = 1024

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic):
        if per_minute < 1:
            raise ValueError(f"a request rate of {per_minute} a minute: give at least 1.")
        self.per_minute = per_minute
        self._interval = 60 / per_minute
        self._clock = clock
        self._full_at: dict[str, float] = {}
        self._forget_above = self.FORGET_ABOVE
        self._lock = threading.Lock()

    def check(self, client: str) -> None:
        """Count a request of `client`, or refuse it (429) if its bucket is empty, with the whole seconds
        until a token is back as `retry_after`."""
        with self._lock:
            now = self._clock()
            full_at = max(self._full_at.get(client, now), now)
            # Taking a token moves "full again" one interval later; it may lie at most a minute ahead.
            wait = full_at + self._interval - now - 60
            if wait > self.ROUNDING_S:
                seconds = math.ceil(wait - self.ROUNDING_S)
                raise Refusal(
                    429,
                    f"more than {self.per_minute} requests a minute from this client; retry in {seconds} s.",
                    "req_limit",
                    self.per_minute,
                    retry_after=seconds,
                )
            self._full_at[client] = full_at + self._interval
            if len(self._full_at) > self._forget_above:
                self._full_at = {name: at for name, at in self._full_at.items() if at > now}
                self._forget_above = max(self.FORGET_ABOVE, 2 * len(self._full_at))

    @property
    def clients(self) -> int:
        """How many clients are remembered (those that may have used a token in the last minute)."""
        with self._lock:
            return len(self._full_at)


__all__ = ["ApiKeys", "Limits", "Refusal", "RequestRate", "read_api_keys"]
