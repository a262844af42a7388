"""The translated files of LibreTranslate's `POST /translate_file`, kept in memory for their download from
`GET /download_file/NAME`: each under a name that starts with a random token (who has the URL has the
file), for a limited time, and only the newest so many."""

import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

# What a file's name keeps of the name its client gave: letters, digits, dots, dashes and underscores.
UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class StoredFile:
    """A translated file: the name it downloads as, its bytes, and when it expires (time.monotonic)."""

    filename: str
    content: bytes
    expires: float


class TranslatedFiles:
    """At most `most` translated files, each kept `keep_s` seconds: the oldest make way for new ones."""

    def __init__(self, keep_s: float = 30 * 60, most: int = 256):
        self.keep_s, self.most = keep_s, most
        self._files: OrderedDict[str, StoredFile] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, filename: str, content: bytes) -> str:
        """Keep `content` to download as `filename`; the name to fetch it by (a random token, a dot, and
        `filename` reduced to safe characters)."""
        safe = UNSAFE.sub("_", filename).strip("._") or "translation.txt"
        key = f"{uuid.uuid4().hex}.{safe}"
        with self._lock:
            self._expire()
            self._files[key] = StoredFile(safe, content, time.monotonic() + self.keep_s)
            while len(self._files) > self.most:
                self._files.popitem(last=False)
        return key

    def get(self, key: str) -> StoredFile | None:
        """The file kept under `key`, or None where there is none (never was, or expired)."""
        with self._lock:
            self._expire()
            return self._files.get(key)

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [key for key, stored in self._files.items() if stored.expires <= now]:
            del self._files[key]


__all__ = ["StoredFile", "TranslatedFiles"]
