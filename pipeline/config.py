"""One settings object for the whole pipeline.

Values come from, in rising priority: defaults here, environment variables ``SIRA_*``
(nested with ``__``, e.g. ``SIRA_ENGINE__URL``), then CLI flags, which call
``Settings.model_copy(update=...)``. Secrets are ``SecretStr`` so that printing or logging a
settings object never shows them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

EngineKind = Literal["opensearch", "elasticsearch"]


def default_state_dir() -> Path:
    return Path.home() / ".cache" / "sira-pipeline"


class EngineSettings(BaseModel):
    """How to reach a search engine. With no ``url``, the CLI uses the local engine that
    ``sira engine start`` recorded under the state directory."""

    kind: EngineKind = "opensearch"
    url: str | None = None
    username: str | None = None
    password: SecretStr | None = None
    api_key: SecretStr | None = None
    ca_file: Path | None = None
    verify_certs: bool = True
    request_timeout: float = 60.0


class IndexSettings(BaseModel):
    name: str = "sira"
    shards: int = 1
    replicas: int = 0
    # BM25 parameters of every scored field. Engine defaults; the bench overrides them
    # (e.g. Pyserini's BEIR settings k1=0.9, b=0.4).
    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    # Longest phrase (in words) the shingle analyzer indexes as one term; 1..3.
    max_ngram: int = Field(default=3, ge=1, le=3)


class LoadSettings(BaseModel):
    # A document whose title + text is larger than this is skipped with an error.
    max_doc_bytes: int = 1_000_000
    bulk_batch_docs: int = 500


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SIRA_", env_nested_delimiter="__", extra="ignore"
    )

    engine: EngineSettings = EngineSettings()
    index: IndexSettings = IndexSettings()
    load: LoadSettings = LoadSettings()
    state_dir: Path = Field(default_factory=default_state_dir)
