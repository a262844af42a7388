"""The request parameters of the translation server: LibreTranslate's `POST /translate`, `/detect` and
`/translate_file`, so that its clients and integrations (Weblate's, for one) work unchanged, and the native
`POST /v1/translate`. None has a field that names a file on the server, a model or a path: the server
translates with the one model it started with."""

from pydantic import BaseModel, ConfigDict, Field


class LibreTranslateRequest(BaseModel):
    """LibreTranslate's request: `q` one text or a list, `source` ("auto": the model's source language)
    and `target`, `alternatives` beyond the best, `format` "text", and `api_key`. Other fields that
    LibreTranslate clients send are ignored."""

    model_config = ConfigDict(extra="ignore")

    q: str | list[str] = Field(description="the text to translate, or a list of texts")
    source: str = Field(description='the source language code, or "auto"')
    target: str = Field(description="the target language code")
    format: str = Field("text", description='"text" (HTML is not translated: "html" is refused)')
    alternatives: int = Field(0, ge=0, description="how many alternative translations besides the best")
    api_key: str | None = Field(None, description="an API key, where the server asks for one")


class DetectRequest(BaseModel):
    """LibreTranslate's `/detect` request: the text `q` (a list is taken as one text), and `api_key`."""

    model_config = ConfigDict(extra="ignore")

    q: str | list[str] = Field(description="the text whose language to detect")
    api_key: str | None = Field(None, description="an API key, where the server asks for one")


class TranslateFileRequest(BaseModel):
    """LibreTranslate's `/translate_file` fields beside the file: `source`, `target` and `api_key`."""

    model_config = ConfigDict(extra="ignore")

    source: str = Field(description='the source language code, or "auto"')
    target: str = Field(description="the target language code")
    api_key: str | None = Field(None, description="an API key, where the server asks for one")


class TranslateRequest(BaseModel):
    """The native request: `q` one text or a list, the `n_best` hypotheses to return with their scores,
    word `alignments` (with `attention`, the weights behind them), and `split_sentences`: translate each
    text sentence by sentence. `source` and `target`, where given, must be the model's."""

    model_config = ConfigDict(extra="forbid")

    q: str | list[str] = Field(description="the text to translate, or a list of texts")
    n_best: int = Field(1, ge=1, description="hypotheses to return per text, best first")
    alignments: bool = Field(False, description="word alignments (Pharaoh i-j pairs) of every hypothesis")
    attention: bool = Field(
        False, description="with alignments: the target-word by source-word attention behind them"
    )
    split_sentences: bool = Field(False, description="split each text into sentences and translate those")
    source: str | None = Field(None, description="the source language code (default: the model's)")
    target: str | None = Field(None, description="the target language code (default: the model's)")
    api_key: str | None = Field(None, description="an API key, where the server asks for one")


__all__ = ["DetectRequest", "LibreTranslateRequest", "TranslateFileRequest", "TranslateRequest"]
